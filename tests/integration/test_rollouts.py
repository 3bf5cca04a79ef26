"""Multi-turn rollouts through the HTTP API against model servers: text mode against the
scripted server (a test double that replays given assistant turns), cancellation of a job whose
model call is in flight."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from rollserve.testing.scripted import ScriptedLLMServer
from tests.integration.conftest import Server

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
        _register(http, id="s", kind=kind, url=llm.url, model="scripted", policy_version="p7")
        job = http.post("/v1/jobs", json={"task": _MATH, "model": "scripted"}).json()
        done = http.get(f"/v1/jobs/{job['job_id']}", params={"wait": 60}).json()
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
        done = http.get(f"/v1/jobs/{job['job_id']}", params={"wait": 10}).json()
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
        done = http.get(f"/v1/jobs/{job['job_id']}", params={"wait": 30}).json()
        assert done["status"] == "failed" and done["result"] is None
        assert done["error"]["code"] == "backend_unavailable"
        assert "nobody" in done["error"]["message"]
