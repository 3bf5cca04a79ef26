"""The HTTP API v1 against a real server process."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from rollserve.testing.scripted import ScriptedLLMServer
from tests.integration.conftest import Server


def _echo(prompt: str, **task: Any) -> dict[str, Any]:
    return {
        "task": {"task_id": prompt, "kind": "echo", "prompt": prompt, **task},
        "agent": {"name": "script", "commands": [f"printf %s {prompt} > answer.txt"]},
    }


def test_submit_wait_and_results_feed(server_factory: Callable[..., Server]) -> None:
    server = server_factory()
    server.start()
    with httpx.Client(base_url=server.url, timeout=60) as http:
        accepted = http.post("/v1/jobs", json=_echo("one"))
        assert accepted.status_code == 202
        job_id = accepted.json()["job_id"]
        batch = http.post(
            "/v1/jobs/batch",
            json={
                "jobs": [{**_echo(f"g{i}"), "group_id": "grp", "job_id": f"g{i}"} for i in range(3)]
            },
        )
        assert batch.status_code == 202 and len(batch.json()["jobs"]) == 3
        done = http.get(f"/v1/jobs/{job_id}", params={"wait": 30}, timeout=40).json()
        assert done["status"] == "completed" and done["result"]["reward"] == 1.0
        seen: list[str] = []
        cursor = 0
        end = time.monotonic() + 60
        while len(seen) < 4 and time.monotonic() < end:
            page = http.get("/v1/results", params={"after": cursor, "wait": 5}).json()
            seen += [r["job_id"] for r in page["results"]]
            cursor = page["next"]
        assert sorted(seen) == sorted([job_id, "g0", "g1", "g2"])
        status = http.get("/v1/status").json()
        assert set(status["stages"]) == {"init", "run", "eval"}
        assert [(n["node_id"], n["alive"]) for n in status["nodes"]] == [(status["node_id"], True)]
        metrics = http.get("/metrics").text
        node = status["node_id"]
        assert f'rollserve_jobs{{node="{node}",status="completed"}} 4.0' in metrics
        assert f'rollserve_fleet_nodes{{node="{node}"}} 1.0' in metrics
        # what this node did: each stage's durations, and how its jobs ended
        for stage in ("init", "run", "eval"):
            assert f'rollserve_stage_seconds_count{{node="{node}",stage="{stage}"}} 4.0' in metrics
            inf = f'rollserve_stage_seconds_bucket{{le="+Inf",node="{node}",stage="{stage}"}} 4.0'
            assert inf in metrics
        ended = 'rollserve_jobs_ended_total{exit_reason="submitted",node="%s",status="completed"}'
        assert f"{ended % node} 4.0" in metrics


def test_errors_are_json_with_fitting_statuses(server_factory: Callable[..., Server]) -> None:
    server = server_factory(max_queued="2")
    server.start()
    with httpx.Client(base_url=server.url, timeout=30) as http:
        bad = http.post("/v1/jobs", json={"task": {"kind": "echo"}})
        assert bad.status_code == 422 and "task.task_id" in bad.json()["error"]["message"]
        unknown = http.post("/v1/jobs", json={"task": {"task_id": "x", "kind": "nope"}})
        assert unknown.status_code == 400
        known = "known: code, echo, harbor, keyword, lookup, math, swe"
        assert known in unknown.json()["error"]["message"]
        missing = http.get("/v1/jobs/nope")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "job_not_found"
        slow = {**_echo("s"), "agent": {"name": "script", "commands": ["sleep 30"]}}
        assert (
            http.post(
                "/v1/jobs/batch",
                json={"jobs": [{**slow, "job_id": "s1"}, {**slow, "job_id": "s2"}]},
            ).status_code
            == 202
        )
        full = http.post("/v1/jobs", json={**slow, "job_id": "s3"})
        assert full.status_code == 429 and full.headers["retry-after"]
        cancelled = http.delete("/v1/jobs/s1").json()
        assert cancelled["job_id"] == "s1"
        assert http.post("/v1/groups/none/cancel").json()["cancelled"] == []


def test_bearer_token(server_factory: Callable[..., Server]) -> None:
    server = server_factory(api_token="sesame")
    server.start()
    assert httpx.get(f"{server.url}/v1/status").status_code == 401
    ok = httpx.get(f"{server.url}/v1/status", headers={"Authorization": "Bearer sesame"})
    assert ok.status_code == 200
    assert httpx.get(f"{server.url}/healthz").status_code == 200
    assert httpx.get(f"{server.url}/readyz").status_code == 200
    assert httpx.get(f"{server.url}/metrics").status_code == 401


def test_backends_are_checked_kept_across_restarts_and_removed(
    server_factory: Callable[..., Server], tiny_model: Path
) -> None:
    server = server_factory()
    server.start()
    llm = ScriptedLLMServer(model="m").start()
    with httpx.Client(base_url=server.url, timeout=30) as http:
        spec = {"id": "b1", "kind": "vllm", "url": llm.url + "/", "model": "m"}
        made = http.post("/v1/llm/backends", json=spec)
        assert made.status_code == 201 and made.json()["url"] == llm.url
        refused = {
            "url": {**spec, "url": "http://127.0.0.1:9/v1"},  # nothing listens
            "model": {**spec, "model": "other"},  # not served there
            "tokenizer": {**spec, "tokenizer": "/nonexistent"},
            "kind": {**spec, "kind": "openai", "tokenizer": str(tiny_model)},  # no token mode
        }
        for field, body in refused.items():
            answer = http.post("/v1/llm/backends", json={**body, "id": "x"})
            assert answer.status_code == 422, (field, answer.text)
            assert answer.json()["error"]["details"]["field"] in (field, "tokenizer"), answer.text
        no_template = Path(str(tiny_model) + "-plain")
        shutil.copytree(tiny_model, no_template)
        config = json.loads((no_template / "tokenizer_config.json").read_text())
        config.pop("chat_template", None)
        (no_template / "tokenizer_config.json").write_text(json.dumps(config))
        (no_template / "chat_template.jinja").unlink(missing_ok=True)
        # The first tokenizer this server loads: transformers' import takes ~9 s on an idle
        # machine here, several times that beside the rest of the suite.
        plain = http.post(
            "/v1/llm/backends", json={**spec, "tokenizer": str(no_template)}, timeout=120
        )
        assert plain.status_code == 422 and "no chat template" in plain.text
    server.stop()
    llm.stop()
    server.start()
    with httpx.Client(base_url=server.url, timeout=30) as http:
        assert [b["id"] for b in http.get("/v1/llm/backends").json()] == ["b1"]
        assert [b["id"] for b in http.get("/v1/status").json()["backends"]] == ["b1"]
        assert http.delete("/v1/llm/backends/b1").status_code == 204
        gone = http.delete("/v1/llm/backends/b1")
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "backend_not_found"
        assert http.get("/v1/llm/backends").json() == []
