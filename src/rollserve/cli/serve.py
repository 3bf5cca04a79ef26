"""``rollserve serve``: one node, the HTTP API and the pipeline's worker pools in one process."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

import uvicorn

from rollserve.client import wait_ready
from rollserve.node import default_plugins
from rollserve.plugins import Plugins, add_plugins
from rollserve.server.app import create_app
from rollserve.settings import Settings


def load_plugins(modules: list[str], *, entry_points: bool = True) -> Plugins:
    """The built-in plug-ins, those installed packages announce (``rollserve.plugins``
    entry points), and each module's ``register(plugins)``."""
    return add_plugins(default_plugins(), modules, entry_points=entry_points)


def serve(
    settings: Settings, host: str, port: int, plugins: Plugins, *, fd: int | None = None
) -> None:
    """Run one node until SIGTERM/SIGINT; ``fd``: on a socket its parent bound."""
    app = create_app(settings, plugins)
    certfile, keyfile = settings.ssl_certfile, settings.ssl_keyfile
    if fd is not None:
        uvicorn.run(
            app,
            fd=fd,
            log_level="info",
            lifespan="on",
            ssl_certfile=certfile,
            ssl_keyfile=keyfile,
        )
    else:
        uvicorn.run(
            app,
            host=host,
            port=port,
            log_level="info",
            lifespan="on",
            ssl_certfile=certfile,
            ssl_keyfile=keyfile,
        )


def announce_when_ready(file: Path, host: str, port: int, *, tls: bool = False) -> threading.Thread:
    """Once ``/readyz`` answers on ``port``, append this node's URL to ``file`` (one line, one
    write: nodes of a cluster job share the file); the host is the machine's name when the
    server listens on every address."""
    public = socket.getfqdn() if host in ("0.0.0.0", "::", "") else host
    scheme = "https" if tls else "http"
    line = f"{scheme}://{public}:{port}\n".encode()
    local = "127.0.0.1" if host in ("0.0.0.0", "") else ("[::1]" if host == "::" else host)

    def wait_then_write() -> None:
        wait_ready(f"{scheme}://{local}:{port}", verify=False)  # itself, by its loopback
        descriptor = os.open(file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(descriptor, line)
        finally:
            os.close(descriptor)

    thread = threading.Thread(target=wait_then_write, name="rollserve-announce", daemon=True)
    thread.start()
    return thread
