"""``RolloutClient`` and ``AsyncRolloutClient``: the HTTP API v1 for trainers (httpx +
pydantic + ``rollserve.schema`` only; a trainer installs nothing of the server side). Both send
the calls of :mod:`rollserve.client.calls`; only the sending differs."""

from __future__ import annotations

import ssl
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any, TypeVar

import httpx

from rollserve.client import calls
from rollserve.client.calls import LONG_POLL_S, Call
from rollserve.schema.api import Accepted, JobQuery, JobsPage, ResultsPage, Trajectory
from rollserve.schema.backends import BackendSpec, BackendView, ModelState, PauseMode
from rollserve.schema.jobs import JobRequest, JobView
from rollserve.schema.status import NodeStatus

T = TypeVar("T")


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


def _headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


class RolloutClient:
    """A blocking client. ``url`` may list several nodes of one fleet: a call whose node does
    not answer (connection failures are retried ``retries`` times first) goes to the next.
    ``transport``: httpx's, instead of its HTTP transport (e.g. ``httpx.MockTransport``, or a
    WSGI or in-process one); ``retries`` and ``verify`` are then the transport's own business."""

    def __init__(
        self,
        url: str | Sequence[str],
        *,
        token: str | None = None,
        timeout: float = 60.0,
        retries: int = 3,
        verify: bool | str = True,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._urls, self._at = _urls(url), 0
        self._http = httpx.Client(
            headers=_headers(token),
            timeout=timeout + LONG_POLL_S,
            transport=transport or httpx.HTTPTransport(retries=retries, verify=_tls(verify)),
        )

    def _send(self, call: Call[T]) -> T:
        for tried in range(len(self._urls)):
            url = self._urls[self._at] + call.path
            try:
                response = self._http.request(call.method, url, **call.send_args())
            except httpx.TransportError:
                if tried == len(self._urls) - 1:
                    raise
                self._at = (self._at + 1) % len(self._urls)
                continue
            return call.answer(response)
        raise AssertionError("unreachable")

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RolloutClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def submit(self, request: JobRequest | dict[str, Any]) -> Accepted:
        return self._send(calls.submit(request))

    def submit_batch(self, requests: list[JobRequest | dict[str, Any]]) -> list[Accepted]:
        return self._send(calls.submit_batch(requests))

    def get(self, job_id: str, *, wait: float = 0) -> JobView:
        return self._send(calls.get(job_id, wait))

    def list_jobs(self, query: JobQuery | None = None, **filters: Any) -> JobsPage:
        """A page of jobs, filtered and sorted: ``list_jobs(status=["failed"], kind="swe")``."""
        return self._send(calls.list_jobs(query, filters))

    def trajectory(self, job_id: str) -> Trajectory:
        """The job's rollout turn by turn (a running job's turns so far)."""
        return self._send(calls.trajectory(job_id))

    def wait(self, job_id: str, timeout: float | None = None) -> JobView:
        """The job once finished (long-polling), or as it is when ``timeout`` passes."""
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            job = self.get(job_id, wait=calls.poll_for(end))
            if calls.settled(job, end):
                return job

    def results(self, after: int = 0, *, limit: int = 100, wait: float = 0) -> ResultsPage:
        """One page of the results feed (long-polling up to ``wait`` for the first result)."""
        return self._send(calls.results(after, limit, wait))

    def iter_results(
        self, after: int = 0, *, limit: int = 100, stop_after: int | None = None
    ) -> Iterator[JobView]:
        """Finished jobs in completion order, as they come; ends after ``stop_after``."""
        seen = 0
        while stop_after is None or seen < stop_after:
            page = self.results(after, limit=limit, wait=LONG_POLL_S)
            after = page.next
            for job in page.results:
                yield job
                seen += 1
                if stop_after is not None and seen >= stop_after:
                    return

    def cancel(self, job_id: str) -> JobView:
        return self._send(calls.cancel(job_id))

    def cancel_group(self, group_id: str) -> list[str]:
        return self._send(calls.cancel_group(group_id))

    def register_backend(self, spec: BackendSpec | dict[str, Any]) -> BackendView:
        return self._send(calls.register_backend(spec))

    def backends(self) -> list[BackendView]:
        return self._send(calls.backends())

    def remove_backend(self, backend_id: str) -> None:
        self._send(calls.remove_backend(backend_id))

    def pause_model(
        self,
        model: str,
        mode: PauseMode = "wait",
        *,
        admission: bool = False,
        timeout_s: float = 600.0,
    ) -> ModelState:
        """Pause ``model`` for a weight update; returns once its calls in flight are done."""
        return self._send(calls.pause_model(model, mode, admission, timeout_s))

    def resume_model(self, model: str, policy_version: int | None = None) -> ModelState:
        """Resume ``model``, its backends now serving ``policy_version``."""
        return self._send(calls.resume_model(model, policy_version))

    def status(self) -> NodeStatus:
        """The node's view of itself and of its fleet."""
        return self._send(calls.status())


class AsyncRolloutClient:
    """The same API for asyncio trainers, with the same failover between nodes;
    ``transport``: an httpx async transport (e.g. ``httpx.ASGITransport`` in process)."""

    def __init__(
        self,
        url: str | Sequence[str],
        *,
        token: str | None = None,
        timeout: float = 60.0,
        retries: int = 3,
        verify: bool | str = True,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._urls, self._at = _urls(url), 0
        self._http = httpx.AsyncClient(
            headers=_headers(token),
            timeout=timeout + LONG_POLL_S,
            transport=transport or httpx.AsyncHTTPTransport(retries=retries, verify=_tls(verify)),
        )

    async def _send(self, call: Call[T]) -> T:
        for tried in range(len(self._urls)):
            url = self._urls[self._at] + call.path
            try:
                response = await self._http.request(call.method, url, **call.send_args())
            except httpx.TransportError:
                if tried == len(self._urls) - 1:
                    raise
                self._at = (self._at + 1) % len(self._urls)
                continue
            return call.answer(response)
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncRolloutClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def submit(self, request: JobRequest | dict[str, Any]) -> Accepted:
        return await self._send(calls.submit(request))

    async def submit_batch(self, requests: list[JobRequest | dict[str, Any]]) -> list[Accepted]:
        return await self._send(calls.submit_batch(requests))

    async def get(self, job_id: str, *, wait: float = 0) -> JobView:
        return await self._send(calls.get(job_id, wait))

    async def list_jobs(self, query: JobQuery | None = None, **filters: Any) -> JobsPage:
        return await self._send(calls.list_jobs(query, filters))

    async def trajectory(self, job_id: str) -> Trajectory:
        return await self._send(calls.trajectory(job_id))

    async def wait(self, job_id: str, timeout: float | None = None) -> JobView:
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            job = await self.get(job_id, wait=calls.poll_for(end))
            if calls.settled(job, end):
                return job

    async def results(self, after: int = 0, *, limit: int = 100, wait: float = 0) -> ResultsPage:
        """One page of the results feed (long-polling up to ``wait`` for the first result)."""
        return await self._send(calls.results(after, limit, wait))

    async def iter_results(
        self, after: int = 0, *, limit: int = 100, stop_after: int | None = None
    ) -> AsyncIterator[JobView]:
        """Finished jobs in completion order, as they come; ends after ``stop_after``."""
        seen = 0
        while stop_after is None or seen < stop_after:
            page = await self.results(after, limit=limit, wait=LONG_POLL_S)
            after = page.next
            for job in page.results:
                yield job
                seen += 1
                if stop_after is not None and seen >= stop_after:
                    return

    async def cancel(self, job_id: str) -> JobView:
        return await self._send(calls.cancel(job_id))

    async def cancel_group(self, group_id: str) -> list[str]:
        return await self._send(calls.cancel_group(group_id))

    async def register_backend(self, spec: BackendSpec | dict[str, Any]) -> BackendView:
        return await self._send(calls.register_backend(spec))

    async def backends(self) -> list[BackendView]:
        return await self._send(calls.backends())

    async def remove_backend(self, backend_id: str) -> None:
        await self._send(calls.remove_backend(backend_id))

    async def pause_model(
        self,
        model: str,
        mode: PauseMode = "wait",
        *,
        admission: bool = False,
        timeout_s: float = 600.0,
    ) -> ModelState:
        """Pause ``model`` for a weight update; returns once its calls in flight are done."""
        return await self._send(calls.pause_model(model, mode, admission, timeout_s))

    async def resume_model(self, model: str, policy_version: int | None = None) -> ModelState:
        """Resume ``model``, its backends now serving ``policy_version``."""
        return await self._send(calls.resume_model(model, policy_version))

    async def status(self) -> NodeStatus:
        """The node's view of itself and of its fleet."""
        return await self._send(calls.status())
