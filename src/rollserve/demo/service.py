"""The rollserve service of ``rollserve demo``: the same FastAPI app as ``rollserve serve``
(``create_app`` with the built-in plug-ins), served by uvicorn on a free port inside the demo's
own event loop. The demo owns the signals, so uvicorn installs no handlers of its own."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import uvicorn

from rollserve.errors import InfrastructureError
from rollserve.node import default_plugins
from rollserve.server.app import create_app
from rollserve.settings import Settings

_START_TIMEOUT_S = 60.0
_STOP_TIMEOUT_S = 30.0


class _Server(uvicorn.Server):
    """uvicorn without its signal handlers: a Ctrl-C goes to the demo, which stops us."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def fresh_store(settings: Settings) -> None:
    """Remove the job store of an earlier demo run (``settings`` are the demo service's, whose
    directory is the demo's own): each run starts with no jobs, so that none an interrupted
    run left is picked up again (the trajectories file is the record)."""
    db = settings.job_db
    for path in (db, Path(f"{db}-wal"), Path(f"{db}-shm")):
        path.unlink(missing_ok=True)


async def _serve(server: uvicorn.Server, sock: socket.socket) -> None:
    try:
        await server.serve(sockets=[sock])
    except SystemExit:  # uvicorn's way of saying that the lifespan failed (it logged why)
        return


@contextlib.asynccontextmanager
async def local_service(settings: Settings) -> AsyncIterator[str]:
    """A running rollserve service for ``settings``; yields its base URL. On exit the server
    stops, and its lifespan stops the pipeline and closes every sandbox."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = int(sock.getsockname()[1])
    config = uvicorn.Config(
        create_app(settings, default_plugins()),
        log_level="warning",
        access_log=False,
        lifespan="on",
    )
    server = _Server(config)
    serving = asyncio.create_task(_serve(server, sock))
    try:
        end = time.monotonic() + _START_TIMEOUT_S
        while not server.started:
            if serving.done() or time.monotonic() > end:
                raise InfrastructureError(
                    "the rollserve service did not start (the log above says why)"
                )
            await asyncio.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        done, _ = await asyncio.wait({serving}, timeout=_STOP_TIMEOUT_S)
        if not done:
            server.force_exit = True
            await asyncio.wait({serving})
        sock.close()
        serving.result()  # an error of the server itself is not swallowed
