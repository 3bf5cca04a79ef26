"""The viewer's API against a real server, real sandboxes and the scripted model server (a
test double replaying given turns): ``GET /v1/jobs`` filters and pages, a running job's turns
appear as its episode goes, and a finished job's trajectory holds each turn's tool runs,
backend, version, latency and, in token mode, the text of every token."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from rollserve.client import RolloutClient
from rollserve.testing.scripted import Hold, ScriptedLLMServer
from tests.integration.conftest import Server

_MATH = {"kind": "math", "prompt": "What is 6*7?", "answer": "42"}
_SOLVE = [
    {
        "content": "Let me compute it.",
        "tool_calls": [{"name": "bash", "arguments": {"command": "echo $((6*7)); (exit 3)"}}],
    },
    {"content": "", "tool_calls": [{"name": "submit", "arguments": {"answer": "42"}}]},
]


def _register(http: httpx.Client, **spec: Any) -> None:
    answer = http.post("/v1/llm/backends", json=spec)
    assert answer.status_code == 201, answer.text


def test_a_running_job_shows_its_turns_and_the_finished_one_each_turns_details(
    server_factory: Callable[..., Server],
) -> None:
    server = server_factory()
    server.start()
    second_turn = threading.Event()  # held until the test has seen the first

    def hold_the_second(path: str, body: dict[str, Any], answer: dict[str, Any]) -> Any:
        return Hold(second_turn) if llm.served > 1 else answer

    with (
        ScriptedLLMServer(_SOLVE, delay_s=1.0, rewrite=hold_the_second) as llm,
        httpx.Client(base_url=server.url, timeout=60) as http,
        RolloutClient(server.url) as client,
    ):
        _register(http, id="s", kind="openai", url=llm.url, model="scripted", policy_version=7)
        task = {"task_id": "six", **_MATH}
        http.post("/v1/jobs", json={"job_id": "live", "task": task, "model": "scripted"})
        seen: list[dict[str, Any]] = []
        end = time.monotonic() + 30
        while time.monotonic() < end:
            now = http.get("/v1/jobs/live/trajectory").json()
            if now["live"] and now["turns"]:
                seen.append(now)
                break
            time.sleep(0.05)
        second_turn.set()
        assert seen, "the running job never showed a turn"
        [first] = seen[0]["turns"]
        assert [m["role"] for m in seen[0]["prelude"]] == ["system", "user"]
        assert first["messages"][1]["content"].startswith("42")
        assert first["tools"][0]["exit_code"] == 3

        assert client.wait("live", timeout=60).status == "completed"
        done = client.trajectory("live")
        assert not done.live and done.reward == 1.0 and done.exit_reason == "submitted"
        assert (done.kind, done.task_id, done.model) == ("math", "six", "scripted")
        assert [m.role for m in done.prelude] == ["system", "user"]
        assert [t.index for t in done.turns] == [1, 2]
        bash, submit = done.turns
        assert bash.messages[0].tool_calls is not None
        call = bash.messages[0].tool_calls[0]
        assert call.name == "bash" and call.parsed_arguments() == {
            "command": "echo $((6*7)); (exit 3)"
        }
        [run] = bash.tools
        assert (run.name, run.exit_code, run.timed_out, run.tool_call_id) == (
            "bash",
            3,
            False,
            call.id,
        )
        assert bash.messages[1].role == "tool" and bash.messages[1].tool_call_id == call.id
        assert bash.info is not None and submit.info is not None
        assert (bash.info.backend_id, bash.info.policy_version) == ("s", 7)
        assert bash.info.latency_s is not None and bash.info.latency_s >= 1.0  # the delay
        assert submit.started_s is not None and submit.started_s > 1.0
        assert done.created is not None and done.finished is not None
        assert done.timing.run_s > 0 and done.tokens is None and done.token_text is None

        timed = http.get("/v1/jobs/live/trajectory").headers["server-timing"]
        assert timed.startswith("app;dur=") and float(timed.partition("dur=")[2]) > 0
        missing = http.get("/v1/jobs/nothing/trajectory")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "job_not_found"


def test_the_jobs_list_filters_sorts_and_pages(server_factory: Callable[..., Server]) -> None:
    server = server_factory()
    server.start()
    jobs = [
        {
            "job_id": f"j{i}",
            "group_id": "g" if i < 3 else None,
            "task": {"task_id": f"t{i}", **_MATH},
            "agent": {"name": "submit", "submission": "42" if i % 2 == 0 else "41"},
        }
        for i in range(5)
    ]
    jobs.append(
        {
            "job_id": "echo",
            "task": {"task_id": "e", "kind": "echo", "prompt": "hi"},
            "agent": {"name": "submit", "submission": "hi"},
        }
    )
    with RolloutClient(server.url) as client, httpx.Client(base_url=server.url) as http:
        client.submit_batch(jobs)
        for job in jobs:
            assert client.wait(job["job_id"], timeout=60).status == "completed"
        everything = client.list_jobs()
        assert everything.total == 6 and everything.jobs[0].job_id == "echo"
        right = client.list_jobs(kind="math", reward_min=1)
        assert sorted(j.job_id for j in right.jobs) == ["j0", "j2", "j4"]
        assert {j.reward for j in client.list_jobs(group_id="g").jobs} == {0.0, 1.0}
        assert client.list_jobs(group_id="g").total == 3
        by_reward = client.list_jobs(sort="reward", order="asc", limit=2)
        assert [j.reward for j in by_reward.jobs] == [0.0, 0.0] and by_reward.total == 6
        page = client.list_jobs(sort="created", order="asc", offset=4, limit=10)
        assert [j.job_id for j in page.jobs] == ["j4", "echo"]
        row = page.jobs[1]
        assert (row.kind, row.task_id, row.status, row.exit_reason) == (
            "echo",
            "e",
            "completed",
            "submitted",
        )
        assert client.list_jobs(status=["failed", "cancelled"]).total == 0
        # Bad parameters name themselves.
        for params in ({"status": "bogus"}, {"limit": 0}, {"sort": "job_id"}, {"colour": "x"}):
            answer = http.get("/v1/jobs", params=params)
            assert answer.status_code == 422, (params, answer.text)
            assert answer.json()["error"]["code"] == "invalid_input"


def test_a_token_mode_trajectory_has_each_tokens_text(
    server_factory: Callable[..., Server], tiny_model: Path
) -> None:
    server = server_factory()
    server.start()
    with (
        # Registration probes a token-mode backend with one generation: the first turn.
        ScriptedLLMServer([{"content": "probe"}, *_SOLVE], tokenizer=tiny_model) as llm,
        RolloutClient(server.url) as client,
        httpx.Client(base_url=server.url, timeout=60) as http,
    ):
        _register(
            http, id="v", kind="vllm", url=llm.url, model="scripted", tokenizer=str(tiny_model)
        )
        task = {"task_id": "six", **_MATH}
        client.submit({"job_id": "tok", "task": task, "model": "scripted"})
        view = client.wait("tok", timeout=60)
        assert view.status == "completed" and view.result is not None
        tokens = view.result.tokens
        assert tokens is not None
        got = client.trajectory("tok")
        assert got.tokens == tokens
        assert got.token_text is not None
        assert len(got.token_text) == len(tokens.prompt_ids) + len(tokens.response_ids)
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))
        at = len(tokens.prompt_ids)
        assert got.token_text[at] == tokenizer.decode([tokens.response_ids[0]])
        assert [t.index for t in got.turns] == [1, 2]
        first = got.turns[0].info
        assert first is not None and first.generation is not None
        assert first.generation.start == at
