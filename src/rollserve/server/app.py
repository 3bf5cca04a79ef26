"""The FastAPI application factory: the lifespan owns the service; every request passes the
guard (token, body size); errors become JSON."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from rollserve import __version__
from rollserve.node import build_node
from rollserve.plugins import Plugins
from rollserve.server import errors
from rollserve.server.gateway import gateway_routes
from rollserve.server.gateway_server import GatewayServer
from rollserve.server.guard import Guard, tokens
from rollserve.server.routes import api, health, metrics_route
from rollserve.server.timing import ServerTiming
from rollserve.server.ui.routes import mount_ui
from rollserve.settings import Settings


def create_app(settings: Settings, plugins: Plugins) -> FastAPI:
    """A rollserve HTTP server for ``settings``, with ``plugins`` registered."""
    tokens(settings)  # a token that cannot be read stops the server before it starts

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        service = build_node(settings, plugins)
        await service.start()
        app.state.service = service
        app.state.gateway = service.gateway
        door = GatewayServer(service.gateway, settings.gateway_socket_path, settings.max_request_mb)
        try:
            await door.start()
            yield
        finally:
            await door.stop()
            await service.stop()

    app = FastAPI(title="rollserve", version=__version__, lifespan=lifespan)
    app.include_router(health)
    app.include_router(api)
    app.include_router(metrics_route)
    app.include_router(gateway_routes)
    mount_ui(app, settings)
    app.add_middleware(Guard, settings=settings)
    app.add_middleware(ServerTiming)  # added last: the outermost, timing the guard too
    errors.install(app)
    return app
