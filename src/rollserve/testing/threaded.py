"""A uvicorn server in a background thread on 127.0.0.1 and a free port: what the scripted LLM
server and the local registry run on."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterable
from typing import Any

import uvicorn
from fastapi import FastAPI


class ThreadedServer:
    """Serves one app until :meth:`stop` (graceful) or :meth:`kill` (connections reset)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.port = 0
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, app: FastAPI) -> int:
        """Serve ``app``; returns the port once it accepts connections."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            app, log_level="warning", access_log=False, lifespan="off", http="h11"
        )
        server = self._server = uvicorn.Server(config)

        async def serve() -> None:
            self._loop = asyncio.get_running_loop()
            await server.serve(sockets=[sock])

        self._thread = threading.Thread(
            target=asyncio.run, args=(serve(),), name=self.name, daemon=True
        )
        self._thread.start()
        while not server.started:
            if not self._thread.is_alive():
                sock.close()
                raise RuntimeError(f"the {self.name} server failed to start")
            time.sleep(0.005)
        return self.port

    def stop(self) -> None:
        """Shut down gracefully: requests in flight are answered first."""
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join()
            self._server = self._thread = None

    def drop(self, client: Iterable[Any] | None) -> None:
        """Reset the connection from ``client`` (a ``(host, port)`` pair) unanswered, as a
        server that dies mid-request does; call it on the server's own loop."""
        server, address = self._server, tuple(client) if client is not None else None
        if server is None or address is None:
            return
        for connection in list(server.server_state.connections):
            transport = getattr(connection, "transport", None)
            if getattr(connection, "client", None) == address and transport is not None:
                transport.abort()

    def kill(self) -> None:
        """Stop at once, like a crashed server: open connections are reset unanswered."""
        server, loop = self._server, self._loop
        if server is None or loop is None:
            return

        def abort() -> None:
            server.force_exit = server.should_exit = True
            for connection in list(server.server_state.connections):
                transport = getattr(connection, "transport", None)
                if transport is not None:
                    transport.abort()

        with contextlib.suppress(RuntimeError):  # the loop already ended
            loop.call_soon_threadsafe(abort)
        self.stop()
