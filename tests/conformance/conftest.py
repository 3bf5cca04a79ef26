"""The conformance suite runs every test over every sandbox backend.

A backend this host cannot run is skipped with its reason — except in CI (``CI=true``), where
it is a failure, so that the suite really runs on bwrap and Apptainer there.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from rollserve.sandbox import SandboxInstance, SandboxManager, spec_for
from rollserve.shell import ShellSession
from tests.missing import missing

ALL_BACKENDS = ["bwrap", "apptainer", "local"]
# local runs processes on the host as they are: isolation is not among its promises.
ISOLATING_BACKENDS = ["bwrap", "apptainer"]


def require(manager: SandboxManager, backend: str) -> None:
    """Skip (or, in CI, fail) when ``backend`` cannot run on this host."""
    available = manager.availability(backend)
    if available.available:
        return
    message = f"sandbox backend {backend!r} unavailable here: {available.reason}"
    missing(message, manager.settings)


@pytest.fixture(params=ALL_BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=ISOLATING_BACKENDS)
def isolating_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def sandbox(manager: SandboxManager, backend: str) -> AsyncIterator[SandboxInstance]:
    require(manager, backend)
    box = await manager.start(spec_for(backend))
    yield box
    await manager.close(box)


@pytest.fixture
async def shell(sandbox: SandboxInstance) -> AsyncIterator[ShellSession]:
    session = await ShellSession.open(sandbox, input_idle_s=1.0)
    yield session
    await session.close()
