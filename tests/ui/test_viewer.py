"""The web viewer in headless Chromium against a real server with real jobs: the sign-in and
its 401, the fleet view updating as jobs move, filters narrowing the jobs table, a GRPO group,
a trajectory whose tool call, output, reward and token mask match the job's JSON, an external
agent's trajectory with its process and token segments, and the offline viewer over a demo
results file."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from rollserve.client import wait_ready
from rollserve.demo.report import write_trajectories
from rollserve.schema.jobs import JobView
from rollserve.testing.scripted import Hold, ScriptedLLMServer
from tests.integration.agents_env import PROGRAMS
from tests.integration.conftest import ROOT
from tests.servers import free_port
from tests.ui.conftest import MATH, SOLVE, VIEWER, Viewer, open_page, shot, sign_in, submit_job


def _ready(page: Any, testid: str) -> Any:
    root = page.locator(f"[data-testid={testid}][data-ready='1']")
    root.wait_for(timeout=15_000)
    return root


def _text(page: Any, selector: str) -> str:
    return str(page.locator(selector).first.inner_text()).strip()


def test_the_viewer_needs_a_token_and_a_read_only_one_is_enough(
    browser: Any, viewer: Viewer
) -> None:
    page, _ = open_page(browser)
    answer = page.goto(f"{viewer.url}/ui/")
    assert answer is not None and answer.status == 401
    assert page.locator("[data-testid=sign-in] #token").is_visible()
    shot(page, "sign-in")
    page.fill("#token", "not-a-token")
    page.click("button[type=submit]")
    assert "not one this server accepts" in page.content()
    # The API refuses a page without the cookie, and the cookie never writes.
    assert httpx.get(f"{viewer.url}/v1/jobs").status_code == 401
    signed, errors = sign_in(browser, viewer)
    _ready(signed, "fleet")
    cookies = {c["name"]: c for c in signed.context.cookies()}
    cookie = cookies["rollserve_token"]
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    jar = {"rollserve_token": VIEWER}
    assert httpx.get(f"{viewer.url}/v1/jobs", cookies=jar).status_code == 200
    write = httpx.post(f"{viewer.url}/v1/jobs", json=submit_job("w", "42"), cookies=jar)
    assert write.status_code == 401
    assert errors == []


def test_the_fleet_view_updates_as_jobs_move(browser: Any, viewer: Viewer) -> None:
    page, errors = sign_in(browser, viewer)
    _ready(page, "fleet")
    before = viewer.api("/v1/status")["jobs"].get("completed", 0)
    counter = page.locator("[data-testid=status-count-completed]")
    counter.wait_for()
    assert int(counter.inner_text().replace(",", "")) == before
    for stage in ("init", "run", "eval"):
        row = page.locator(f"[data-testid=stage-{stage}]")
        workers = viewer.api("/v1/status")["stages"][stage]["workers"]
        assert _text(row, "[data-testid=workers]") == str(workers)
    [backend] = viewer.api("/v1/llm/backends")
    assert page.locator(f"[data-testid=backend-row][data-backend-id={backend['id']}]").count()
    assert page.locator("[data-testid=throughput-chart]").count() == 1
    page.evaluate("window.__kept = true")  # gone if the page reloaded
    viewer.submit([submit_job(f"more-{i}", "42") for i in range(3)])
    for i in range(3):
        viewer.wait(f"more-{i}")
    page.wait_for_function(
        "n => Number(document.querySelector('[data-testid=status-count-completed]')"
        ".innerText.replace(/,/g, '')) === n",
        arg=before + 3,
        timeout=15_000,
    )
    assert page.evaluate("window.__kept") is True
    shot(page, "fleet")
    assert errors == []


def test_filters_narrow_the_jobs_table_and_a_group_shows_its_samples(
    browser: Any, viewer: Viewer
) -> None:
    page, errors = sign_in(browser, viewer)
    page.goto(f"{viewer.url}/ui/#/jobs")
    table = _ready(page, "jobs")
    total = viewer.api("/v1/jobs")["total"]
    page.wait_for_function(
        "n => document.querySelector('[data-testid=jobs-total]')?.dataset.total === String(n)",
        arg=total,
    )

    def narrowed_to(expected: dict[str, Any]) -> None:
        page.wait_for_function(
            "n => document.querySelector('[data-testid=jobs-total]').dataset.total === String(n)",
            arg=expected["total"],
        )
        rows = page.locator("[data-testid=job-row]")
        shown = [rows.nth(i).get_attribute("data-job-id") for i in range(rows.count())]
        assert shown == [j["job_id"] for j in expected["jobs"]]

    page.fill("[data-testid=filter-kind]", "echo")
    narrowed_to(viewer.api("/v1/jobs", kind="echo"))
    page.fill("[data-testid=filter-reward-min]", "1")
    narrowed_to(viewer.api("/v1/jobs", kind="echo", reward_min=1))
    assert viewer.api("/v1/jobs", kind="echo", reward_min=1)["total"] == 2
    page.fill("[data-testid=filter-kind]", "")
    page.fill("[data-testid=filter-reward-min]", "")
    page.select_option("[data-testid=filter-status]", "completed")
    narrowed_to(viewer.api("/v1/jobs", status="completed"))
    page.fill("[data-testid=filter-group]", "g1")
    narrowed_to(viewer.api("/v1/jobs", status="completed", group_id="g1"))
    assert "group_id=g1" in page.url  # the view is a link
    shot(page, "jobs")
    assert table.is_visible()

    page.goto(f"{viewer.url}/ui/#/groups/g1")
    _ready(page, "group")
    samples = page.locator("[data-testid=group-sample]")
    rewards = {
        samples.nth(i).get_attribute("data-job-id"): float(
            samples.nth(i).get_attribute("data-reward")
        )
        for i in range(samples.count())
    }
    assert rewards == {"g1-0": 1.0, "g1-1": 1.0, "g1-2": 0.0, "g1-3": 0.0}
    shot(page, "group")
    assert errors == []


def test_a_trajectory_page_matches_the_jobs_json(browser: Any, viewer: Viewer) -> None:
    job = viewer.api("/v1/jobs/solve")
    result = job["result"]
    tokens = result["tokens"]
    page, errors = sign_in(browser, viewer)
    page.goto(f"{viewer.url}/ui/#/jobs/solve")
    root = _ready(page, "trajectory")
    assert root.get_attribute("data-status") == "completed"
    assert float(_text(page, "[data-testid=traj-reward]")) == result["reward"] == 1.0
    assert _text(page, "[data-testid=traj-exit-reason]") == "submitted"
    turns = page.locator("[data-testid=turn]")
    assert turns.count() == result["turns"] == 2
    call = turns.nth(0).locator("[data-testid=tool-call]")
    assert call.get_attribute("data-tool") == "bash"
    assert "echo $((6*7))" in call.inner_text()
    tool_message = result["messages"][3]
    assert tool_message["role"] == "tool"
    output = turns.nth(0).locator("[data-testid=tool-output]").first.inner_text()
    assert output.strip() == tool_message["content"].strip()
    assert turns.nth(0).locator("[data-testid=exit-code]").first.inner_text().strip() == "0"
    assert "policy" in turns.nth(0).inner_text() and "3" in turns.nth(0).inner_text()
    # The token view: prompt, then the response coloured by its mask, as the JSON has them.
    spans = page.locator("[data-testid=token-view] span.tok")
    shown = spans.evaluate_all("s => s.map(t => [t.dataset.mask, Number(t.dataset.id)])")
    expected = [["p", i] for i in tokens["prompt_ids"]]
    expected += [
        [str(m), i] for m, i in zip(tokens["response_mask"], tokens["response_ids"], strict=True)
    ]
    assert shown == expected[: len(shown)] and len(shown) == min(len(expected), 2000)
    generated = page.locator("[data-testid=token-view] span.tok-gen")
    observed = page.locator("[data-testid=token-view] span.tok-obs")
    assert generated.count() == sum(tokens["response_mask"])
    assert observed.count() == len(tokens["response_mask"]) - sum(tokens["response_mask"])
    colours = generated.evaluate_all("s => s.map(t => getComputedStyle(t).backgroundColor)")
    obs_colour = observed.first.evaluate("t => getComputedStyle(t).backgroundColor")
    assert obs_colour not in colours  # generated and observation tokens look different
    assert _text(page, "[data-testid=evaluation-answer]") == result["evaluation"]["answer"]
    assert page.locator("[data-testid=timeline]").count() == 1
    link = page.locator("[data-testid=download-json]")
    assert link.get_attribute("href") == "/v1/jobs/solve"
    shot(page, "trajectory")
    assert errors == []


STDLIB_AGENT = (PROGRAMS / "stdlib_agent.py").read_text()


def test_an_external_agents_trajectory_shows_its_process_and_segments(
    browser: Any, viewer: Viewer, tiny_model: Path
) -> None:
    """An external agent in its sandbox, through the gateway in token mode: its page shows the
    agent process, marks where its second token segment began, and shows each segment's
    tokens and mask as the job's JSON has them."""
    turns = [{"content": "probe"}, SOLVE[0], {"content": "The answer is \\boxed{42}."}]
    with ScriptedLLMServer(turns, model="ext", tokenizer=tiny_model) as llm:
        spec = {
            "id": "ext",
            "kind": "vllm",
            "url": llm.url,
            "model": "ext",
            "tokenizer": str(tiny_model),
        }
        assert viewer.admin.post("/v1/llm/backends", json=spec).status_code == 201
        try:
            agent = {"name": "external", "command": ["python3", "-c", STDLIB_AGENT]}
            task = {"task_id": "six-externally", **MATH}
            viewer.submit([{"job_id": "external", "task": task, "model": "ext", "agent": agent}])
            job = viewer.wait("external")
        finally:
            viewer.admin.delete("/v1/llm/backends/ext")
    result = job["result"]
    assert result["reward"] == 1.0, job
    segments = result["segments"]
    assert len(segments) == 2 and result["agent_run"]["model_calls"] == 2
    page, errors = sign_in(browser, viewer)
    page.goto(f"{viewer.url}/ui/#/jobs/external")
    _ready(page, "trajectory")
    run = page.locator("[data-testid=agent-run]")
    assert _text(page, "[data-testid=agent-exit]") == "0"
    assert _text(page, "[data-testid=agent-calls]") == "2"
    assert "The answer is" in run.locator("[data-testid=agent-stdout]").inner_text()
    badges = page.locator("[data-testid=turn-segment]").all_inner_texts()
    assert [b.strip() for b in badges] == ["segment 0", "segment 1"]
    mark = page.locator("[data-testid=segment-mark]")
    assert mark.count() == 1 and "segment 1 begins" in mark.inner_text()
    picks = page.locator("[data-testid=segment-pick]")
    assert picks.count() == 2
    view = page.locator("[data-testid=token-view]")

    def shown() -> list[list[Any]]:
        spans = view.locator("span.tok")
        found: list[list[Any]] = spans.evaluate_all(
            "s => s.map(t => [t.dataset.mask, Number(t.dataset.id)])"
        )
        return found

    def expected(index: int) -> list[list[Any]]:
        tokens = segments[index]
        pairs = zip(tokens["response_mask"], tokens["response_ids"], strict=True)
        return [["p", i] for i in tokens["prompt_ids"]] + [[str(m), i] for m, i in pairs]

    # The page opens on the last segment, with why it began; then the first, on demand.
    assert view.get_attribute("data-segment") == "1" and shown() == expected(1)
    assert "the agent's history" in _text(page, "[data-testid=segment-why]")
    picks.nth(0).click()
    assert view.get_attribute("data-segment") == "0" and shown() == expected(0)
    assert _text(page, "[data-testid=segment-why]") == "segment 0 began: the first call"
    shot(page, "external-trajectory")
    assert errors == []


def test_a_running_job_is_watched_turn_by_turn(browser: Any, viewer: Viewer) -> None:
    """A text-mode rollout whose second turn is held until the page has shown the first: the
    page shows the first turn while the second is being generated, then the finished
    trajectory, without a reload."""
    second_turn = threading.Event()

    def hold_the_second(path: str, body: dict[str, Any], answer: dict[str, Any]) -> Any:
        return Hold(second_turn) if slow.served > 1 else answer

    with ScriptedLLMServer(SOLVE, model="slow", rewrite=hold_the_second) as slow:
        spec = {"id": "slow", "kind": "openai", "url": slow.url, "model": "slow"}
        assert viewer.admin.post("/v1/llm/backends", json=spec).status_code == 201
        try:
            task = {"task_id": "six-slowly", **MATH}
            viewer.submit([{"job_id": "watched", "task": task, "model": "slow"}])
            page, errors = sign_in(browser, viewer)
            page.goto(f"{viewer.url}/ui/#/jobs/watched")
            _ready(page, "trajectory")
            page.locator("[data-testid=traj-live]").wait_for(timeout=30_000)
            page.locator("[data-testid=turn]").first.wait_for(timeout=30_000)
            assert page.locator("[data-testid=turn]").count() == 1  # the second is on its way
            assert "echo $((6*7))" in page.locator("[data-testid=tool-call]").first.inner_text()
            shot(page, "live-trajectory")
            page.evaluate("window.__kept = true")
            second_turn.set()
            page.wait_for_function(
                "() => document.querySelector('[data-testid=trajectory]').dataset.status"
                " === 'completed'",
                timeout=60_000,
            )
            assert page.locator("[data-testid=traj-live]").count() == 0
            assert page.locator("[data-testid=turn]").count() == 2
            assert page.evaluate("window.__kept") is True
            assert errors == []
        finally:
            second_turn.set()
            viewer.admin.delete("/v1/llm/backends/slow")


def test_the_offline_viewer_opens_a_demo_results_file(
    browser: Any, viewer: Viewer, tmp_path: Path, tiny_model: Path
) -> None:
    views = [JobView.model_validate(j) for j in viewer.api("/v1/results", limit=1000)["results"]]
    views += _made_up_views()  # what this server's jobs do not show: a failure, a patch
    results = tmp_path / "demo" / "trajectories.jsonl"
    write_trajectories(results, views)  # what the demo writes
    with offline_viewer(results, "--tokenizer", str(tiny_model)) as url:
        page, errors = open_page(browser)
        page.goto(f"{url}/ui/#/jobs")
        _ready(page, "jobs")
        page.wait_for_function(
            "n => document.querySelector('[data-testid=jobs-total]')?.dataset.total === String(n)",
            arg=len(views),
        )
        shot(page, "offline-jobs")
        page.goto(f"{url}/ui/#/jobs/solve")
        _ready(page, "trajectory")
        call = page.locator("[data-testid=tool-call]").first
        assert "echo $((6*7))" in call.inner_text()
        assert page.locator("[data-testid=token-view] span.tok").count() > 0
        shot(page, "offline-trajectory")
        page.goto(f"{url}/ui/#/jobs/broken")
        _ready(page, "trajectory")
        failure = page.locator("[data-testid=job-error]").inner_text()
        assert "sandbox_died" in failure and "the sandbox died mid-command" in failure
        shot(page, "offline-failed")
        page.goto(f"{url}/ui/#/jobs/patched")
        _ready(page, "trajectory")
        added = page.locator("[data-testid=patch] .d-add").all_inner_texts()
        assert [line.strip() for line in added] == ["+a = 2"]
        outcomes = page.locator("[data-testid=test-row]").evaluate_all(
            "rows => rows.map(r => [r.dataset.test, r.dataset.outcome])"
        )
        assert outcomes == [["test_fixed", "PASSED"], ["test_kept", "FAILED"]]
        shot(page, "offline-swe")
        assert errors == []


def test_a_long_trajectory_is_shown_a_page_at_a_time(browser: Any, tmp_path: Path) -> None:
    """120 turns, a 100,000-character tool output, 20,000 tokens: the page renders 50 turns,
    the output's head and tail, 2,000 tokens, and more on demand."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "a long task"},
    ]
    for turn in range(120):
        arguments = json.dumps({"command": f"step {turn}"})
        call = {
            "id": f"c{turn}",
            "type": "function",
            "function": {"name": "bash", "arguments": arguments},
        }
        output = "".join(f"line {i}\n" for i in range(12_000)) if turn == 0 else f"out {turn}"
        messages += [
            {"role": "assistant", "content": f"turn {turn}", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{turn}", "name": "bash", "content": output},
        ]
    response = list(range(15_000))
    tokens = {
        "prompt_ids": list(range(100_000, 105_000)),
        "response_ids": response,
        "response_mask": [i % 2 for i in response],
        "response_logprobs": [-0.5 * (i % 2) for i in response],
    }
    result = {"reward": 1.0, "exit_reason": "max_turns", "messages": messages, "turns": 120}
    view = {"job_id": "long", "status": "completed", "result": {**result, "tokens": tokens}}
    path = tmp_path / "long.jsonl"
    path.write_text(json.dumps(view) + "\n")
    with offline_viewer(path) as url:
        page, errors = open_page(browser)
        page.goto(f"{url}/ui/#/jobs/long")
        _ready(page, "trajectory")
        turns = page.locator("[data-testid=turn]")
        assert turns.count() == 50 and "120" in page.inner_text("body")
        first = turns.nth(0).locator("[data-testid=tool-output]").first
        assert len(first.inner_text()) < 20_000 and "line 11999" in first.inner_text()
        first.locator("button.show-all").click()
        assert "line 6000\n" in first.inner_text()
        spans = page.locator("[data-testid=token-view] span.tok")
        assert spans.count() == 2000
        assert spans.first.get_attribute("data-id") == "100000"
        page.click("[data-testid=token-next]")
        page.wait_for_function(
            "() => document.querySelector('[data-testid=token-view] span.tok').dataset.id"
            " === '102000'"
        )
        assert spans.count() == 2000
        shot(page, "long-trajectory")
        assert errors == []


@contextlib.contextmanager
def offline_viewer(results: Path, *flags: str) -> Iterator[str]:
    """``rollserve view RESULTS`` on a free port; its URL."""
    port = free_port()
    command = [sys.executable, "-m", "rollserve.cli.app", "view", str(results)]
    proc = subprocess.Popen([*command, "--port", str(port), *flags], cwd=ROOT)
    try:
        url = f"http://127.0.0.1:{port}"
        # (it loads the tokenizer first: a minute on a machine busy with the other suites)
        assert wait_ready(url, 90), "the offline viewer did not start"
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def _made_up_views() -> list[JobView]:
    """A job that failed (no result, an error) and a repository task with its patch."""
    patch = "diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1 +1 @@\n"
    patch += "-a = 1\n+a = 2\n"
    evaluation = {
        "applied": "git apply",
        "fail_to_pass": {"test_fixed": "passed"},
        "pass_to_pass": {"test_kept": "failed"},
        "test_output": "1 passed, 1 failed",
    }
    messages = [
        {"role": "system", "content": "Fix the bug."},
        {"role": "user", "content": "a should be 2"},
        {"role": "assistant", "content": "Done.", "tool_calls": []},
    ]
    return [
        JobView.model_validate(
            {
                "job_id": "broken",
                "kind": "math",
                "status": "failed",
                "attempts": 3,
                "error": {"code": "sandbox_died", "message": "the sandbox died mid-command"},
            }
        ),
        JobView.model_validate(
            {
                "job_id": "patched",
                "kind": "swe",
                "status": "completed",
                "attempts": 1,
                "result": {
                    "reward": 0.0,
                    "exit_reason": "submitted",
                    "evaluation": evaluation,
                    "messages": messages,
                    "turns": 1,
                    "patch": patch,
                },
            }
        ),
    ]
