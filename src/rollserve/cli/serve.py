"""``rollserve serve``: one node, the HTTP API and the pipeline's worker pools in one process."""

from __future__ import annotations

import importlib

import uvicorn

from rollserve.errors import InvalidInputError
from rollserve.pipeline.plugins import default_plugins
from rollserve.pipeline.stages import Plugins
from rollserve.server.app import create_app
from rollserve.settings import Settings


def load_plugins(modules: list[str]) -> Plugins:
    """The built-in plug-ins plus those of each module's ``register(plugins)``."""
    plugins = default_plugins()
    for name in modules:
        module = importlib.import_module(name)
        register = getattr(module, "register", None)
        if register is None:
            raise InvalidInputError(f"plug-in module {name} has no register(plugins) function")
        register(plugins)
    return plugins


def serve(
    settings: Settings, host: str, port: int, plugins: list[str], *, fd: int | None = None
) -> None:
    """Run one node until SIGTERM/SIGINT; ``fd``: on a socket its parent bound."""
    app = create_app(settings, load_plugins(plugins))
    if fd is not None:
        uvicorn.run(app, fd=fd, log_level="info", lifespan="on")
    else:
        uvicorn.run(app, host=host, port=port, log_level="info", lifespan="on")
