"""``rollserve sandbox check``: which backends work here, for the user running it; how each
limit is enforced, how a workspace inside an image is made writable, how fast a sandbox starts.

A start is timed from ``start()`` to the first command's result in the sandbox's shell, with an
empty workspace; the figure is the median of several starts.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import statistics
import time
from collections.abc import Awaitable, Callable

from rollserve.bench.stats import running_user
from rollserve.errors import RollserveError, SandboxStartError
from rollserve.sandbox import SandboxInstance, SandboxManager, spec_for
from rollserve.sandbox.state import unmount_under
from rollserve.sandbox.workspace import Layout, lay_out
from rollserve.schema.sandbox import BackendCheck, SandboxSpec
from rollserve.settings import Settings
from rollserve.shell import ShellSession
from rollserve.trees import remove_tree


async def time_start(
    manager: SandboxManager,
    backend: str,
    spec: SandboxSpec | None = None,
    inspect: Callable[[SandboxInstance], Awaitable[None]] | None = None,
) -> float:
    """Milliseconds from ``start()`` (of ``spec``, default the backend's) to the result of
    ``true`` in the new sandbox's shell; ``inspect`` looks at the sandbox before it closes."""
    start = time.perf_counter()
    sandbox = await manager.start(spec or spec_for(backend))
    try:
        session = await ShellSession.open(sandbox)
        result = await session.run("true")
        elapsed = (time.perf_counter() - start) * 1000
        if result.exit_code != 0:
            raise SandboxStartError(f"'true' exited {result.exit_code} in {backend}")
        await session.close()
        if inspect is not None:
            await inspect(sandbox)
        return elapsed
    finally:
        await manager.close(sandbox)


async def check_backends(manager: SandboxManager, starts: int = 7) -> list[BackendCheck]:
    """One line per registered backend."""
    checks = []
    layout = await probe_workspace(manager.settings)
    user = f"{running_user()} (uid {os.geteuid()})"
    for name in manager.backends:
        available = manager.availability(name)
        if not available.available:
            checks.append(BackendCheck(name=name, available=False, reason=available.reason))
            continue
        try:
            await time_start(manager, name)  # warm caches: the figure is a warm start
            samples = [await time_start(manager, name) for _ in range(starts)]
        except RollserveError as exc:
            checks.append(BackendCheck(name=name, available=False, reason=exc.message))
            continue
        box = await manager.start(spec_for(name))
        try:
            limits, closes = box.enforcement(), box.closes_by
        finally:
            await manager.close(box)
        checks.append(
            BackendCheck(
                name=name,
                available=True,
                reason=available.reason,
                user=user,
                unenforced=dict(available.unenforced),
                limits=limits,
                closes=closes,
                workspace=layout.how,
                workspace_note=layout.why_not_overlay
                or ("in a user and mount namespace of its own" if layout.holder else "on the host"),
                start_p50_ms=round(statistics.median(samples), 2),
                starts=len(samples),
            )
        )
    return checks


async def probe_workspace(settings: Settings) -> Layout:
    """How a workspace inside an image is made writable here, tried on a small tree of this
    user's (the way the image cache's trees are)."""
    base = settings.state_dir / f".probe-{secrets.token_hex(4)}"
    lower, target, scratch = base / "lower", base / "workspace", base / "scratch"
    for d in (lower / "dir", target, scratch):
        d.mkdir(parents=True)
    (lower / "dir" / "file").write_text("probe\n")
    try:
        layout = await lay_out(lower, target, scratch, settings.image_workspace)
        if layout.holder is not None:
            written = layout.holder.host_path(target) / "dir" / "file"
            await asyncio.to_thread(written.write_text, "changed\n")
            await layout.holder.close()
        return layout
    finally:
        await asyncio.to_thread(unmount_under, base)
        await asyncio.to_thread(remove_tree, base)
