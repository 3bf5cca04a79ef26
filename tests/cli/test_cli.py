"""The command line, run as a user runs it: the installed console script."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
from pathlib import Path

import pytest

ROLLSERVE = shutil.which("rollserve") or str(Path(__file__).parents[2] / ".venv/bin/rollserve")


def _run(*args: str, data_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ROLLSERVE, *args, "--data-dir", str(data_dir)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_sandbox_check_json(tmp_path: Path) -> None:
    proc = _run("sandbox", "check", "--json", "--starts", "3", data_dir=tmp_path)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    by_name = {b["name"]: b for b in report["backends"]}
    assert set(by_name) == {"bwrap", "apptainer", "local"}
    for entry in by_name.values():
        assert set(entry) >= {"name", "available", "reason", "start_p50_ms"}
        if entry["available"]:
            assert entry["start_p50_ms"] > 0
        else:
            assert entry["reason"]
    assert by_name["local"]["available"]
    assert list((tmp_path / "sandboxes").iterdir()) == []
    # For the user running it (root, or the rootless suite's user): each limit enforced or
    # not, and how; how a close finds the processes; how /testbed is made writable.
    me = f"{pwd.getpwuid(os.geteuid()).pw_name} (uid {os.geteuid()})"
    limits = {"wall_time_s", "memory_mb", "max_processes", "max_file_size_mb", "disk_mb"}
    for entry in (e for e in by_name.values() if e["available"]):
        assert entry["user"] == me
        assert set(entry["limits"]) == limits
        assert all(check["how"] for check in entry["limits"].values())
        unenforced = {k for k, check in entry["limits"].items() if not check["enforced"]}
        assert unenforced == set(entry["unenforced"]), entry
        assert entry["closes"] and entry["workspace"] in {"overlay", "copy"}
    bwrap = by_name["bwrap"]
    if not bwrap["available"]:
        return
    # Linux >= 5.11 mounts overlayfs in a user namespace: /testbed is an overlay for root
    # and an ordinary user alike (the probe's tree is the user's own, as the cache's are).
    kernel = tuple(int(n) for n in os.uname().release.split(".")[:2])
    assert (bwrap["workspace"] == "overlay") == (os.geteuid() == 0 or kernel >= (5, 11)), bwrap
    assert bwrap["limits"]["wall_time_s"]["enforced"]
    assert bwrap["limits"]["max_file_size_mb"]["enforced"]
    if os.geteuid() != 0:
        assert bwrap["closes"].startswith("PID namespaces")  # never a scan of /proc
        assert not bwrap["limits"]["disk_mb"]["enforced"]


def test_bench_shell_json(tmp_path: Path) -> None:
    proc = _run("bench", "shell", "--json", "--n", "20", "--backend", "local", data_dir=tmp_path)
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout)["results"]
    methods = {r["method"] for r in results}
    assert methods == {"pty", "tmux", "bash_c"} if shutil.which("tmux") else {"pty", "bash_c"}
    for r in results:
        assert r["backend"] == "local"
        assert 0 < r["p50_ms"] <= r["p99_ms"]
        assert r["n"] >= 10


@pytest.mark.parametrize("args", [["sandbox", "nope"], ["bench", "shell", "--n", "1"]])
def test_bad_arguments_are_refused(args: list[str], tmp_path: Path) -> None:
    proc = _run(*args, data_dir=tmp_path)
    assert proc.returncode == 2
    assert "Usage" in proc.stderr or "Error" in proc.stderr


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("mysql://db/rollserve", "store_url 'mysql://db/rollserve': unknown job store"),
        ("postgresql://me:hunter2@127.0.0.1:1/none", "cannot reach the PostgreSQL store"),
    ],
)
def test_serve_refuses_a_store_url_it_cannot_use(tmp_path: Path, url: str, said: str) -> None:
    proc = subprocess.run(
        [ROLLSERVE, "serve", "--port", "1", "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "ROLLSERVE_STORE_URL": url},
    )
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert said in " ".join(proc.stderr.split()), proc.stderr
    assert "Traceback" not in proc.stderr and len(lines) <= 3, proc.stderr
    assert "hunter2" not in proc.stderr
