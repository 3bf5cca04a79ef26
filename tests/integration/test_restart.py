"""A server killed with SIGKILL mid-work and started again: every job completes exactly once,
and nothing of the dead server's sandboxes is left."""

from __future__ import annotations

import time
from collections.abc import Callable

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
        views = [http.get(f"/v1/jobs/j{i}", params={"wait": 60}).json() for i in range(6)]
        assert [v["status"] for v in views] == ["completed"] * 6
        assert all(v["result"]["reward"] == 1.0 for v in views)
        assert max(v["attempts"] for v in views) >= 2  # the interrupted ones ran again
        feed = http.get("/v1/results", params={"limit": 1000}).json()["results"]
        assert sorted(r["job_id"] for r in feed) == [f"j{i}" for i in range(6)]  # once each
        assert http.get("/v1/status").json()["live_sandboxes"] == 0
    sandboxes = first.data_dir / "sandboxes"
    assert not sandboxes.exists() or list(sandboxes.iterdir()) == []
