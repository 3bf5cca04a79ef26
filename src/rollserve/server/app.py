"""The FastAPI application factory: the lifespan owns the service; errors become JSON."""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from rollserve import __version__
from rollserve.errors import QueueFullError, RollserveError, UnauthorizedError
from rollserve.pipeline.service import RolloutService
from rollserve.pipeline.stages import Plugins
from rollserve.server.routes import api, health, metrics_route
from rollserve.settings import Settings


def create_app(settings: Settings, plugins: Plugins) -> FastAPI:
    """A rollserve HTTP server for ``settings``, with ``plugins`` registered."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        service = RolloutService(settings, plugins)
        await service.start()
        app.state.service = service
        try:
            yield
        finally:
            await service.stop()

    async def authorize(request: Request) -> None:
        token = settings.api_token
        if token is None:
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            raise UnauthorizedError("a valid bearer token is required")

    app = FastAPI(title="rollserve", version=__version__, lifespan=lifespan)
    app.include_router(health)
    app.include_router(api, dependencies=[Depends(authorize)])
    app.include_router(metrics_route, dependencies=[Depends(authorize)])

    @app.exception_handler(RollserveError)
    async def rollserve_error(request: Request, exc: RollserveError) -> JSONResponse:
        headers = {"Retry-After": "5"} if isinstance(exc, QueueFullError) else None
        return JSONResponse(exc.to_dict(), status_code=exc.http_status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [
            {"field": ".".join(str(p) for p in e["loc"]), "message": e["msg"]} for e in exc.errors()
        ]
        fields = ", ".join(p["field"] for p in problems)
        body = {
            "error": {
                "code": "invalid_input",
                "message": f"invalid fields: {fields}",
                "details": {"problems": problems},
            }
        }
        return JSONResponse(body, status_code=422)

    return app
