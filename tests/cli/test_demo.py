"""``rollserve demo --fast`` as a user runs it: the main job end to end (the tiny model, real
sandboxes, a real model server child), and a Ctrl-C that leaves nothing behind."""

from __future__ import annotations

import os
import queue
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import IO

import pytest

from rollserve.sandbox import SandboxManager
from rollserve.schema.jobs import JobView
from rollserve.settings import Settings
from tests.conformance.conftest import require

ROLLSERVE = shutil.which("rollserve") or str(Path(__file__).parents[2] / ".venv/bin/rollserve")
GROUPS = ("compmath-hmmt_N_2024_guts_9", "HumanEval-53")

pytestmark = pytest.mark.slow


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    require(SandboxManager(Settings(data_dir=tmp_path / "probe")), "bwrap")
    return tmp_path / "demo"


def _env() -> dict[str, str]:
    # A wide console keeps the tables' cells on one line; output unbuffered for the reader.
    return {**os.environ, "COLUMNS": "200", "PYTHONUNBUFFERED": "1"}


def _processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes (other than this one) that mention ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:  # gone meanwhile
            continue
        if text in command:
            found.append(f"{entry.name}: {command}")
    return found


def _no_sandbox_left(data_dir: Path) -> None:
    """No sandbox directory in any sandbox state directory under ``data_dir``."""
    for state in data_dir.rglob("sandboxes"):
        assert list(state.iterdir()) == [], state


def test_demo_fast_runs_the_main_job(data_dir: Path) -> None:
    proc = subprocess.run(
        [ROLLSERVE, "demo", "--fast", "--data-dir", str(data_dir)],
        capture_output=True,
        text=True,
        timeout=600,
        env=_env(),
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    summary = proc.stdout[proc.stdout.index("rollouts by GRPO group") :]
    assert "rewards" in summary and "exit reasons" in summary
    for group in GROUPS:
        assert group in summary
    assert "rollouts/min" in proc.stdout and "generated tokens/s" in proc.stdout

    trajectories = data_dir / "trajectories.jsonl"
    assert str(trajectories) in proc.stdout
    views = [JobView.model_validate_json(line) for line in trajectories.read_text().splitlines()]
    assert sorted(v.group_id or "" for v in views) == sorted(GROUPS * 2)
    for view in views:
        assert view.status == "completed", view.error
        assert view.result is not None and view.result.tokens is not None
        tokens = view.result.tokens
        assert tokens.prompt_ids and tokens.turns
        assert len(tokens.response_ids) == len(tokens.response_mask)
        assert len(tokens.response_ids) == len(tokens.response_logprobs)
        assert sum(tokens.response_mask) == sum(t.generated_tokens for t in tokens.turns) > 0
        assert all(t.policy_version == 0 for t in tokens.turns)
    # Multi-turn: the observations between the turns are template tokens, masked out.
    assert any(0 in v.result.tokens.response_mask for v in views if v.result and v.result.tokens)
    state = data_dir / "service" / "sandboxes"  # the service's sandbox state: it made some
    assert state.is_dir() and list(state.iterdir()) == []
    _no_sandbox_left(data_dir)
    assert _processes_mentioning(str(data_dir)) == []


class _Reader:
    """The lines a process writes, read by a thread so that a wait can time out."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        assert proc.stdout is not None
        stream = proc.stdout
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self.lines.put(line)
        self.lines.put(None)

    def wait_for(self, pattern: str, timeout: float) -> re.Match[str]:
        end = time.monotonic() + timeout
        while True:
            line = self.lines.get(timeout=max(0.0, end - time.monotonic()))
            assert line is not None, f"ended before {pattern!r}:\n{''.join(self.seen)}"
            self.seen.append(line)
            found = re.search(pattern, line)
            if found:
                return found

    def rest(self) -> str:
        while (line := self.lines.get(timeout=60)) is not None:
            self.seen.append(line)
        return "".join(self.seen)


@pytest.mark.parametrize("moment", ["model server started", "jobs running"])
def test_ctrl_c_stops_cleanly(data_dir: Path, moment: str) -> None:
    # With jobs running, enough of them that some are still in flight when SIGINT lands (the
    # tiny model finishes two samples per task within one progress poll).
    samples = ["--samples", "40"] if moment == "jobs running" else []
    proc = subprocess.Popen(
        [ROLLSERVE, "demo", "--fast", "--data-dir", str(data_dir), *samples],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(),
    )
    try:
        reader = _Reader(proc)
        model_pid = int(reader.wait_for(r"model server pid (\d+)", 120).group(1))
        if moment == "jobs running":
            reader.wait_for(r": (running|evaluating)", 180)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 130, reader.rest()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    output = reader.rest()
    assert "Traceback" not in output, output
    assert "SIGINT: stopping" in output
    assert f"model server stopped (pid {model_pid})" in output
    assert not Path(f"/proc/{model_pid}").exists()
    assert _processes_mentioning(str(data_dir)) == []
    _no_sandbox_left(data_dir)
