"""The asynchronous-RL contract through the HTTP API, against the scripted server (a test
double that replays given turns): a rollout that falls behind its ``max_staleness`` ends
``stale``; a pause longer than a job's run timeout does not time it out; an admission pause
holds new jobs; pause and resume bodies are validated."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx

from rollserve.testing.scripted import ScriptedLLMServer
from tests.integration.conftest import Server, register_backend

_AGENT = {"name": "tool", "max_turns": 3, "end_without_tool_call": False}


def _job(job_id: str, **fields: Any) -> dict[str, Any]:
    task = {"task_id": job_id, "kind": "keyword", "prompt": "Say hello.", "keywords": ["hello"]}
    return {"job_id": job_id, "task": task, "model": "scripted", "agent": _AGENT, **fields}


def _setup(server: Server, llm: ScriptedLLMServer) -> httpx.Client:
    server.start()
    http = httpx.Client(base_url=server.url, timeout=60)
    register_backend(server, id="s", kind="openai", url=llm.url, model="scripted", policy_version=0)
    return http


def _until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def test_a_rollout_behind_its_bound_ends_stale(server_factory: Callable[..., Server]) -> None:
    with ScriptedLLMServer([{"content": "hello"}] * 6, delay_s=0.3) as llm:
        http = _setup(server_factory(), llm)
        strict = _job("strict", max_staleness=0)
        lenient = _job("lenient", max_staleness=1)
        assert http.post("/v1/jobs/batch", json={"jobs": [strict, lenient]}).status_code == 202
        _until(lambda: len(llm.requests) >= 2)  # both have a turn of version 0 in flight
        resumed = http.post("/v1/llm/models/scripted/resume", json={"policy_version": 1})
        assert resumed.json()["policy_version"] == 1

        stale = http.get("/v1/jobs/strict", params={"wait": 60}, timeout=70).json()
        assert stale["status"] == "stale", stale
        assert stale["error"]["code"] == "stale" and stale["result"] is None
        assert stale["error"]["details"] == {
            "min_policy_version": 0,
            "max_policy_version": 0,
            "newest": 1,
            "max_staleness": 0,
        }
        done = http.get("/v1/jobs/lenient", params={"wait": 60}, timeout=70).json()
        assert done["status"] == "completed", done
        result = done["result"]
        assert (result["min_policy_version"], result["max_policy_version"]) == (0, 1)
        feed = http.get("/v1/results").json()["results"]
        assert {(r["job_id"], r["status"]) for r in feed} == {
            ("strict", "stale"),
            ("lenient", "completed"),
        }
        assert http.get("/v1/status").json()["jobs"] == {"stale": 1, "completed": 1}


def test_a_pause_longer_than_the_run_timeout_times_nothing_out(
    server_factory: Callable[..., Server],
) -> None:
    with ScriptedLLMServer([{"content": "hello"}] * 3, delay_s=0.2) as llm:
        http = _setup(server_factory(llm_health_interval_s="0.2"), llm)
        job = _job("patient", timeouts={"run_s": 1.5})
        assert http.post("/v1/jobs", json=job).status_code == 202
        _until(lambda: len(llm.requests) >= 1)
        paused = http.post("/v1/llm/models/scripted/pause", json={"mode": "wait"}).json()
        assert paused["paused"] and paused["in_flight"] == 0
        llm.kill()  # the server is down during the update: no health check ejects it
        time.sleep(2.5)
        backend = http.get("/v1/llm/backends").json()[0]
        assert backend["healthy"] and backend["paused"]
        status = http.get("/v1/status").json()
        assert [m["model"] for m in status["paused_models"]] == ["scripted"]
        assert http.get("/v1/jobs/patient").json()["status"] == "running"
        with ScriptedLLMServer([{"content": "hello"}] * 2, delay_s=0.2) as again:
            spec = {"id": "s", "kind": "openai", "url": again.url, "model": "scripted"}
            assert (
                http.post("/v1/llm/backends", json={**spec, "policy_version": 1}).status_code == 201
            )
            http.post("/v1/llm/models/scripted/resume", json={})
            done = http.get("/v1/jobs/patient", params={"wait": 60}, timeout=70).json()
        assert done["status"] == "completed", done
        assert done["result"]["exit_reason"] == "max_turns"  # not timeout
        assert done["timing"]["run_s"] > 2.5
        assert (done["result"]["min_policy_version"], done["result"]["max_policy_version"]) == (
            0,
            1,
        )


def test_an_admission_pause_holds_new_jobs(server_factory: Callable[..., Server]) -> None:
    with ScriptedLLMServer([{"content": "hello"}] * 3) as llm:
        http = _setup(server_factory(), llm)
        paused = http.post("/v1/llm/models/scripted/pause", json={"admission": True}).json()
        assert paused["admission_paused"]
        assert http.post("/v1/jobs", json=_job("held")).status_code == 202
        time.sleep(1.0)
        assert http.get("/v1/jobs/held").json()["status"] in ("queued", "initializing")
        assert llm.requests == []
        http.post("/v1/llm/models/scripted/resume", json={})
        done = http.get("/v1/jobs/held", params={"wait": 60}, timeout=70).json()
        assert done["status"] == "completed", done
        assert done["timing"]["queued_s"] >= 1.0  # held in the queue, not in a stage


def test_pause_and_resume_bodies_are_validated(server_factory: Callable[..., Server]) -> None:
    with ScriptedLLMServer([]) as llm:
        http = _setup(server_factory(), llm)
        wrong = http.post("/v1/llm/models/scripted/pause", json={"mode": "sleep"})
        assert wrong.status_code == 422 and "mode" in wrong.text
        named = http.post("/v1/llm/models/scripted/resume", json={"policy_version": "step-2"})
        assert named.status_code == 422 and "non-negative integer" in named.text
        older = http.post("/v1/llm/models/scripted/resume", json={"policy_version": 0})
        assert older.status_code == 200
        backend = {"kind": "openai", "url": llm.url, "model": "scripted", "policy_version": "v2"}
        refused = http.post("/v1/llm/backends", json=backend)
        assert refused.status_code == 422 and "policy_version" in refused.text
        state = http.get("/v1/llm/models/scripted").json()
        assert state == {
            "model": "scripted",
            "paused": False,
            "mode": None,
            "admission_paused": False,
            "policy_version": 0,
            "in_flight": 0,
            "nodes_pending": [],
            "aborted": 0,
            "paused_s": 0.0,
        }
