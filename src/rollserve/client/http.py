"""``RolloutClient`` and ``AsyncRolloutClient``: the HTTP API v1 for trainers (httpx +
pydantic + ``rollserve.schema`` only; a trainer installs nothing of the server side)."""

from __future__ import annotations

import ssl
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import httpx

from rollserve.errors import RemoteError
from rollserve.schema.api import (
    Accepted,
    BatchAccepted,
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

_LONG_POLL_S = 30.0


def _body(request: JobRequest | dict[str, Any]) -> dict[str, Any]:
    """The request as sent: a job without an id gets one here, so that a submit sent again
    (to another node, after a connection failed mid-request) is idempotent."""
    model = request if isinstance(request, JobRequest) else JobRequest.model_validate(request)
    if model.job_id is None:
        model = model.model_copy(update={"job_id": uuid.uuid4().hex})
    return model.model_dump(mode="json", exclude_none=True)


def wait_ready(url: str, timeout_s: float | None = None, *, verify: bool | str = True) -> bool:
    """Wait until the node at ``url`` answers ``/readyz`` with 200 (True), or until
    ``timeout_s`` has passed (False; None waits as long as it takes). ``verify``: as httpx's
    (a CA bundle's path for a server with a certificate of its own)."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        try:
            answer = httpx.get(f"{url.rstrip('/')}/readyz", timeout=2, verify=_tls(verify))
            if answer.status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        if deadline is not None and time.monotonic() > deadline:
            return False
        time.sleep(0.2)


def _tls(verify: bool | str) -> bool | ssl.SSLContext:
    """httpx's ``verify``: a CA bundle's path becomes a context that trusts it."""
    return ssl.create_default_context(cafile=verify) if isinstance(verify, str) else verify


def _urls(url: str | Sequence[str]) -> list[str]:
    urls = [url] if isinstance(url, str) else list(url)
    if not urls:
        raise ValueError("give at least one server URL")
    return [u.rstrip("/") for u in urls]


def _check(response: httpx.Response) -> httpx.Response:
    if response.is_success:
        return response
    try:
        error = response.json()["error"]
        code, message, details = error["code"], error["message"], error.get("details") or {}
    except (ValueError, KeyError, TypeError):
        code, message, details = "http_error", response.text[:500], {}
    raise RemoteError(response.status_code, code, message, **details)


def _poll_for(end: float | None) -> float:
    """How long the next long-poll may wait, given a deadline (None: none)."""
    if end is None:
        return _LONG_POLL_S
    return max(0.0, min(_LONG_POLL_S, end - time.monotonic()))


def _settled(job: JobView, end: float | None) -> bool:
    """Whether waiting for ``job`` is over: it finished, or the deadline passed."""
    return job.status in TERMINAL or (end is not None and time.monotonic() >= end)


def _query(query: JobQuery | None, filters: dict[str, Any]) -> dict[str, Any]:
    """``GET /v1/jobs``'s parameters: a JobQuery, or its fields as keywords (checked here)."""
    given = query or JobQuery.model_validate(filters)
    return given.model_dump(mode="json", exclude_defaults=True)


def _headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


class RolloutClient:
    """A blocking client. ``url`` may list several nodes of one fleet: a call whose node does
    not answer (connection failures are retried ``retries`` times first) goes to the next."""

    def __init__(
        self,
        url: str | Sequence[str],
        *,
        token: str | None = None,
        timeout: float = 60.0,
        retries: int = 3,
        verify: bool | str = True,
    ) -> None:
        self._urls, self._at = _urls(url), 0
        self._http = httpx.Client(
            headers=_headers(token),
            timeout=timeout + _LONG_POLL_S,
            transport=httpx.HTTPTransport(retries=retries, verify=_tls(verify)),
        )

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        for tried in range(len(self._urls)):
            try:
                return self._http.request(method, self._urls[self._at] + path, **kwargs)
            except httpx.TransportError:
                if tried == len(self._urls) - 1:
                    raise
                self._at = (self._at + 1) % len(self._urls)
        raise AssertionError("unreachable")

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RolloutClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def submit(self, request: JobRequest | dict[str, Any]) -> Accepted:
        return Accepted.model_validate(
            _check(self._request("POST", "/v1/jobs", json=_body(request))).json()
        )

    def submit_batch(self, requests: list[JobRequest | dict[str, Any]]) -> list[Accepted]:
        answer = self._request(
            "POST", "/v1/jobs/batch", json={"jobs": [_body(r) for r in requests]}
        )
        return BatchAccepted.model_validate(_check(answer).json()).jobs

    def get(self, job_id: str, *, wait: float = 0) -> JobView:
        answer = self._request("GET", f"/v1/jobs/{job_id}", params={"wait": wait})
        return JobView.model_validate(_check(answer).json())

    def list_jobs(self, query: JobQuery | None = None, **filters: Any) -> JobsPage:
        """A page of jobs, filtered and sorted: ``list_jobs(status=["failed"], kind="swe")``."""
        answer = self._request("GET", "/v1/jobs", params=_query(query, filters))
        return JobsPage.model_validate(_check(answer).json())

    def trajectory(self, job_id: str) -> Trajectory:
        """The job's rollout turn by turn (a running job's turns so far)."""
        answer = self._request("GET", f"/v1/jobs/{job_id}/trajectory")
        return Trajectory.model_validate(_check(answer).json())

    def wait(self, job_id: str, timeout: float | None = None) -> JobView:
        """The job once finished (long-polling), or as it is when ``timeout`` passes."""
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            job = self.get(job_id, wait=_poll_for(end))
            if _settled(job, end):
                return job

    def results(self, after: int = 0, *, limit: int = 100, wait: float = 0) -> ResultsPage:
        """One page of the results feed (long-polling up to ``wait`` for the first result)."""
        answer = self._request(
            "GET", "/v1/results", params={"after": after, "limit": limit, "wait": wait}
        )
        return ResultsPage.model_validate(_check(answer).json())

    def iter_results(
        self, after: int = 0, *, limit: int = 100, stop_after: int | None = None
    ) -> Iterator[JobView]:
        """Finished jobs in completion order, as they come; ends after ``stop_after``."""
        seen = 0
        while stop_after is None or seen < stop_after:
            page = self.results(after, limit=limit, wait=_LONG_POLL_S)
            after = page.next
            for job in page.results:
                yield job
                seen += 1
                if stop_after is not None and seen >= stop_after:
                    return

    def cancel(self, job_id: str) -> JobView:
        return JobView.model_validate(_check(self._request("DELETE", f"/v1/jobs/{job_id}")).json())

    def cancel_group(self, group_id: str) -> list[str]:
        answer = _check(self._request("POST", f"/v1/groups/{group_id}/cancel"))
        return GroupCancelled.model_validate(answer.json()).cancelled

    def register_backend(self, spec: BackendSpec | dict[str, Any]) -> BackendView:
        body = BackendSpec.model_validate(spec).model_dump(mode="json", exclude_none=True)
        return BackendView.model_validate(
            _check(self._request("POST", "/v1/llm/backends", json=body)).json()
        )

    def backends(self) -> list[BackendView]:
        answer = _check(self._request("GET", "/v1/llm/backends")).json()
        return [BackendView.model_validate(b) for b in answer]

    def remove_backend(self, backend_id: str) -> None:
        _check(self._request("DELETE", f"/v1/llm/backends/{backend_id}"))

    def pause_model(
        self,
        model: str,
        mode: PauseMode = "wait",
        *,
        admission: bool = False,
        timeout_s: float = 600.0,
    ) -> ModelState:
        """Pause ``model`` for a weight update; returns once its calls in flight are done."""
        body = PauseRequest(mode=mode, admission=admission, timeout_s=timeout_s)
        answer = self._request(
            "POST", f"/v1/llm/models/{model}/pause", json=body.model_dump(), timeout=timeout_s + 30
        )
        return ModelState.model_validate(_check(answer).json())

    def resume_model(self, model: str, policy_version: int | None = None) -> ModelState:
        """Resume ``model``, its backends now serving ``policy_version``."""
        body = ResumeRequest(policy_version=policy_version).model_dump()
        answer = self._request("POST", f"/v1/llm/models/{model}/resume", json=body)
        return ModelState.model_validate(_check(answer).json())

    def status(self) -> dict[str, Any]:
        data: dict[str, Any] = _check(self._request("GET", "/v1/status")).json()
        return data


class AsyncRolloutClient:
    """The same API for asyncio trainers, with the same failover between nodes."""

    def __init__(
        self,
        url: str | Sequence[str],
        *,
        token: str | None = None,
        timeout: float = 60.0,
        retries: int = 3,
        verify: bool | str = True,
    ) -> None:
        self._urls, self._at = _urls(url), 0
        self._http = httpx.AsyncClient(
            headers=_headers(token),
            timeout=timeout + _LONG_POLL_S,
            transport=httpx.AsyncHTTPTransport(retries=retries, verify=_tls(verify)),
        )

    async def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        for tried in range(len(self._urls)):
            try:
                return await self._http.request(method, self._urls[self._at] + path, **kwargs)
            except httpx.TransportError:
                if tried == len(self._urls) - 1:
                    raise
                self._at = (self._at + 1) % len(self._urls)
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncRolloutClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def submit(self, request: JobRequest | dict[str, Any]) -> Accepted:
        answer = await self._request("POST", "/v1/jobs", json=_body(request))
        return Accepted.model_validate(_check(answer).json())

    async def submit_batch(self, requests: list[JobRequest | dict[str, Any]]) -> list[Accepted]:
        answer = await self._request(
            "POST", "/v1/jobs/batch", json={"jobs": [_body(r) for r in requests]}
        )
        return BatchAccepted.model_validate(_check(answer).json()).jobs

    async def get(self, job_id: str, *, wait: float = 0) -> JobView:
        answer = await self._request("GET", f"/v1/jobs/{job_id}", params={"wait": wait})
        return JobView.model_validate(_check(answer).json())

    async def list_jobs(self, query: JobQuery | None = None, **filters: Any) -> JobsPage:
        answer = await self._request("GET", "/v1/jobs", params=_query(query, filters))
        return JobsPage.model_validate(_check(answer).json())

    async def trajectory(self, job_id: str) -> Trajectory:
        answer = await self._request("GET", f"/v1/jobs/{job_id}/trajectory")
        return Trajectory.model_validate(_check(answer).json())

    async def wait(self, job_id: str, timeout: float | None = None) -> JobView:
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            job = await self.get(job_id, wait=_poll_for(end))
            if _settled(job, end):
                return job

    async def results(self, after: int = 0, *, limit: int = 100, wait: float = 0) -> ResultsPage:
        """One page of the results feed (long-polling up to ``wait`` for the first result)."""
        answer = await self._request(
            "GET", "/v1/results", params={"after": after, "limit": limit, "wait": wait}
        )
        return ResultsPage.model_validate(_check(answer).json())

    async def iter_results(
        self, after: int = 0, *, limit: int = 100, stop_after: int | None = None
    ) -> AsyncIterator[JobView]:
        """Finished jobs in completion order, as they come; ends after ``stop_after``."""
        seen = 0
        while stop_after is None or seen < stop_after:
            page = await self.results(after, limit=limit, wait=_LONG_POLL_S)
            after = page.next
            for job in page.results:
                yield job
                seen += 1
                if stop_after is not None and seen >= stop_after:
                    return

    async def cancel(self, job_id: str) -> JobView:
        answer = await self._request("DELETE", f"/v1/jobs/{job_id}")
        return JobView.model_validate(_check(answer).json())

    async def cancel_group(self, group_id: str) -> list[str]:
        answer = _check(await self._request("POST", f"/v1/groups/{group_id}/cancel"))
        return GroupCancelled.model_validate(answer.json()).cancelled

    async def register_backend(self, spec: BackendSpec | dict[str, Any]) -> BackendView:
        body = BackendSpec.model_validate(spec).model_dump(mode="json", exclude_none=True)
        answer = await self._request("POST", "/v1/llm/backends", json=body)
        return BackendView.model_validate(_check(answer).json())

    async def backends(self) -> list[BackendView]:
        answer = _check(await self._request("GET", "/v1/llm/backends")).json()
        return [BackendView.model_validate(b) for b in answer]

    async def remove_backend(self, backend_id: str) -> None:
        _check(await self._request("DELETE", f"/v1/llm/backends/{backend_id}"))

    async def pause_model(
        self,
        model: str,
        mode: PauseMode = "wait",
        *,
        admission: bool = False,
        timeout_s: float = 600.0,
    ) -> ModelState:
        """Pause ``model`` for a weight update; returns once its calls in flight are done."""
        body = PauseRequest(mode=mode, admission=admission, timeout_s=timeout_s)
        answer = await self._request(
            "POST", f"/v1/llm/models/{model}/pause", json=body.model_dump(), timeout=timeout_s + 30
        )
        return ModelState.model_validate(_check(answer).json())

    async def resume_model(self, model: str, policy_version: int | None = None) -> ModelState:
        """Resume ``model``, its backends now serving ``policy_version``."""
        body = ResumeRequest(policy_version=policy_version).model_dump()
        answer = await self._request("POST", f"/v1/llm/models/{model}/resume", json=body)
        return ModelState.model_validate(_check(answer).json())

    async def status(self) -> dict[str, Any]:
        data: dict[str, Any] = _check(await self._request("GET", "/v1/status")).json()
        return data
