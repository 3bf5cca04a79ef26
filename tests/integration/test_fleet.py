"""Three ``rollserve serve`` nodes on one PostgreSQL store: any node answers any call, a job
cancelled through one node stops on the node that runs it, a backend registered on one is used
by all, a SIGKILLed node's jobs finish on the others (each once), and a node that stops cleanly
hands its jobs over at once. Inference backends registered on one node serve them all. A
database restart under a node loses nothing."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from rollserve.fixtures.postgres import TempPostgres
from rollserve.testing.scripted import ScriptedLLMServer
from tests.integration.conftest import Server, register_backend

_NODE = {"lease_s": "2", "init_workers": "2", "run_workers": "2", "eval_workers": "1"}


@pytest.fixture
def fleet(tmp_path: Path, pg_url: str) -> Iterator[Callable[..., list[Server]]]:
    nodes: list[Server] = []

    def start(count: int, **settings: str) -> list[Server]:
        made = []
        for _ in range(count):
            index = len(nodes)
            env = {"store_url": pg_url, "node_id": f"node-{index}", **_NODE, **settings}
            node = Server(
                tmp_path / f"node-{index}" / "data",
                {f"ROLLSERVE_{k.upper()}": v for k, v in env.items()},
            )
            node.data_dir.mkdir(parents=True)
            nodes.append(node)
            made.append(node)
        for node in made:
            node.start()
        return made

    yield start
    for node in nodes:
        node.stop()


def _job(i: int, *commands: str, prefix: str = "j") -> dict[str, Any]:
    return {
        "job_id": f"{prefix}{i}",
        "task": {"task_id": f"{prefix}{i}", "kind": "echo", "prompt": f"p{i}"},
        "agent": {"name": "script", "commands": [*commands, f"printf %s p{i} > answer.txt"]},
    }


def _status(node: Server) -> dict[str, Any]:
    return httpx.get(f"{node.url}/v1/status", timeout=10).json()


def _until(check: Callable[[], bool], timeout: float = 30) -> None:
    end = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.1)


def test_any_node_answers_any_call_and_the_fleet_is_listed(
    fleet: Callable[..., list[Server]],
) -> None:
    a, b, c = fleet(3)
    jobs = [_job(i, "sleep 0.5") for i in range(12)]
    assert httpx.post(f"{a.url}/v1/jobs/batch", json={"jobs": jobs}).status_code == 202
    # Submitted through a, looked up through b, waited on through c: one store.
    views = [
        httpx.get(f"{c.url}/v1/jobs/j{i}", params={"wait": 60}, timeout=70).json()
        for i in range(12)
    ]
    assert [v["status"] for v in views] == ["completed"] * 12
    assert httpx.get(f"{b.url}/v1/jobs/j3").json()["result"]["reward"] == 1.0
    feed = httpx.get(f"{b.url}/v1/results", params={"limit": 100}).json()["results"]
    assert sorted(r["job_id"] for r in feed) == sorted(f"j{i}" for i in range(12))
    status = _status(c)
    listed = {n["node_id"]: n for n in status["nodes"]}
    assert sorted(listed) == ["node-0", "node-1", "node-2"] and status["node_id"] == "node-2"
    assert all(n["alive"] and n["workers"]["run"]["total"] == 2 for n in listed.values())
    assert status["jobs"] == {"completed": 12}  # the fleet's jobs, not the node's


def test_a_cancel_through_one_node_stops_the_job_where_it_runs(
    fleet: Callable[..., list[Server]],
) -> None:
    a, b = fleet(2)
    httpx.post(f"{a.url}/v1/jobs", json=_job(0, "sleep 600", prefix="long"))
    _until(lambda: httpx.get(f"{a.url}/v1/jobs/long0").json()["status"] == "running")
    runner = next(n for n in (a, b) if _status(n)["stages"]["run"]["active"] == 1)
    other = b if runner is a else a
    assert httpx.delete(f"{other.url}/v1/jobs/long0").status_code == 200
    view = httpx.get(f"{other.url}/v1/jobs/long0", params={"wait": 30}, timeout=40).json()
    assert view["status"] == "cancelled"
    _until(lambda: _status(runner)["live_sandboxes"] == 0)  # its sandbox is closed


def test_a_sigkilled_node_loses_no_job(
    fleet: Callable[..., list[Server]],
) -> None:
    a, b, c = fleet(3)
    jobs = [_job(i, "sleep 3") for i in range(12)]
    httpx.post(f"{a.url}/v1/jobs/batch", json={"jobs": jobs})
    _until(lambda: _status(b)["stages"]["run"]["active"] >= 1)
    b.kill()  # SIGKILL: its leases and its sandboxes' jobs must expire to others
    sandboxes = b.data_dir / "sandboxes"
    try:
        _until(lambda: not {n["node_id"]: n for n in _status(a)["nodes"]}["node-1"]["alive"])
        views = [
            httpx.get(f"{c.url}/v1/jobs/j{i}", params={"wait": 90}, timeout=100).json()
            for i in range(12)
        ]
        failed = {v["job_id"]: v.get("error") for v in views if v["status"] != "completed"}
        assert failed == {}
        assert max(v["attempts"] for v in views) == 2  # b's jobs ran again, once
        feed = httpx.get(f"{a.url}/v1/results", params={"limit": 100}).json()["results"]
        assert sorted(r["job_id"] for r in feed) == sorted(f"j{i}" for i in range(12))  # once
        assert list(sandboxes.iterdir())  # what the killed node had open
    finally:
        b.start()  # back on its data directory: nothing of the killed node is left
    assert not sandboxes.exists() or list(sandboxes.iterdir()) == []
    assert _status(b)["live_sandboxes"] == 0


def test_a_node_that_stops_hands_its_jobs_over_at_once(
    fleet: Callable[..., list[Server]],
) -> None:
    """Leases of 10 minutes: only the stopping node's hand-over lets the other take its jobs
    within the test's time."""
    first, second = fleet(2, lease_s="600")
    jobs = [_job(i, "sleep 600") for i in range(2)]
    httpx.post(f"{first.url}/v1/jobs/batch", json={"jobs": jobs})
    busy = lambda node: _status(node)["stages"]["run"]["active"]  # noqa: E731
    _until(lambda: busy(first) + busy(second) == 2)
    holder, survivor = (first, second) if busy(first) else (second, first)
    assert holder.proc is not None
    holder.proc.send_signal(signal.SIGTERM)  # what scancel sends first
    holder.proc.wait(timeout=30)
    _until(lambda: busy(survivor) == 2, timeout=60)
    views = [httpx.get(f"{survivor.url}/v1/jobs/j{i}").json() for i in range(2)]
    assert all(v["status"] == "running" for v in views)
    assert [n["node_id"] for n in _status(survivor)["nodes"]] == [
        "node-0" if survivor is first else "node-1"
    ]  # the stopped node left the fleet's list


def test_a_backend_registered_on_one_node_serves_them_all(
    fleet: Callable[..., list[Server]],
) -> None:
    """Registration, a pause, a new policy version and removal reach every node through the
    store; each node's jobs use the backend (health and load stay each node's own)."""
    first, second = fleet(2)
    with ScriptedLLMServer([{"content": "hello"}] * 8) as llm:
        register_backend(
            first, id="s", kind="openai", url=llm.url, model="scripted", policy_version=3
        )
        versions = lambda node: [  # noqa: E731
            b["policy_version"] for b in httpx.get(f"{node.url}/v1/llm/backends").json()
        ]
        _until(lambda: versions(second) == [3])
        task = {"task_id": "t", "kind": "keyword", "prompt": "Say hello.", "keywords": ["hello"]}
        agent = {"name": "tool", "max_turns": 1}
        jobs = [
            {"job_id": f"m{i}", "task": task, "model": "scripted", "agent": agent} for i in range(4)
        ]
        httpx.post(f"{second.url}/v1/jobs/batch", json={"jobs": jobs})
        views = [
            httpx.get(f"{second.url}/v1/jobs/m{i}", params={"wait": 60}, timeout=70).json()
            for i in range(4)
        ]
        assert [v["status"] for v in views] == ["completed"] * 4
        assert {v["result"]["max_policy_version"] for v in views} == {3}
        paused = lambda node: httpx.get(f"{node.url}/v1/llm/models/scripted").json()["paused"]  # noqa: E731
        httpx.post(f"{first.url}/v1/llm/models/scripted/pause", json={"mode": "wait"})
        _until(lambda: paused(second))  # a pause through one node holds them all
        resumed = httpx.post(
            f"{first.url}/v1/llm/models/scripted/resume", json={"policy_version": 4}
        )
        assert resumed.status_code == 200
        _until(lambda: versions(second) == [4] and not paused(second))
        assert httpx.delete(f"{second.url}/v1/llm/backends/s").status_code == 204
        _until(lambda: versions(first) == [])


def _one_model_call(job_id: str) -> dict[str, Any]:
    """A job whose episode is one call of the ``scripted`` model."""
    task = {"task_id": job_id, "kind": "keyword", "prompt": "Say hello.", "keywords": ["hello"]}
    agent = {"name": "tool", "max_turns": 1}
    return {"job_id": job_id, "task": task, "model": "scripted", "agent": agent}


def test_a_pause_through_one_node_waits_for_the_calls_of_every_node(
    fleet: Callable[..., list[Server]],
) -> None:
    """A ``wait`` pause sent to a node that runs nothing returns only once the call in flight
    on another node has ended, and says so; until then that node is named as pending."""
    with ScriptedLLMServer([{"content": "hello"}] * 2, delay_s=8) as llm:
        (runner,) = fleet(1)
        register_backend(runner, id="s", kind="openai", url=llm.url, model="scripted")
        httpx.post(f"{runner.url}/v1/jobs", json=_one_model_call("slow"))
        _until(lambda: len(llm.requests) == 1)  # the call is in flight on the runner
        (idle,) = fleet(1)
        state = lambda: httpx.get(f"{idle.url}/v1/llm/models/scripted").json()  # noqa: E731
        _until(lambda: len(_status(idle)["backends"]) == 1)
        pause = httpx.post(
            f"{idle.url}/v1/llm/models/scripted/pause",
            json={"mode": "wait", "timeout_s": 60},
            timeout=70,
        ).json()
        assert llm.served == 1  # the runner's call ended before the pause answered
        assert pause["paused"] and pause["in_flight"] == 0 and pause["nodes_pending"] == []
        assert state()["nodes_pending"] == []
        resumed = httpx.post(f"{idle.url}/v1/llm/models/scripted/resume", json={})
        assert resumed.status_code == 200 and not resumed.json()["paused"]
        view = httpx.get(f"{idle.url}/v1/jobs/slow", params={"wait": 60}, timeout=70).json()
        assert view["status"] == "completed"


def test_a_pause_names_the_nodes_still_running_calls(
    fleet: Callable[..., list[Server]],
) -> None:
    """A pause whose wait runs out answers with the calls still in flight and the node that
    runs them."""
    with ScriptedLLMServer([{"content": "hello"}] * 2, delay_s=15) as llm:
        runner, idle = fleet(2, init_workers="1")
        register_backend(runner, id="s", kind="openai", url=llm.url, model="scripted")
        _until(lambda: len(_status(idle)["backends"]) == 1)
        httpx.post(f"{runner.url}/v1/jobs", json=_one_model_call("slow"))
        _until(lambda: len(llm.requests) == 1)
        busy = next(n for n in (runner, idle) if _status(n)["stages"]["run"]["active"] == 1)
        other = idle if busy is runner else runner
        pause = httpx.post(
            f"{other.url}/v1/llm/models/scripted/pause",
            json={"mode": "wait", "timeout_s": 2},
            timeout=30,
        ).json()
        assert pause["paused"] and pause["in_flight"] == 1
        assert pause["nodes_pending"] == [_status(busy)["node_id"]]
        assert llm.served == 0
        httpx.post(f"{other.url}/v1/llm/models/scripted/resume", json={})


def test_a_database_restart_loses_nothing(tmp_path: Path, postgres: TempPostgres) -> None:
    """PostgreSQL is killed under a working node: the node says it is not ready (503, with
    the reason), refuses submits with a clear 503 and stores none of them; once the database
    is back it is ready again and every job finishes, once. (A database server of its own.)"""
    database = TempPostgres().start()
    node = Server(
        tmp_path / "node" / "data",
        {"ROLLSERVE_STORE_URL": database.create("restart"), "ROLLSERVE_LEASE_S": "3"},
    )
    node.data_dir.mkdir(parents=True)
    try:
        node.start()
        jobs = [_job(i, "sleep 2") for i in range(6)]
        httpx.post(f"{node.url}/v1/jobs/batch", json={"jobs": jobs})
        _until(lambda: _status(node)["stages"]["run"]["active"] >= 1)
        database.kill()
        ready = lambda: httpx.get(f"{node.url}/readyz", timeout=30)  # noqa: E731
        _until(lambda: ready().status_code == 503, timeout=60)
        assert ready().json()["error"]["code"] == "store_unavailable"
        refused = httpx.post(f"{node.url}/v1/jobs", json=_job(99), timeout=60)
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "store_unavailable"
        database.start()
        _until(lambda: ready().status_code == 200, timeout=60)
        views = [
            httpx.get(f"{node.url}/v1/jobs/j{i}", params={"wait": 90}, timeout=100).json()
            for i in range(6)
        ]
        assert [v["status"] for v in views] == ["completed"] * 6
        assert httpx.get(f"{node.url}/v1/jobs/j99").status_code == 404  # never half-stored
        feed = httpx.get(f"{node.url}/v1/results", params={"limit": 100}).json()["results"]
        assert sorted(r["job_id"] for r in feed) == sorted(f"j{i}" for i in range(6))
    finally:
        node.stop()
        database.close()
