"""Multi-turn rollouts through the HTTP API against model servers: text mode against the
scripted server (a test double that replays given assistant turns), cancellation of a job whose
model call is in flight."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from rollserve.testing.scripted import ScriptedLLMServer
from tests.integration.conftest import Server
from tests.servers import LlmServer

_MATH = {"task_id": "six-sevens", "kind": "math", "prompt": "What is 6*7?", "answer": "42"}
_SOLVE = [
    {
        "content": "Let me compute it.",
        "tool_calls": [{"name": "bash", "arguments": {"command": "echo $((6*7))"}}],
    },
    {"content": "", "tool_calls": [{"name": "submit", "arguments": {"answer": "42"}}]},
]


def _register(http: httpx.Client, **spec: Any) -> dict[str, Any]:
    answer = http.post("/v1/llm/backends", json=spec)
    assert answer.status_code == 201, answer.text
    body: dict[str, Any] = answer.json()
    return body


@pytest.mark.parametrize(("kind", "native"), [("openai", True), ("vllm", False)])
def test_text_mode_math_rollout(
    server_factory: Callable[..., Server], kind: str, native: bool
) -> None:
    server = server_factory()
    server.start()
    with (
        ScriptedLLMServer(_SOLVE, native_tool_calls=native) as llm,
        httpx.Client(base_url=server.url, timeout=60) as http,
    ):
        _register(http, id="s", kind=kind, url=llm.url, model="scripted", policy_version=7)
        job = http.post("/v1/jobs", json={"task": _MATH, "model": "scripted"}).json()
        done = http.get(f"/v1/jobs/{job['job_id']}", params={"wait": 60}, timeout=70).json()
        assert done["status"] == "completed", done
        result = done["result"]
        assert result["reward"] == 1.0 and result["exit_reason"] == "submitted"
        assert result["turns"] == 2 and result["tokens"] is None
        roles = [m["role"] for m in result["messages"]]
        assert roles == ["system", "user", "assistant", "tool", "assistant", "tool"]
        assert result["messages"][3]["content"].startswith("42")  # the bash tool's output
        assert result["messages"][2]["tool_calls"][0]["function"]["name"] == "bash"
        chats = [body for path, body in llm.requests if path.endswith("/chat/completions")]
        assert len(chats) == 2
        assert [t["function"]["name"] for t in chats[0]["tools"]] == ["bash", "submit"]
        assert chats[1]["messages"][-1]["role"] == "tool"  # the observation went back


def test_cancel_aborts_the_model_call_in_flight(server_factory: Callable[..., Server]) -> None:
    server = server_factory()
    server.start()
    with (
        ScriptedLLMServer(_SOLVE, delay_s=60) as llm,
        httpx.Client(base_url=server.url, timeout=60) as http,
    ):
        _register(http, id="slow", kind="openai", url=llm.url, model="scripted")
        job = http.post("/v1/jobs", json={"task": _MATH, "model": "scripted"}).json()
        end = time.monotonic() + 30
        while not any(p.endswith("/chat/completions") for p, _ in llm.requests):
            assert time.monotonic() < end, "the model was never called"
            time.sleep(0.05)
        [backend] = http.get("/v1/llm/backends").json()
        assert backend["in_flight"] == 1
        cancelled = http.delete(f"/v1/jobs/{job['job_id']}").json()
        done = http.get(f"/v1/jobs/{job['job_id']}", params={"wait": 10}, timeout=20).json()
        assert done["status"] == "cancelled", (cancelled, done)
        [backend] = http.get("/v1/llm/backends").json()
        assert backend["in_flight"] == 0  # the request was dropped, its slot freed
        assert http.get("/v1/status").json()["live_sandboxes"] == 0
        llm.kill()  # its handler would sleep on for the dropped request


def test_jobs_wait_for_a_backend_then_fail_clearly(server_factory: Callable[..., Server]) -> None:
    server = server_factory(llm_wait_s="1", max_attempts="1")
    server.start()
    with httpx.Client(base_url=server.url, timeout=60) as http:
        job = http.post("/v1/jobs", json={"task": _MATH, "model": "nobody"}).json()
        done = http.get(f"/v1/jobs/{job['job_id']}", params={"wait": 30}, timeout=40).json()
        assert done["status"] == "failed" and done["result"] is None
        assert done["error"]["code"] == "backend_unavailable"
        assert "nobody" in done["error"]["message"]


_TINY_AGENT = {"name": "tool", "max_turns": 3, "end_without_tool_call": False}


def test_token_mode_math_rollout_with_the_tiny_model(
    server_factory: Callable[..., Server],
    tiny_model: Path,
    llm_server_factory: Callable[[Path, str], LlmServer],
) -> None:
    server = server_factory()
    server.start()
    llm = llm_server_factory(tiny_model, "tiny")
    with httpx.Client(base_url=server.url, timeout=60) as http:
        _register(
            http,
            id="tiny",
            kind="vllm",
            url=llm.url,
            model="tiny",
            tokenizer=str(tiny_model),
            policy_version=3,
        )
        request = {
            "task": _MATH,
            "model": "tiny",
            "agent": _TINY_AGENT,
            "sampling": {"max_tokens": 16, "seed": 5},
        }
        job = http.post("/v1/jobs", json=request).json()
        done = http.get(f"/v1/jobs/{job['job_id']}", params={"wait": 120}, timeout=130).json()
        assert done["status"] == "completed", done
        result = done["result"]
        assert result["reward"] == 0.0  # the tiny model does not know arithmetic
        assert result["evaluation"]["correct"] is False
        assert result["exit_reason"] == "max_turns" and result["turns"] == 3
        tokens = result["tokens"]
        assert len(tokens["response_ids"]) == len(tokens["response_mask"])
        assert len(tokens["response_ids"]) == len(tokens["response_logprobs"])
        assert [(t["backend_id"], t["policy_version"]) for t in tokens["turns"]] == [
            ("tiny", 3)
        ] * 3
        assert done["timing"]["run_s"] > 0 and done["timing"]["eval_s"] > 0


def test_a_killed_backend_fails_over_mid_rollout(
    server_factory: Callable[..., Server],
    tiny_model: Path,
    llm_server_factory: Callable[[Path, str], LlmServer],
) -> None:
    server = server_factory(llm_health_interval_s="60")  # ejection by the failed call itself
    server.start()
    first, second = llm_server_factory(tiny_model, "tiny"), llm_server_factory(tiny_model, "tiny")
    with httpx.Client(base_url=server.url, timeout=60) as http:
        for backend_id, llm in (("a", first), ("b", second)):
            _register(
                http,
                id=backend_id,
                kind="vllm",
                url=llm.url,
                model="tiny",
                tokenizer=str(tiny_model),
            )
        request = {
            "task": _MATH,
            "model": "tiny",
            "agent": {**_TINY_AGENT, "max_turns": 10},
            "sampling": {"max_tokens": 16, "seed": 5},
        }
        ids = [http.post("/v1/jobs", json=request).json()["job_id"] for _ in range(4)]
        end = time.monotonic() + 60
        while {b["id"]: b["served"] for b in http.get("/v1/llm/backends").json()}["a"] < 3:
            assert time.monotonic() < end, "backend a was never used"
            time.sleep(0.05)
        first.kill()
        jobs = [http.get(f"/v1/jobs/{i}", params={"wait": 120}, timeout=130).json() for i in ids]
        assert [j["status"] for j in jobs] == ["completed"] * 4, jobs
        assert [j["attempts"] for j in jobs] == [1] * 4  # the turn failed over, not the job
        used = [{t["backend_id"] for t in j["result"]["tokens"]["turns"]} for j in jobs]
        assert {"a", "b"} in used  # a rollout that started on a finished on b
        backends = {b["id"]: b for b in http.get("/v1/llm/backends").json()}
        assert backends["a"]["healthy"] is False and backends["a"]["last_error"]
        assert backends["b"]["healthy"] is True


def test_an_episode_that_hits_the_turn_limit(server_factory: Callable[..., Server]) -> None:
    server = server_factory()
    server.start()
    busy = {"content": "", "tool_calls": [{"name": "bash", "arguments": {"command": "echo busy"}}]}
    with (
        ScriptedLLMServer([busy] * 3, native_tool_calls=True) as llm,
        httpx.Client(base_url=server.url, timeout=60) as http,
    ):
        _register(http, id="s", kind="openai", url=llm.url, model="scripted")
        request = {"task": _MATH, "model": "scripted", "agent": {"name": "tool", "max_turns": 3}}
        job = http.post("/v1/jobs", json=request).json()
        done = http.get(f"/v1/jobs/{job['job_id']}", params={"wait": 60}, timeout=70).json()
        assert done["status"] == "completed", done
        result = done["result"]
        assert result["exit_reason"] == "max_turns" and result["turns"] == 3
        assert result["reward"] == 0.0 and result["evaluation"]["correct"] is False
        assert llm.turns_left == 0 and len(llm.requests) == 3
