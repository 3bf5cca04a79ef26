"""The client packages against a real server."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from rollserve.client import AsyncRolloutClient, RolloutClient
from rollserve.errors import RemoteError
from rollserve.testing.scripted import ScriptedLLMServer
from tests.integration.conftest import Server
from tests.servers import free_port


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
        assert set(client.status().stages) == {"init", "run", "eval"}


async def test_async_client(server_factory: Callable[..., Server]) -> None:
    server = server_factory()
    server.start()
    async with AsyncRolloutClient(server.url) as client:
        await client.submit_batch([_job(i) for i in range(2)])
        got = [job.job_id async for job in client.iter_results(stop_after=2)]
        assert sorted(got) == ["c0", "c1"]
        assert (await client.wait("c1")).result is not None
        with ScriptedLLMServer() as llm:
            spec = {"id": "s", "kind": "openai", "url": llm.url, "model": "scripted"}
            made = await client.register_backend(spec)
            assert made.id == "s" and [b.id for b in await client.backends()] == ["s"]
            await client.remove_backend("s")
            assert await client.backends() == [] or all(b.draining for b in await client.backends())


def test_submit_and_status_commands(server_factory: Callable[..., Server], tmp_path: Path) -> None:
    server = server_factory()
    server.start()
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(_job(i)) + "\n" for i in range(3)))
    out = tmp_path / "results.jsonl"
    cli = [sys.executable, "-m", "rollserve.cli.app"]
    done = subprocess.run(
        [*cli, "submit", str(tasks), "--server", server.url, "--wait", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    results = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["job_id"] for r in results] == ["c0", "c1", "c2"]
    assert [r["result"]["reward"] for r in results] == [1.0, 0.0, 1.0]
    status = subprocess.run(
        [*cli, "status", "--server", server.url], capture_output=True, text=True, timeout=60
    )
    assert json.loads(status.stdout)["jobs"] == {"completed": 3}
    again = subprocess.run(  # the same ids: nothing runs again, the stored results come back
        [*cli, "submit", str(tasks), "--server", server.url, "--wait", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 0 and "(0 new)" in again.stdout, again.stderr
    assert [json.loads(line) for line in out.read_text().splitlines()] == results
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"task": {"kind": "echo"}}\n')
    refused = subprocess.run(
        [*cli, "submit", str(bad), "--server", server.url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2 and "bad.jsonl:1" in refused.stderr


def test_the_client_fails_over_to_another_node(server_factory: Callable[..., Server]) -> None:
    """A node that does not answer (nothing listens at the first URL) is skipped; a job
    without an id gets one from the client, so that sending it again creates nothing new."""
    server = server_factory()
    server.start()
    dead = f"http://127.0.0.1:{free_port()}"
    job = {
        "task": {"task_id": "f", "kind": "echo", "prompt": "x"},
        "agent": {"name": "submit", "submission": "x"},
    }
    with RolloutClient([dead, server.url], retries=0) as client:
        accepted = client.submit(job)
        assert accepted.created and len(accepted.job_id) == 32
        assert client.wait(accepted.job_id, timeout=60).status == "completed"
    with RolloutClient([dead], retries=0) as alone, pytest.raises(httpx.ConnectError):
        alone.status()


async def test_the_async_client_fails_over_too(server_factory: Callable[..., Server]) -> None:
    server = server_factory()
    server.start()
    dead = f"http://127.0.0.1:{free_port()}"
    async with AsyncRolloutClient([dead, server.url], retries=0) as client:
        assert (await client.status()).node
        done = await client.submit_batch([_job(7)])
        assert [a.job_id for a in done] == ["c7"]
