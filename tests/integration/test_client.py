"""The client packages against a real server."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from rollserve.client import AsyncRolloutClient, RolloutClient
from rollserve.errors import RemoteError
from tests.integration.conftest import Server


def _job(i: int) -> dict[str, object]:
    return {
        "job_id": f"c{i}",
        "task": {"task_id": f"c{i}", "kind": "echo", "prompt": "x"},
        "agent": {"name": "submit", "submission": "x" if i % 2 == 0 else "y"},
    }


def test_sync_client(server_factory: Callable[..., Server]) -> None:
    server = server_factory()
    server.start()
    with RolloutClient(server.url) as client:
        accepted = client.submit_batch([_job(i) for i in range(4)])
        assert [a.job_id for a in accepted] == ["c0", "c1", "c2", "c3"]
        assert client.submit(_job(0)).created is False
        results = {job.job_id: job for job in client.iter_results(stop_after=4)}
        assert {k: v.result.reward for k, v in results.items() if v.result} == {
            "c0": 1.0,
            "c1": 0.0,
            "c2": 1.0,
            "c3": 0.0,
        }
        assert client.wait("c3").status == "completed"
        with pytest.raises(RemoteError) as info:
            client.get("nope")
        assert (info.value.status, info.value.remote_code) == (404, "job_not_found")
        assert set(client.status()["stages"]) == {"init", "run", "eval"}


async def test_async_client(server_factory: Callable[..., Server]) -> None:
    server = server_factory()
    server.start()
    async with AsyncRolloutClient(server.url) as client:
        await client.submit_batch([_job(i) for i in range(2)])
        got = [job.job_id async for job in client.iter_results(stop_after=2)]
        assert sorted(got) == ["c0", "c1"]
        assert (await client.wait("c1")).result is not None
