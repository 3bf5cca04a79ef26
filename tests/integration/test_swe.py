"""SWE tasks through the HTTP API: every shipped task's reference fix scores 1 and an empty
submission 0 (the ``submit`` agent); an agent episode driven by the scripted model server fixes
a shipped task with bash and editor calls in a bwrap sandbox and earns reward 1."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

from tests.integration.conftest import Server, scripted_job, tool_call
from tests.swe_tasks import BOLTONS, Prepared


def _wait(http: httpx.Client, job_ids: list[str]) -> list[dict[str, Any]]:
    return [http.get(f"/v1/jobs/{j}", params={"wait": 120}, timeout=130).json() for j in job_ids]


def test_reference_fixes_score_one_and_empty_submissions_zero(
    server_factory: Callable[..., Server], prepared: Prepared
) -> None:
    server = server_factory()
    server.start()
    jobs = []
    for task in prepared.tasks.values():
        body = task.model_dump(mode="json")
        gold = task.metadata["gold_patch"]
        jobs.append(
            {
                "job_id": f"{task.task_id}-gold",
                "task": body,
                "agent": {"name": "submit", "submission": gold},
            }
        )
        jobs.append(
            {
                "job_id": f"{task.task_id}-empty",
                "task": body,
                "agent": {"name": "submit", "submission": ""},
            }
        )
    with httpx.Client(base_url=server.url, timeout=60) as http:
        accepted = http.post("/v1/jobs/batch", json={"jobs": jobs})
        assert accepted.status_code == 202, accepted.text
        done = _wait(http, [j["job_id"] for j in jobs])
    assert len(done) == 2 * len(prepared.tasks) >= 4
    for job in done:
        assert job["status"] == "completed", job
        expected = 1.0 if job["job_id"].endswith("-gold") else 0.0
        assert job["result"]["reward"] == expected, job["result"]["evaluation"]


def test_a_scripted_agent_fixes_a_shipped_task_with_bash_and_the_editor(
    server_factory: Callable[..., Server], prepared: Prepared
) -> None:
    task = prepared.tasks[BOLTONS]

    turns = [
        tool_call("bash", command="grep -n 'x2028' boltons/strutils.py"),
        tool_call("editor", command="view", path="boltons/strutils.py", view_range=[660, 668]),
        tool_call(
            "editor",
            command="str_replace",
            path="boltons/strutils.py",
            old_str=r"\x85|\x2028|\x2029",
            new_str=r"\x85|\u2028|\u2029",
        ),
        tool_call("bash", command="python -m pytest -q -p no:cacheprovider tests/test_strutils.py"),
        tool_call("submit"),
    ]
    server = server_factory()
    server.start()
    done = scripted_job(server, turns, task, wait=120)
    assert done["status"] == "completed", done
    result = done["result"]
    tools = [m for m in result["messages"] if m["role"] == "tool"]
    assert "_line_ending_re" in tools[0]["content"]  # grep found the line
    assert "\t" in tools[1]["content"]  # the editor's numbered view
    assert "edited" in tools[2]["content"].lower(), tools[2]
    assert result["exit_reason"] == "submitted" and result["turns"] == 5
    assert result["tool_errors"] == 0
    assert r"\u2028|\u2029" in result["patch"]
    assert result["reward"] == 1.0, result["evaluation"]
    assert set(result["evaluation"]["fail_to_pass"].values()) == {"passed"}
