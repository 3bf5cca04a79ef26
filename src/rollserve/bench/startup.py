"""``rollserve sandbox check``: which backends work here, and how fast a sandbox starts.

A start is timed from ``start()`` to the first command's result in the sandbox's shell, with an
empty workspace; the figure is the median of several starts.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Awaitable, Callable

from rollserve.errors import RollserveError, SandboxStartError
from rollserve.sandbox import SandboxInstance, SandboxManager, spec_for
from rollserve.schema.sandbox import BackendCheck, SandboxSpec
from rollserve.shell import ShellSession


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
        checks.append(
            BackendCheck(
                name=name,
                available=True,
                reason=available.reason,
                unenforced=dict(available.unenforced),
                start_p50_ms=round(statistics.median(samples), 2),
                starts=len(samples),
            )
        )
    return checks
