"""A server killed with SIGKILL mid-work and started again: every job completes exactly once,
and nothing of the dead server's sandboxes is left."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import httpx

from tests.integration.conftest import Server


def test_sigkill_and_restart_lose_and_repeat_nothing(server_factory: Callable[..., Server]) -> None:
    first = server_factory(run_workers="3")
    first.start()
    jobs = [
        {
            "job_id": f"j{i}",
            "task": {"task_id": f"j{i}", "kind": "echo", "prompt": f"p{i}"},
            "agent": {"name": "script", "commands": ["sleep 2", f"printf %s p{i} > answer.txt"]},
        }
        for i in range(6)
    ]
    with httpx.Client(base_url=first.url, timeout=30) as http:
        assert http.post("/v1/jobs/batch", json={"jobs": jobs}).status_code == 202
        end = time.monotonic() + 30
        while time.monotonic() < end:
            statuses = [http.get(f"/v1/jobs/j{i}").json()["status"] for i in range(6)]
            if statuses.count("running") >= 2:
                break
            time.sleep(0.1)
    first.kill()

    second = server_factory(run_workers="3")
    second.data_dir = first.data_dir
    second.start()
    with httpx.Client(base_url=second.url, timeout=60) as http:
        views = [
            http.get(f"/v1/jobs/j{i}", params={"wait": 60}, timeout=70).json() for i in range(6)
        ]
        assert [v["status"] for v in views] == ["completed"] * 6, [
            (v["job_id"], v["status"], v["attempts"], v.get("error")) for v in views
        ]
        assert all(v["result"]["reward"] == 1.0 for v in views)
        assert max(v["attempts"] for v in views) >= 2  # the interrupted ones ran again
        feed = http.get("/v1/results", params={"limit": 1000}).json()["results"]
        assert sorted(r["job_id"] for r in feed) == [f"j{i}" for i in range(6)]  # once each
        assert http.get("/v1/status").json()["live_sandboxes"] == 0
    sandboxes = first.data_dir / "sandboxes"
    assert not sandboxes.exists() or list(sandboxes.iterdir()) == []


def test_sigkill_in_every_stage_and_restart(server_factory: Callable[..., Server]) -> None:
    """Killed with a job initializing, one running, one evaluating and one waiting in the eval
    pool: each completes once after the restart, each re-run stage counted as an attempt, and
    nothing of the killed process's sandboxes is left."""
    env = {"lease_s": "2", "init_workers": "2", "run_workers": "2", "eval_workers": "1"}
    first = server_factory(**env)
    first.start()

    def job(job_id: str, command: str = "true", **task: object) -> dict[str, object]:
        return {
            "job_id": job_id,
            "task": {"task_id": job_id, "kind": "echo", "prompt": job_id, **task},
            "agent": {"name": "script", "commands": [command, f"printf %s {job_id} > answer.txt"]},
        }

    jobs = [
        job("initializing", init_delay_s=3),
        job("running", "sleep 3"),
        job("evaluating", eval_delay_s=3),
        job("eval-queued", eval_delay_s=3),
    ]
    with httpx.Client(base_url=first.url, timeout=30) as http:
        # The first to evaluate takes the one eval worker; the other then waits for it.
        assert http.post("/v1/jobs", json=jobs[2]).status_code == 202
        end = time.monotonic() + 30
        while http.get("/v1/jobs/evaluating").json()["status"] != "evaluating":
            assert time.monotonic() < end, "the first job never reached its evaluation"
            time.sleep(0.05)
        others = [jobs[0], jobs[1], jobs[3]]
        assert http.post("/v1/jobs/batch", json={"jobs": others}).status_code == 202
        while time.monotonic() < end:
            statuses = [http.get(f"/v1/jobs/{j['job_id']}").json()["status"] for j in jobs]
            eval_stage = http.get("/v1/status").json()["stages"]["eval"]
            in_place = statuses == ["initializing", "running", "evaluating", "evaluating"]
            if in_place and (eval_stage["active"], eval_stage["queued"]) == (1, 1):
                break
            time.sleep(0.05)
        else:
            raise AssertionError(f"the jobs never stood in every stage: {statuses}")
    first.kill()

    second = server_factory(**env)
    second.data_dir = first.data_dir
    second.start()
    with httpx.Client(base_url=second.url, timeout=60) as http:
        views = {
            j["job_id"]: http.get(f"/v1/jobs/{j['job_id']}", params={"wait": 60}, timeout=70).json()
            for j in jobs
        }
        assert {v["status"] for v in views.values()} == {"completed"}
        assert all(v["result"]["reward"] == 1.0 for v in views.values())
        # Init and run start again from init; the evaluation at work runs again; the job
        # waiting in the eval pool had not started: its first attempt still.
        attempts = {k: v["attempts"] for k, v in views.items()}
        assert attempts == {"initializing": 2, "running": 2, "evaluating": 2, "eval-queued": 1}
        feed = http.get("/v1/results", params={"limit": 1000}).json()["results"]
        assert sorted(r["job_id"] for r in feed) == sorted(views)  # once each
        assert http.get("/v1/status").json()["live_sandboxes"] == 0
    sandboxes = first.data_dir / "sandboxes"
    assert not sandboxes.exists() or list(sandboxes.iterdir()) == []
    marker = f"{sandboxes}/".encode()
    assert not [p for p in Path("/proc").iterdir() if p.name.isdigit() and _holds(p, marker)]


def _holds(proc: Path, marker: bytes) -> bool:
    try:
        return marker in (proc / "cmdline").read_bytes()
    except OSError:
        return False
