"""``rollserve serve --processes 2``: two nodes behind one address on the default SQLite store,
both in the fleet's list and both running jobs; SIGTERM to the parent stops them all, and a
child that dies is started again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from tests.servers import ROOT, free_port


def _until(check: Callable[[], bool], timeout: float = 30) -> None:
    end = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.1)


def _children(parent: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[1]) == parent:
                found.append(int(entry.name))
    return found


def _nodes(url: str) -> dict[str, bool]:
    try:
        nodes = httpx.get(f"{url}/v1/status", timeout=5).json()["nodes"]
    except httpx.HTTPError:
        return {}
    return {n["node_id"]: n["alive"] for n in nodes}


def test_two_processes_share_one_address(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [
        sys.executable, "-m", "rollserve.cli.app", "serve", "--processes", "2",
        "--port", str(port), "--data-dir", str(tmp_path / "data"),
        "--plugins", "rollserve.testing.plugin", "--run-workers", "2",
    ]  # fmt: skip
    env = {**os.environ, "ROLLSERVE_NODE_ID": "box", "ROLLSERVE_LEASE_S": "3"}
    with open(tmp_path / "serve.log", "wb") as log:
        parent = subprocess.Popen(command, cwd=ROOT, env=env, stderr=log)
    try:
        _until(lambda: _nodes(url) == {"box-0": True, "box-1": True})
        jobs = [
            {
                "job_id": f"j{i}",
                "task": {"task_id": f"j{i}", "kind": "echo", "prompt": f"p{i}"},
                "agent": {
                    "name": "script",
                    "commands": ["sleep 1", f"printf %s p{i} > answer.txt"],
                },
            }
            for i in range(8)
        ]
        assert httpx.post(f"{url}/v1/jobs/batch", json={"jobs": jobs}).status_code == 202
        views = [
            httpx.get(f"{url}/v1/jobs/j{i}", params={"wait": 60}, timeout=70).json()
            for i in range(8)
        ]
        assert [v["status"] for v in views] == ["completed"] * 8

        first = _children(parent.pid)
        assert len(first) == 2
        os.kill(first[0], signal.SIGKILL)  # a node process dies: the parent starts another
        _until(lambda: len(_children(parent.pid)) == 2 and first[0] not in _children(parent.pid))
        _until(lambda: sum(_nodes(url).values()) == 2)
    finally:
        parent.send_signal(signal.SIGTERM)
        assert parent.wait(timeout=60) == 0
    assert _children(parent.pid) == []
    sandboxes = tmp_path / "data" / "sandboxes"
    assert not sandboxes.exists() or list(sandboxes.iterdir()) == []
