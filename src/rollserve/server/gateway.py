"""The gateway's routes: ``/v1/gateway/{key}/v1`` is an OpenAI-compatible base URL for one
running job (``chat/completions``, ``models``), and ``/v1/gateway/{key}/sandbox/…`` drives the
job's sandbox for a harness beside it. They are served on the API port (open without an API
token: the key is the secret) and on the node's Unix socket that sandboxes reach."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, Field, ValidationError

from rollserve.gateway.answers import chunks, completion
from rollserve.gateway.base import Refusal
from rollserve.gateway.job import GatewayJob
from rollserve.gateway.keys import Gateway
from rollserve.schema.openai import ChatRequest, OpenAIErrorBody
from rollserve.server import errors

PREFIX = "/v1/gateway"

_REFUSALS = {
    400: "a body that is not JSON or not valid for the route, or a call past the job's limits",
    404: "no running job has this key",
    409: "the job offers no sandbox to its agent",
    410: "the key's job has ended",
    413: "a request body over the server's bound",
    503: "rollserve could not serve the call (no backend): the job is retried",
}


def _refusals(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI declarations of the gateway's refusals (OpenAI's error shape)."""
    return errors.responses(*statuses, model=OpenAIErrorBody, descriptions=_REFUSALS)


def _body_of(model: type[BaseModel]) -> dict[str, Any]:
    """The request body a route reads itself, declared (the route answers 400, not 422)."""
    schema = {"application/json": {"schema": model.model_json_schema()}}
    return {"requestBody": {"required": True, "content": schema}}


gateway_routes = APIRouter(
    prefix=PREFIX + "/{key}",
    tags=["gateway"],
    responses=_refusals(404, 410) | errors.responses(422),
)


def _gateway(request: Request) -> Gateway:
    found: Gateway = request.app.state.gateway
    return found


def _refused(refusal: Refusal) -> JSONResponse:
    return JSONResponse(refusal.body(), status_code=refusal.status)


def _job(request: Request, key: str) -> GatewayJob:
    return _gateway(request).job(key)


async def _raw(request: Request) -> bytes:
    """The body, refused (413) past the server's bound on request bodies."""
    limit: int = getattr(request.app.state, "gateway_max_bytes", 0)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if limit and size > limit:
            raise Refusal(413, f"the body exceeds {limit} bytes", "request_too_large")
        chunks.append(chunk)
    return b"".join(chunks)


async def _body(request: Request) -> Any:
    raw = await _raw(request)
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise Refusal(400, f"the body is not valid JSON: {exc}", "invalid_json") from None


def _invalid(exc: ValidationError) -> Refusal:
    problem = exc.errors()[0]
    param = ".".join(str(p) for p in problem["loc"]) or None
    why = str(problem["msg"]).removeprefix("Value error, ")
    message = f"{param}: {why}" if param else why
    return Refusal(400, message, "invalid_request", param=param)


@gateway_routes.post(
    "/v1/chat/completions",
    responses=_refusals(400, 413, 503)
    | {
        200: {
            "description": "an OpenAI chat completion; with ``stream``, its chunks as events",
            "content": {
                "application/json": {"schema": {"type": "object"}},
                "text/event-stream": {"schema": {"type": "string"}},
            },
        }
    },
    openapi_extra=_body_of(ChatRequest),
)
async def chat_completions(key: str, request: Request) -> Response:
    """One model turn of the job, as an OpenAI chat completion (SSE with ``stream``)."""
    try:
        job = _job(request, key)
        try:
            body = ChatRequest.model_validate(await _body(request))
        except ValidationError as exc:
            job.refused += 1
            raise _invalid(exc) from None
        reply = await job.chat(body)
    except Refusal as refusal:
        return _refused(refusal)
    if body.stream:
        include = bool((body.stream_options or {}).get("include_usage"))
        return StreamingResponse(
            iter(list(chunks(reply, include_usage=include))), media_type="text/event-stream"
        )
    return JSONResponse(completion(reply))


@gateway_routes.get("/v1/models")
async def models(key: str, request: Request) -> Response:
    """The one model the job is served by."""
    try:
        job = _job(request, key)
    except Refusal as refusal:
        return _refused(refusal)
    card = {"id": job.model, "object": "model", "created": 0, "owned_by": "rollserve"}
    return JSONResponse({"object": "list", "data": [card]})


@gateway_routes.get("/task", responses=_refusals(409))
async def task(key: str, request: Request) -> Response:
    """The job's task, model and workspace, for a harness."""
    try:
        job = _job(request, key)
        workspace = job.sandbox().sandbox.guest_workspace
    except Refusal as refusal:
        return _refused(refusal)
    return JSONResponse({"task": job.task, "model": job.model, "workspace": workspace})


class ShellCommand(BaseModel):
    """A command for the job's shell."""

    command: str = Field(min_length=1)
    timeout: float | None = Field(None, gt=0)


@gateway_routes.post(
    "/sandbox/shell", responses=_refusals(400, 409, 413), openapi_extra=_body_of(ShellCommand)
)
async def shell(key: str, request: Request) -> Response:
    """Run a command in the job's persistent shell (its sandbox's PTY bash)."""
    try:
        job = _job(request, key)
        try:
            command = ShellCommand.model_validate(await _body(request))
        except ValidationError as exc:
            raise _invalid(exc) from None
        result = await job.sandbox().run(command.command, command.timeout)
    except Refusal as refusal:
        return _refused(refusal)
    return JSONResponse(result.model_dump(mode="json"))


@gateway_routes.get(
    "/sandbox/file",
    responses=_refusals(400, 409)
    | {200: {"description": "the file", "content": {"application/octet-stream": {}}}},
)
async def read_file(key: str, request: Request, path: str = Query(min_length=1)) -> Response:
    """A file of the job's sandbox."""
    try:
        data = await _job(request, key).sandbox().read(path)
    except Refusal as refusal:
        return _refused(refusal)
    return Response(data, media_type="application/octet-stream")


@gateway_routes.put(
    "/sandbox/file",
    status_code=204,
    responses=_refusals(400, 409, 413),
    openapi_extra={"requestBody": {"required": True, "content": {"application/octet-stream": {}}}},
)
async def write_file(key: str, request: Request, path: str = Query(min_length=1)) -> Response:
    """Write a file of the job's sandbox (the body is its content)."""
    try:
        job = _job(request, key)
        await job.sandbox().write(path, await _raw(request))
    except Refusal as refusal:
        return _refused(refusal)
    return Response(status_code=204)


class Submission(BaseModel):
    """What a harness submits for evaluation (None: the task's default)."""

    answer: str | None = None


@gateway_routes.post(
    "/submit",
    status_code=204,
    responses=_refusals(400, 413),
    openapi_extra=_body_of(Submission),
)
async def submit(key: str, request: Request) -> Response:
    """The harness's submission; the job's evaluation takes it when the harness ends."""
    try:
        job = _job(request, key)
        try:
            given = Submission.model_validate(await _body(request))
        except ValidationError as exc:
            raise _invalid(exc) from None
        job.submitted = given.answer if given.answer is not None else ""
    except Refusal as refusal:
        return _refused(refusal)
    return Response(status_code=204)
