"""The blocking and the asyncio client send the same calls (one core), through any httpx
transport; ``status()`` is typed, and reading it as a dict still works, with a warning."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from rollserve.client import AsyncRolloutClient, RolloutClient
from rollserve.errors import RemoteError
from rollserve.schema.status import NodeStatus

STATUS: dict[str, Any] = {
    "node": "n1-abc",
    "node_id": "n1",
    "nodes": [
        {"node_id": "n1", "owner": "n1-abc", "alive": True, "started": 1.0, "seen": 2.0, "load": 3}
    ],
    "uptime_s": 5.0,
    "not_ready": None,
    "stages": {"init": {"queued": 1, "active": 0, "workers": 2}},
    "jobs": {"completed": 4},
    "results_cursor": 9,
    "live_sandboxes": 0,
    "figures": {
        "stage_seconds": {"run": {"buckets": [["1.0", 2], ["+Inf", 3]], "sum": 4.5}},
        "throughput": {"run": [[60, 2]]},
        "throughput_bucket_s": 60,
        "jobs_ended": [{"status": "completed", "exit_reason": "submitted", "count": 4}],
    },
    "backends": [],
    "paused_models": [],
}


class Server:
    """A fake node behind httpx's mock transport, keeping what it was sent."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        self.seen.append((request.method, request.url.path, body))
        if request.url.path == "/v1/status":
            return httpx.Response(200, json=STATUS)
        if request.url.path == "/v1/jobs" and request.method == "POST":
            return httpx.Response(
                202, json={"job_id": body["job_id"], "status": "queued", "created": True}
            )
        error = {"code": "job_not_found", "message": "no job 'x'", "details": {"job_id": "x"}}
        return httpx.Response(404, json={"error": error})


JOB = {"task": {"task_id": "t", "kind": "math", "prompt": "1+1", "answer": "2"}}


def test_the_blocking_client_through_a_transport() -> None:
    server = Server()
    with RolloutClient("http://node", transport=httpx.MockTransport(server)) as client:
        status = client.status()
        accepted = client.submit(JOB)
        with pytest.raises(RemoteError, match="no job 'x'") as missing:
            client.get("x")
    assert isinstance(status, NodeStatus)
    assert (status.results_cursor, status.nodes[0].model_extra) == (9, {"load": 3})
    assert status.figures.stage_seconds["run"].buckets == [("1.0", 2), ("+Inf", 3)]
    assert accepted.created and len(accepted.job_id) == 32  # an id given by the client
    assert (missing.value.status, missing.value.remote_code) == (404, "job_not_found")
    assert [(m, p) for m, p, _ in server.seen] == [
        ("GET", "/v1/status"),
        ("POST", "/v1/jobs"),
        ("GET", "/v1/jobs/x"),
    ]


async def test_the_async_client_sends_the_same_calls() -> None:
    blocking, asynchronous = Server(), Server()
    with RolloutClient("http://node", transport=httpx.MockTransport(blocking)) as client:
        client.submit({**JOB, "job_id": "j"})
        client.status()
    async with AsyncRolloutClient(
        "http://node", transport=httpx.MockTransport(asynchronous)
    ) as aclient:
        await aclient.submit({**JOB, "job_id": "j"})
        assert (await aclient.status()) == NodeStatus.model_validate(STATUS)
        with pytest.raises(RemoteError, match="no job 'x'"):
            await aclient.cancel("x")
    assert asynchronous.seen[:2] == blocking.seen
    assert asynchronous.seen[2][:2] == ("DELETE", "/v1/jobs/x")


def test_reading_the_status_as_a_dict_is_deprecated() -> None:
    status = NodeStatus.model_validate(STATUS)
    with pytest.warns(DeprecationWarning, match=r"status\(\)\.jobs"):
        assert status["jobs"] == {"completed": 4}
