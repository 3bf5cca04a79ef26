"""The node's gateway on its Unix socket: the gateway routes alone (no API, no API token),
for the agents in sandboxes, which reach the socket through their relay, and the harnesses
beside them."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import uvicorn
from fastapi import FastAPI

from rollserve.gateway.keys import Gateway
from rollserve.server.gateway import gateway_routes


class _Embedded(uvicorn.Server):
    """A uvicorn server inside another's process: the outer one owns the signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class GatewayServer:
    """Serves ``gateway`` on the Unix socket ``path`` while started."""

    def __init__(self, gateway: Gateway, path: Path, max_request_mb: float) -> None:
        self.path = path
        app = FastAPI(title="rollserve gateway", docs_url=None, redoc_url=None, openapi_url=None)
        app.include_router(gateway_routes)
        app.state.gateway = gateway
        app.state.gateway_max_bytes = int(max_request_mb * 1024 * 1024)
        config = uvicorn.Config(
            app,
            uds=str(path),
            lifespan="off",
            log_level="warning",
            access_log=False,
        )
        self._server = _Embedded(config)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await asyncio.to_thread(self._clear)
        self._task = asyncio.create_task(self._server.serve(), name="rollserve-gateway")
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises what stopped it
                raise RuntimeError(f"the gateway stopped before it listened on {self.path}")
            await asyncio.sleep(0.01)
        os.chmod(self.path, 0o600)  # this user's (and its sandboxes') only

    def _clear(self) -> None:
        """A socket a killed predecessor left is in the way of the bind."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    async def stop(self) -> None:
        if self._task is None:
            return
        self._server.should_exit = True
        await self._task
        self._task = None
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
