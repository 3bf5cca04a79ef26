"""A plug-in as another package would write one: its own sandbox backend (with a spec field of
its own) and its own store scheme, registered without any change to rollserve."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from rollserve.images.base import RunnableImage
from rollserve.plugins import Plugins
from rollserve.sandbox.base import Launcher
from rollserve.sandbox.bwrap import BwrapBackend
from rollserve.schema.sandbox import BwrapSpec, SandboxSpec
from rollserve.settings import Settings
from rollserve.storage import SqliteJobStore
from rollserve.storage.base import Store


class GreetingSpec(BwrapSpec):
    """bwrap, with a greeting its processes find in ``$GREETING``."""

    backend: Literal["greeting"] = "greeting"  # type: ignore[assignment]
    greeting: str = "hello"


class GreetingBackend(BwrapBackend):
    """A bwrap sandbox that greets."""

    name = "greeting"
    spec_type = GreetingSpec

    def launcher(
        self,
        spec: SandboxSpec,
        workspace: Path,
        *,
        image: RunnableImage | None,
        guest_workspace: str | None,
    ) -> Launcher:
        assert isinstance(spec, GreetingSpec)
        greeted = spec.model_copy(update={"env": {**spec.env, "GREETING": spec.greeting}})
        return super().launcher(greeted, workspace, image=image, guest_workspace=guest_workspace)


def scratch_store(url: str, settings: Settings) -> Store:
    """``scratch://NAME``: a SQLite store called NAME in the data directory."""
    return SqliteJobStore(settings.data_dir / url.removeprefix("scratch://"))


def register(plugins: Plugins) -> None:
    plugins.sandbox_backends.register(GreetingBackend.name, GreetingBackend)
    plugins.stores.register("scratch", scratch_store)
