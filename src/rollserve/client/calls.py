"""The HTTP API v1 as calls: each method's request (verb, path, body, parameters) and how its
answer is read, written once for the blocking and the asyncio client alike."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import httpx

from rollserve.errors import RemoteError
from rollserve.schema.api import (
    Accepted,
    BatchAccepted,
    ErrorBody,
    GroupCancelled,
    JobQuery,
    JobsPage,
    ResultsPage,
    Trajectory,
)
from rollserve.schema.backends import (
    BackendSpec,
    BackendView,
    ModelState,
    PauseMode,
    PauseRequest,
    ResumeRequest,
)
from rollserve.schema.jobs import TERMINAL, JobRequest, JobView
from rollserve.schema.status import NodeStatus

T = TypeVar("T")

LONG_POLL_S = 30.0


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request of the API, and what its successful answer is read as."""

    method: str
    path: str
    read: Callable[[httpx.Response], T]
    json: Any = None
    params: dict[str, Any] = field(default_factory=dict)
    timeout: float | None = None  # None: the client's

    def send_args(self) -> dict[str, Any]:
        """httpx's keyword arguments for this call."""
        out: dict[str, Any] = {}
        if self.json is not None:
            out["json"] = self.json
        if self.params:
            out["params"] = self.params
        if self.timeout is not None:
            out["timeout"] = self.timeout
        return out

    def answer(self, response: httpx.Response) -> T:
        """The answer read, or the server's error raised as a RemoteError."""
        return self.read(checked(response))


def checked(response: httpx.Response) -> httpx.Response:
    """``response`` if it is a success; otherwise its error as a RemoteError."""
    if response.is_success:
        return response
    try:
        error = ErrorBody.model_validate_json(response.content).error
    except ValueError:  # not rollserve's answer (a proxy's page, say)
        raise RemoteError(response.status_code, "http_error", response.text[:500]) from None
    raise RemoteError(response.status_code, error.code, error.message, **error.details)


def _as(model: Callable[[Any], T]) -> Callable[[httpx.Response], T]:
    return lambda response: model(response.json())


def _nothing(response: httpx.Response) -> None:
    return None


def job_body(request: JobRequest | dict[str, Any]) -> dict[str, Any]:
    """The request as sent: a job without an id gets one here, so that a submit sent again
    (to another node, after a connection failed mid-request) is idempotent."""
    model = request if isinstance(request, JobRequest) else JobRequest.model_validate(request)
    if model.job_id is None:
        model = model.model_copy(update={"job_id": uuid.uuid4().hex})
    return model.model_dump(mode="json", exclude_none=True)


def submit(request: JobRequest | dict[str, Any]) -> Call[Accepted]:
    return Call("POST", "/v1/jobs", _as(Accepted.model_validate), json=job_body(request))


def submit_batch(requests: list[JobRequest | dict[str, Any]]) -> Call[list[Accepted]]:
    body = {"jobs": [job_body(r) for r in requests]}
    return Call(
        "POST", "/v1/jobs/batch", lambda r: BatchAccepted.model_validate(r.json()).jobs, json=body
    )


def get(job_id: str, wait: float = 0) -> Call[JobView]:
    return Call("GET", f"/v1/jobs/{job_id}", _as(JobView.model_validate), params={"wait": wait})


def list_jobs(query: JobQuery | None, filters: dict[str, Any]) -> Call[JobsPage]:
    """``GET /v1/jobs``: a JobQuery, or its fields as keywords (checked here)."""
    given = query or JobQuery.model_validate(filters)
    params = given.model_dump(mode="json", exclude_defaults=True)
    return Call("GET", "/v1/jobs", _as(JobsPage.model_validate), params=params)


def trajectory(job_id: str) -> Call[Trajectory]:
    return Call("GET", f"/v1/jobs/{job_id}/trajectory", _as(Trajectory.model_validate))


def results(after: int, limit: int, wait: float) -> Call[ResultsPage]:
    params = {"after": after, "limit": limit, "wait": wait}
    return Call("GET", "/v1/results", _as(ResultsPage.model_validate), params=params)


def cancel(job_id: str) -> Call[JobView]:
    return Call("DELETE", f"/v1/jobs/{job_id}", _as(JobView.model_validate))


def cancel_group(group_id: str) -> Call[list[str]]:
    return Call(
        "POST",
        f"/v1/groups/{group_id}/cancel",
        lambda r: GroupCancelled.model_validate(r.json()).cancelled,
    )


def register_backend(spec: BackendSpec | dict[str, Any]) -> Call[BackendView]:
    body = BackendSpec.model_validate(spec).model_dump(mode="json", exclude_none=True)
    return Call("POST", "/v1/llm/backends", _as(BackendView.model_validate), json=body)


def backends() -> Call[list[BackendView]]:
    return Call(
        "GET", "/v1/llm/backends", lambda r: [BackendView.model_validate(b) for b in r.json()]
    )


def remove_backend(backend_id: str) -> Call[None]:
    return Call("DELETE", f"/v1/llm/backends/{backend_id}", _nothing)


def pause_model(model: str, mode: PauseMode, admission: bool, timeout_s: float) -> Call[ModelState]:
    body = PauseRequest(mode=mode, admission=admission, timeout_s=timeout_s).model_dump()
    return Call(
        "POST",
        f"/v1/llm/models/{model}/pause",
        _as(ModelState.model_validate),
        json=body,
        timeout=timeout_s + 30,
    )


def resume_model(model: str, policy_version: int | None) -> Call[ModelState]:
    body = ResumeRequest(policy_version=policy_version).model_dump()
    return Call("POST", f"/v1/llm/models/{model}/resume", _as(ModelState.model_validate), json=body)


def status() -> Call[NodeStatus]:
    return Call("GET", "/v1/status", _as(NodeStatus.model_validate))


def poll_for(end: float | None) -> float:
    """How long the next long-poll may wait, given a deadline (None: none)."""
    if end is None:
        return LONG_POLL_S
    return max(0.0, min(LONG_POLL_S, end - time.monotonic()))


def settled(job: JobView, end: float | None) -> bool:
    """Whether waiting for ``job`` is over: it finished, or the deadline passed."""
    return job.status in TERMINAL or (end is not None and time.monotonic() >= end)
