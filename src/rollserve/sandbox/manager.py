"""The sandbox manager: backends by name, the start/close lifecycle, and crash recovery."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import secrets
import time
from pathlib import Path, PurePosixPath
from types import TracebackType
from typing import Literal

from rollserve.errors import (
    BackendUnavailableError,
    InvalidInputError,
    TemplateNotFoundError,
    UnknownNameError,
)
from rollserve.images import ImageStore, RunnableImage
from rollserve.registry import Registry
from rollserve.sandbox import files, quota, state
from rollserve.sandbox.apptainer import ApptainerBackend
from rollserve.sandbox.base import GUEST_WORKSPACE, Availability, SandboxBackend
from rollserve.sandbox.bwrap import BwrapBackend
from rollserve.sandbox.env import guest_binds, run_dir_of
from rollserve.sandbox.instance import SandboxInstance
from rollserve.sandbox.limits import Cgroup, CgroupPlace
from rollserve.sandbox.local import LocalBackend
from rollserve.sandbox.workspace import Layout, copy_tree, image_directory, lay_out
from rollserve.schema.sandbox import (
    RUN_DIR,
    SandboxLimits,
    SandboxSpec,
    check_guest_workspace,
)
from rollserve.settings import Settings

log = logging.getLogger(__name__)

BUILT_IN = (BwrapBackend, ApptainerBackend, LocalBackend)


def spec_for(backend: str, **fields: object) -> SandboxSpec:
    """A spec of a built-in backend (``image``, ``template``, ``limits`` …); a node's own
    backends, plug-ins included: :meth:`SandboxManager.spec_for`."""
    for kind in BUILT_IN:
        if kind.name == backend:
            return kind.spec_type.model_validate(fields)
    raise UnknownNameError("sandbox backend", backend, [kind.name for kind in BUILT_IN])


def default_backends(settings: Settings) -> Registry[SandboxBackend]:
    """A registry holding the built-in backends."""
    registry: Registry[SandboxBackend] = Registry("sandbox backend")
    for kind in BUILT_IN:
        registry.register(kind.name, kind(settings))
    return registry


class SandboxManager:
    """Starts sandboxes, knows the live ones, and reaps what a crashed process left behind.

    Use as an async context manager: entering reaps stale sandboxes of dead rollserve
    processes, leaving closes every sandbox this manager started.
    """

    def __init__(
        self,
        settings: Settings,
        backends: Registry[SandboxBackend] | None = None,
        images: ImageStore | None = None,
    ):
        self.settings = settings
        self.backends = backends if backends is not None else default_backends(settings)
        self.live: dict[str, SandboxInstance] = {}
        self.images = images if images is not None else ImageStore(settings)
        self._images: dict[str, RunnableImage] = {}
        self._availability: dict[str, Availability] = {}
        self._quota_reason: str | None = None
        self._cgroup_place: CgroupPlace | Literal[False] | None = False  # False: not looked
        self._warned: set[str] = set()  # limits already said to be unenforced here
        # Where given (benchmarks), each close appends the seconds it took.
        self.close_times: list[float] | None = None

    def spec_for(self, backend: str, **fields: object) -> SandboxSpec:
        """A spec of the backend called ``backend`` (``image``, ``template``, ``limits`` …);
        an unknown name lists the known ones."""
        spec: SandboxSpec = self.backends.get(backend).spec_type.model_validate(fields)
        return spec

    async def __aenter__(self) -> SandboxManager:
        await asyncio.to_thread(self.reap)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close_all()

    def reap(self) -> list[str]:
        """Destroy sandboxes whose owning process died; returns their ids."""
        return state.reap(self.settings.state_dir)

    def availability(self, name: str) -> Availability:
        """Whether backend ``name`` works here (probed once per manager), with the limits it
        cannot enforce on this host (the disk quota, which rollserve mounts, included)."""
        backend = self.backends.get(name)
        if name not in self._availability:
            found = backend.availability()
            problem = self._quota_problem()
            if found.available and problem is not None:
                notes = [n for n in (found.unenforced.get("disk_mb"), problem) if n]
                unenforced = {**found.unenforced, "disk_mb": "; ".join(notes)}
                found = dataclasses.replace(found, unenforced=unenforced)
            self._availability[name] = found
        return self._availability[name]

    def cgroup_place(self) -> CgroupPlace | None:
        """Where this node's sandbox cgroups go (found once; None: nowhere writable)."""
        if self._cgroup_place is False:
            self._cgroup_place = CgroupPlace.find(self.settings.cgroup_root)
        return self._cgroup_place

    def _quota_problem(self) -> str | None:
        """Why the workspace disk quota cannot be enforced here (None: it can)."""
        if self._quota_reason is None:
            self._quota_reason = quota.unsupported_reason() or ""
        return self._quota_reason or None

    def _unenforced(
        self, limits: SandboxLimits, cgroup: Cgroup | None, available: Availability
    ) -> dict[str, str]:
        """The limits asked for that this sandbox will not have, with the reason."""
        out = {k: v for k, v in available.unenforced.items() if getattr(limits, k) is not None}
        pids = cgroup is not None and "pids" in cgroup.controllers
        if limits.max_processes is not None and not pids and os.geteuid() == 0:
            out["max_processes"] = (
                "no writable pids cgroup here, and RLIMIT_NPROC does not bind root (rollserve "
                "runs as uid 0, and so do its sandboxes): processes are not counted"
            )
        fresh = {k: v for k, v in out.items() if k not in self._warned}
        if fresh:  # once per limit and manager, not at every start
            log.warning("sandbox limits not enforced here: %s", fresh)
            self._warned.update(fresh)
        return out

    async def start(self, spec: SandboxSpec) -> SandboxInstance:
        """Start a sandbox: record it, lay out its workspace from the template, limit it."""
        backend = self.backends.get(spec.backend)
        available = await asyncio.to_thread(self.availability, spec.backend)
        if not available.available:
            raise BackendUnavailableError(
                f"sandbox backend {spec.backend!r} is unavailable: {available.reason}",
                backend=spec.backend,
            )
        template = _check_template(spec.template)
        sandbox_id = f"{spec.backend}-{secrets.token_hex(6)}"
        # Files and cgroup directories are made in a thread: with hundreds of sandboxes
        # starting, their mkdir and writes would hold up every rollout's turn.
        made = asyncio.get_running_loop().run_in_executor(None, self._make, sandbox_id, spec)
        try:
            record, cgroup = await asyncio.shield(made)
        except asyncio.CancelledError:
            if not made.cancelled():  # made anyway: remove it
                try:
                    record, _ = await made
                    await asyncio.to_thread(state.destroy, record)
                except Exception as exc:  # not made after all, or not removable: say which
                    log.warning("sandbox %s after a cancelled start: %s", sandbox_id, exc)
            raise
        image: RunnableImage | None = None
        disk = None
        if spec.limits.disk_mb is not None and self._quota_problem() is None:
            disk = quota.DiskQuota(record.path / "disk.img", spec.limits.disk_mb)
        layout = Layout("bind")
        try:
            workspace = record.path / "workspace"
            image = await self._image(spec)
            guest = spec.workspace
            if guest is None and image is not None and spec.template is None:
                guest = _workdir(image)
            if spec.writable_root:
                if image is None or image.kind != "dir":
                    raise InvalidInputError(
                        f"a writable root needs a root-filesystem image ({spec.backend} "
                        f"backend, image {image.ref if image else None})",
                        backend=spec.backend,
                    )
                scratch = record.path / "overlay"
                await asyncio.to_thread(scratch.mkdir)
                layout = await lay_out(
                    image.path,
                    workspace,
                    scratch,
                    "overlay",  # a copy of a whole root would cost too much, and stacks nothing
                    disk,
                    note=record.add_process,
                    layers=tuple(_layers(spec.lower_layers)),
                    keepable=True,
                )
                guest = guest or "/"  # where the shell starts; its files are the whole root
                view = layout.holder.host_path(workspace) if layout.holder else workspace
                await asyncio.to_thread(_mount_points, view, spec, workspace)
            elif guest is not None and guest != GUEST_WORKSPACE:
                if image is None or image.kind != "dir":
                    raise InvalidInputError(
                        f"a workspace inside the image ({guest}) needs an image "
                        f"({spec.backend} backend, image {image.ref if image else None})",
                        workspace=guest,
                    )
                source = await asyncio.to_thread(image_directory, image, guest)
                scratch = record.path / "overlay"
                await asyncio.to_thread(scratch.mkdir)
                layout = await lay_out(
                    source,
                    workspace,
                    scratch,
                    self.settings.image_workspace,
                    disk,
                    note=record.add_process,
                )
            else:
                guest = None
                if disk is not None:
                    await disk.mount(workspace)
                if template is not None:  # a private copy, reflinked where the fs can
                    await copy_tree(template, workspace)
                    layout = Layout("copy")
            launcher = backend.launcher(spec, workspace, image=image, guest_workspace=guest)
            # rollserve's view of the guest workspace: inside the root where that is writable
            seen_at = workspace / guest.lstrip("/") if spec.writable_root and guest else workspace
            if launcher.contained and not record.contained:
                record.contained = True
                await asyncio.to_thread(record.save)
            sandbox = SandboxInstance(
                record=record,
                launcher=launcher,
                limits=spec.limits,
                workspace=seen_at,
                template=template,
                cgroup=cgroup,
                on_close=self._forget,
                unenforced=self._unenforced(spec.limits, cgroup, available),
                run_dir=run_dir_of(workspace) if spec.run_dir else None,
                layout=layout,
            )
        except BaseException:
            if layout.holder is not None:
                await layout.holder.close()
            await asyncio.shield(asyncio.to_thread(state.destroy, record))
            if image is not None:
                self.images.release(image)
            raise
        if image is not None:
            self._images[sandbox_id] = image
        self.live[sandbox_id] = sandbox
        return sandbox

    def _make(
        self, sandbox_id: str, spec: SandboxSpec
    ) -> tuple[state.SandboxRecord, Cgroup | None]:
        """The sandbox's state record and empty workspace, then its cgroup (None where there
        is none)."""
        record = state.SandboxRecord.create(self.settings.state_dir, sandbox_id, spec.backend)
        try:
            os.mkdir(record.path / "workspace")
            if spec.run_dir:
                make_run_dir(run_dir_of(record.path / "workspace"), spec)
            cgroup = Cgroup.create(self.cgroup_place(), sandbox_id, spec.limits)
            if cgroup is not None:
                record.cgroup_dirs = [str(d) for d in cgroup.dirs]
                record.cgroup_version = cgroup.version
                record.save()
        except BaseException:
            state.destroy(record)
            raise
        return record, cgroup

    async def close(self, sandbox: SandboxInstance) -> None:
        """Close one sandbox (it forgets itself here once removed)."""
        started = time.perf_counter()
        await sandbox.close()
        if self.close_times is not None:
            self.close_times.append(time.perf_counter() - started)

    async def _image(self, spec: SandboxSpec) -> RunnableImage | None:
        """The spec's image, made runnable by the image store (None: the backend has none)."""
        ref = getattr(spec, "image", None)
        if ref is None:
            if spec.workspace is not None:
                raise InvalidInputError(
                    f"the {spec.backend} backend has no image to hold workspace {spec.workspace}",
                    workspace=spec.workspace,
                )
            return None
        return await self.images.runnable(
            ref, spec.backend, need_dir=spec.workspace is not None or spec.writable_root
        )

    def _forget(self, sandbox: SandboxInstance) -> None:
        self.live.pop(sandbox.id, None)
        image = self._images.pop(sandbox.id, None)
        if image is not None:
            self.images.release(image)

    async def close_all(self) -> None:
        """Close every sandbox still live; a failure to close one does not stop the others."""
        for sandbox in list(self.live.values()):
            try:
                await self.close(sandbox)
            except OSError:
                log.exception("closing sandbox %s failed", sandbox.id)


def make_run_dir(run: Path, spec: SandboxSpec) -> None:
    """A sandbox's run directory, with its writable ``out`` and a placeholder for each bind
    that lands inside it (the directory is read-only inside the sandbox: a mount point there
    must exist beforehand)."""
    (run / "out").mkdir(parents=True)
    for bind in spec.binds:
        inside = PurePosixPath(bind.target)
        if not inside.is_relative_to(RUN_DIR):
            continue
        placeholder = run / inside.relative_to(RUN_DIR)
        placeholder.parent.mkdir(parents=True, exist_ok=True)
        if bind.source.is_dir():
            placeholder.mkdir(exist_ok=True)
        else:
            placeholder.touch()


def _workdir(image: RunnableImage) -> str | None:
    """The image's WORKDIR as the default workspace, unless it is a system directory."""
    try:
        return check_guest_workspace(image.config.workdir)
    except ValueError:
        return None


def _mount_points(root: Path, spec: SandboxSpec, workspace: Path) -> None:
    """Where the spec's binds land inside a writable root, made beforehand: a backend that
    runs the root itself as its container (Apptainer's ``--writable``) makes none."""
    for source, target, _ in guest_binds(spec, workspace):
        rel = PurePosixPath(target).relative_to("/")
        files.mount_point_beneath(root, rel, directory=source.is_dir())
    for mount in spec.mounts:
        files.mount_point_beneath(root, PurePosixPath(str(mount)).relative_to("/"), True)


def _layers(layers: list[Path]) -> list[Path]:
    """The lower layers, each an existing directory."""
    for layer in layers:
        if not layer.is_dir():
            raise InvalidInputError(
                f"lower layer {layer} is not a directory (a kept layer that is gone?)",
                layer=str(layer),
            )
    return layers


def _check_template(template: Path | None) -> Path | None:
    if template is None:
        return None
    if not template.exists():
        raise TemplateNotFoundError(
            f"workspace template {template} does not exist", template=str(template)
        )
    if not template.is_dir():
        raise InvalidInputError(
            f"workspace template {template} is not a directory", template=str(template)
        )
    return template.resolve()
