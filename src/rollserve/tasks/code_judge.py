"""Judging one run of a submitted Python program in a sandbox: the program's output goes to
size-capped files, the run has a time limit, and the outcome is classified (passed, wrong
answer, runtime or syntax error, timed out, memory limit, output limit, exited early)."""

from __future__ import annotations

import os
import re
import shlex
import stat
from dataclasses import dataclass
from typing import Any, Literal

from rollserve.errors import InfrastructureError, SandboxPathError
from rollserve.sandbox.base import Sandbox

Outcome = Literal[
    "passed",
    "wrong_answer",
    "runtime_error",
    "syntax_error",
    "timed_out",
    "memory_limit",
    "output_limit",
    "exited_early",
    "skipped",
]

JUDGE_DIR = ".judge"  # under the workspace: the run's input and output files
OUTPUT_FLOOR_BYTES = 4 * 1024 * 1024
TAIL_CHARS = 2000
SIGKILL_EXIT = 128 + 9
_SYNTAX = re.compile(r"^(SyntaxError|IndentationError|TabError)\b")
_TRACEBACK = "Traceback (most recent call last):"
_NO_PYTHON = re.compile(r"python3: (?:command )?not found|python3: No such file")


@dataclass
class Run:
    """One finished (or killed) run: its exit status and its captured, capped output."""

    exit_code: int | None
    timed_out: bool
    stdout: str
    stderr: str
    output_limited: bool  # stdout or stderr reached the output cap
    duration_s: float
    cap: int  # bytes stdout (and stderr) may hold


@dataclass
class Verdict:
    """A judged run: the outcome, a one-line message, and what is worth showing of the run."""

    outcome: Outcome
    message: str
    run: Run | None = None
    extra: dict[str, Any] | None = None

    def details(self, name: str) -> dict[str, Any]:
        """This test's entry in an evaluation's ``tests`` list."""
        out: dict[str, Any] = {"name": name, "outcome": self.outcome}
        if self.message:
            out["message"] = self.message
        if self.run is not None:
            out["exit_code"] = self.run.exit_code
            out["duration_s"] = round(self.run.duration_s, 3)
            if self.outcome != "passed" and self.run.stderr.strip():
                out["stderr_tail"] = tail(self.run.stderr)
            if self.outcome in ("output_limit", "exited_early") and self.run.stdout:
                out["stdout_tail"] = tail(self.run.stdout)
        if self.extra:
            out.update(self.extra)
        return out


def tail(text: str, chars: int = TAIL_CHARS) -> str:
    """The end of ``text``, marked when cut."""
    if len(text) <= chars:
        return text
    return f"[... {len(text) - chars} characters omitted ...]\n" + text[-chars:]


def output_cap(expected: str = "") -> int:
    """Bytes of stdout (and of stderr) a run may write: 4 MiB, or twice the expected output."""
    return max(OUTPUT_FLOOR_BYTES, 2 * len(expected.encode()))


async def run_python(
    sandbox: Sandbox,
    args: list[str],
    name: str,
    *,
    stdin_path: str | None,
    time_limit_s: float,
    cap: int,
) -> Run:
    """Run ``python3 ARGS`` in the workspace with stdin from ``stdin_path`` (or /dev/null),
    stdout and stderr into ``.judge/NAME.out`` and ``.err``, each capped at ``cap`` bytes by
    the file-size limit (so an output flood never reaches rollserve), killed after
    ``time_limit_s``."""
    out, err = f"{JUDGE_DIR}/{name}.out", f"{JUDGE_DIR}/{name}.err"
    stdin = shlex.quote(stdin_path) if stdin_path else "/dev/null"
    blocks = -(-cap // 1024)  # bash's ulimit -f counts 1024-byte blocks
    command = (
        f"mkdir -p {JUDGE_DIR} && ulimit -f {blocks} && "
        f"exec {shlex.join(['python3', *args])} < {stdin} > {out} 2> {err}"
    )
    result = await sandbox.exec(command, timeout=time_limit_s)
    stdout, out_full = await _read_capped(sandbox, out, cap)
    stderr, err_full = await _read_capped(sandbox, err, cap)
    if result.exit_code == 127 and _NO_PYTHON.search(stderr + result.stderr):
        raise InfrastructureError(
            "the code task's sandbox image has no python3 on PATH",
            stderr=tail(stderr + result.stderr, 500),
        )
    return Run(
        exit_code=result.exit_code,
        timed_out=result.timed_out,
        stdout=stdout,
        stderr=stderr or result.stderr,
        output_limited=out_full or err_full,
        duration_s=result.duration_s,
        cap=cap,
    )


async def _read_capped(sandbox: Sandbox, path: str, cap: int) -> tuple[str, bool]:
    """A run's output file and whether it reached the cap; a file the program removed or
    replaced (by a symlink, a FIFO) reads as empty."""
    try:
        info = os.lstat(sandbox.workspace / path)
    except OSError:
        return "", False
    if not stat.S_ISREG(info.st_mode):
        return "", False
    if info.st_size > cap:
        return "", True
    try:
        data = await sandbox.read_file(path)
    except SandboxPathError:
        return "", False
    return data.decode("utf-8", errors="replace"), len(data) >= cap


def failure(run: Run, memory_mb: int) -> Verdict | None:
    """The verdict of a run that failed whatever its output, or None when it exited 0 within
    its limits."""
    if run.timed_out:
        return Verdict("timed_out", "timed out (the time limit killed it)", run)
    if run.output_limited:
        return Verdict("output_limit", f"the output exceeded its limit of {run.cap} bytes", run)
    if run.exit_code == 0:
        return None
    last = _last_line(run.stderr)
    if last.startswith("MemoryError") or "Cannot allocate memory" in last:
        return Verdict("memory_limit", f"out of memory (limit {memory_mb} MB): {last}", run)
    if run.exit_code == SIGKILL_EXIT:
        message = f"killed (SIGKILL): most likely by the memory limit of {memory_mb} MB"
        return Verdict("memory_limit", message, run)
    if _TRACEBACK not in run.stderr and _SYNTAX.match(last):
        return Verdict("syntax_error", _syntax_message(run.stderr), run)
    if last.startswith("AssertionError"):
        return Verdict("wrong_answer", f"a test assertion failed: {last}", run)
    why = last or f"exit code {run.exit_code}"
    return Verdict("runtime_error", f"runtime error: {why}", run)


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def _syntax_message(stderr: str) -> str:
    """``SyntaxError: ... (line N)`` from Python's report of a file that does not compile."""
    line_no = re.findall(r'File "[^"]*", line (\d+)', stderr)
    where = f" (line {line_no[-1]})" if line_no else ""
    return f"syntax error: {_last_line(stderr)}{where}"


def compare_output(expected: str, got: str) -> dict[str, Any] | None:
    """None when the outputs agree line by line with trailing whitespace (and trailing empty
    lines) ignored; else where they first differ."""
    want, have = _normalized(expected), _normalized(got)
    if want == have:
        return None
    for index, (a, b) in enumerate(zip(want, have, strict=False)):
        if a != b:
            return {"line": index + 1, "expected": a[:200], "got": b[:200]}
    index = min(len(want), len(have))
    return {
        "line": index + 1,
        "expected": want[index][:200] if index < len(want) else "<end of output>",
        "got": have[index][:200] if index < len(have) else "<end of output>",
    }


def _normalized(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return lines
