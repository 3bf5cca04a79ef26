"""A server SIGKILLed with SWE-image sandboxes live and started again on the same data
directory: each job completes once, and nothing of the killed server's sandboxes is left — no
process (launchers, the shells inside, the mount namespace holders of a rootless /testbed), no
mount and no directory. The rootless suite runs it as an ordinary user."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from rollserve.sandbox import SandboxManager
from tests.conformance.conftest import require
from tests.integration.conftest import Server
from tests.leaks import descendants, mounts_under, processes_naming
from tests.swebench.conftest import Instance


def _wait(what: str, done: Callable[[], bool], timeout_s: float = 60) -> None:
    end = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < end, f"{what} did not happen in {timeout_s} s"
        time.sleep(0.1)


@pytest.mark.parametrize("backend", ["bwrap", "apptainer"])
def test_sigkill_with_swe_sandboxes_live_leaves_nothing_after_the_restart(
    server_factory: Callable[..., Server], instance: Instance, backend: str, tmp_path: Path
) -> None:
    require(SandboxManager(instance.settings(tmp_path)), backend)
    task = instance.task().model_dump(mode="json")
    env = {
        "default_sandbox_backend": backend,
        "image_cache_dir": str(instance.cache),
        "run_workers": "2",
        # Short, so the killed server's leases lapse soon; long enough that a heartbeat late
        # on a loaded machine does not hand a live job to the other worker.
        "lease_s": "5",
    }
    jobs: list[dict[str, Any]] = [
        {
            "job_id": f"k{i}",
            "task": {**task, "task_id": f"k{i}"},
            "agent": {"name": "script", "commands": ["echo edited >> README.rst", "sleep 3"]},
        }
        for i in range(2)
    ]
    first = server_factory(**env)
    first.start()
    with httpx.Client(base_url=first.url, timeout=30) as http:
        assert http.post("/v1/jobs/batch", json={"jobs": jobs}).status_code == 202

        def both_running() -> bool:
            statuses = [http.get(f"/v1/jobs/{j['job_id']}").json()["status"] for j in jobs]
            return statuses == ["running", "running"]

        _wait("both jobs running", both_running)
    assert first.proc is not None
    pid = first.proc.pid
    # A job is "running" once its run stage begins, before its shell is up: wait for both
    # sandboxes' launchers and shells (and, rootless, their mount namespace holders).
    _wait("both sandboxes' processes", lambda: len(descendants(pid)) >= 4, 30)
    live = descendants(pid)
    # As root each /testbed is an overlay on the host, which outlives the server's death
    # until the next start's reaper takes it down; otherwise it dies with its holder.
    assert bool(mounts_under(first.data_dir)) == (os.geteuid() == 0)
    first.kill()

    second = server_factory(**env)
    second.data_dir = first.data_dir
    second.start()
    # Once the new server is ready, the killed one's sandboxes are gone.
    _wait("the killed server's processes ending", lambda: not any(p.alive() for p in live), 10)
    with httpx.Client(base_url=second.url, timeout=60) as http:
        views = [
            http.get(f"/v1/jobs/{j['job_id']}", params={"wait": 300}, timeout=310).json()
            for j in jobs
        ]
        assert [v["status"] for v in views] == ["completed"] * 2, views
        assert all(v["attempts"] == 2 for v in views)  # each run again, once
        assert all(v["result"]["evaluation"]["resolution"] != "RESOLVED_FULL" for v in views)
        feed = http.get("/v1/results", params={"limit": 100}).json()["results"]
        assert sorted(r["job_id"] for r in feed) == ["k0", "k1"]
        _wait("no live sandbox", lambda: http.get("/v1/status").json()["live_sandboxes"] == 0)
    marker = f"{first.data_dir}/sandboxes/"
    _wait("no sandbox process", lambda: processes_naming(marker) == [], 10)
    assert mounts_under(first.data_dir) == []
    sandboxes = first.data_dir / "sandboxes"
    assert not sandboxes.exists() or list(sandboxes.iterdir()) == []
