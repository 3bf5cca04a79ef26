"""Every error the API answers has one shape, ``{"error": {code, message, details}}``, and
every status a route can answer is declared in the OpenAPI document."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from rollserve.errors import QueueFullError, RollserveError
from rollserve.schema.api import ErrorBody

_DESCRIPTIONS = {
    400: "a body that is not JSON, or an unknown name (task kind, agent, backend kind)",
    401: "no valid bearer token",
    403: "a read-only token on a route that changes something",
    404: "no such job or backend",
    409: "a job id submitted before with another request",
    413: "a request body over the server's bound",
    422: "invalid input: the fields that are wrong, and why",
    429: "the queue is full (Retry-After says when to try again)",
    503: "the job store or an inference backend does not answer",
}


def responses(
    *statuses: int,
    model: type[BaseModel] = ErrorBody,
    descriptions: Mapping[int, str] = _DESCRIPTIONS,
) -> dict[int | str, dict[str, Any]]:
    """OpenAPI declarations of error statuses, for a route's or a router's ``responses``:
    rollserve's error body, or another ``model`` with its own ``descriptions``."""
    return {s: {"model": model, "description": descriptions[s]} for s in statuses}


def body(code: str, message: str, **details: Any) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "details": details}}


def install(app: FastAPI) -> None:
    """Answer every error of ``app`` in the one shape."""

    @app.exception_handler(RollserveError)
    async def rollserve_error(request: Request, exc: RollserveError) -> JSONResponse:
        headers = {"Retry-After": "5"} if isinstance(exc, QueueFullError) else None
        return JSONResponse(exc.to_dict(), status_code=exc.http_status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [
            {"field": ".".join(str(p) for p in e["loc"]), "message": e["msg"]} for e in exc.errors()
        ]
        if any(e["type"] == "json_invalid" for e in exc.errors()):
            return JSONResponse(
                body("invalid_json", "the body is not valid JSON", problems=problems), 400
            )
        fields = ", ".join(p["field"] for p in problems)
        return JSONResponse(
            body("invalid_input", f"invalid fields: {fields}", problems=problems), 422
        )

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        """Starlette's own answers (no such route, a method the route lacks, a body that
        cannot be read) in the one shape; a 405 lists every method of the path."""
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            headers["Allow"] = ", ".join(_methods(app, request))
            code = "method_not_allowed"
        elif exc.status_code == 404:
            code = "not_found"
        elif exc.status_code == 400:
            code = "invalid_json"
        else:
            code = "http_error"
        message = str(exc.detail) if exc.detail else "error"
        return JSONResponse(body(code, message), exc.status_code, headers=headers)


def _methods(app: FastAPI, request: Request) -> list[str]:
    """The methods the OpenAPI document gives the request's path. A path of the document that
    is the very path wins over one whose parameter would take it (``/v1/jobs/batch`` is not a
    job id)."""
    paths: dict[str, dict[str, Any]] = app.openapi()["paths"]
    path = request.scope["path"]
    if path in paths:
        return sorted(method.upper() for method in paths[path])
    found: set[str] = set()
    for template, item in paths.items():
        parts = re.split(r"(\{[^/}]+\})", template)
        pattern = "".join("[^/]+" if p.startswith("{") else re.escape(p) for p in parts)
        if re.fullmatch(pattern, path):
            found.update(method.upper() for method in item)
    return sorted(found)
