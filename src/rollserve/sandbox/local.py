"""local: a temporary directory on the host and no isolation. For development only."""

from __future__ import annotations

import logging
from pathlib import Path

from rollserve.errors import InvalidInputError
from rollserve.images.base import RunnableImage
from rollserve.sandbox.base import Availability, Launcher
from rollserve.sandbox.env import checked_mounts, sandbox_env
from rollserve.schema.sandbox import LocalSpec, SandboxSpec
from rollserve.settings import Settings

log = logging.getLogger(__name__)

WARNING = (
    "the 'local' sandbox backend has NO isolation: commands run as this user on the "
    "host, with its network and files; use it for development only"
)


class LocalBackend:
    """Processes run directly on the host, in the sandbox's workspace directory."""

    name = "local"
    spec_type = LocalSpec

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._warned = False

    def availability(self) -> Availability:
        return Availability(True, "no isolation: development only")

    def launcher(
        self,
        spec: SandboxSpec,
        workspace: Path,
        *,
        image: RunnableImage | None = None,
        guest_workspace: str | None = None,
    ) -> Launcher:
        assert isinstance(spec, LocalSpec)
        checked_mounts(spec.mounts)  # the host's own paths: nothing to bind, but they must exist
        if spec.binds or spec.run_dir:
            raise InvalidInputError(
                "the local backend has no mount namespace to bind paths into: use bwrap or "
                "apptainer",
                backend=self.name,
            )
        if not self._warned:  # once per backend (that is, per rollserve process)
            log.warning(WARNING)
            self._warned = True
        home = workspace.parent / "home"
        home.mkdir(exist_ok=True)
        return Launcher(
            prefix=[],
            env=sandbox_env(spec.env, home=str(home), path_prepend=spec.path_prepend),
            workspace=str(workspace),
            cwd=str(workspace),
        )
