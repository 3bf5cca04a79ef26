"""The code task on real bwrap sandboxes: every canonical HumanEval solution scores 1 through the
submit agent; wrong, broken, hanging, memory-hungry and flooding submissions score 0 with the
reason; stdin/stdout programs; the fenced-block fallback; field validation."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from rollserve.errors import InfrastructureError, InvalidInputError
from rollserve.node import default_plugins
from rollserve.pipeline.stages import StageRunner, validate
from rollserve.sandbox import SandboxManager, spec_for
from rollserve.schema.jobs import ExitReason, JobRequest, RolloutResult, Task
from rollserve.schema.run import RunOutput
from rollserve.schema.sandbox import ExecResult
from rollserve.settings import Settings
from rollserve.tasks.code import CodeHandler
from rollserve.tasks.code_judge import run_python
from rollserve.tasks.code_program import defines, function_program, submitted_code
from tests.conformance.conftest import require

EXAMPLES = Path(__file__).parents[2] / "examples"
HUMANEVAL = [json.loads(line) for line in (EXAMPLES / "humaneval" / "tasks.jsonl").open()]
STDIO = [json.loads(line) for line in (EXAMPLES / "code" / "stdio.jsonl").open()]
BATCH = 16


@pytest.fixture
def runner(settings: Settings, manager: SandboxManager) -> StageRunner:
    require(manager, "bwrap")
    return StageRunner(settings, manager, default_plugins())


def request_for(task: dict[str, Any], submission: str) -> JobRequest:
    return JobRequest.model_validate(
        {"task": task, "agent": {"name": "submit", "submission": submission}}
    )


async def score(runner: StageRunner, task: dict[str, Any], submission: str) -> RolloutResult:
    """Validate, run the submit agent, evaluate: the run and eval stages of the pipeline."""
    request = request_for(task, submission)
    validate(request, runner.plugins, runner.sandboxes)
    output = await runner.run("job", request, None, 60)
    async with asyncio.timeout(60):  # a worker is never held by a submission
        return await runner.evaluate(request, output)


def humaneval(number: int, **fields: Any) -> dict[str, Any]:
    return {**HUMANEVAL[number], **fields}


async def test_every_canonical_humaneval_solution_scores_1(runner: StageRunner) -> None:
    assert len(HUMANEVAL) == 164
    started = time.monotonic()
    results: list[RolloutResult] = []
    for first in range(0, len(HUMANEVAL), BATCH):
        batch = HUMANEVAL[first : first + BATCH]
        results += await asyncio.gather(
            *(score(runner, t, t["metadata"]["canonical_solution"]) for t in batch)
        )
    failed = {t["task_id"]: r.evaluation for t, r in zip(HUMANEVAL, results, strict=True)}
    failed = {k: v for k, v in failed.items() if not v.get("passed")}
    assert failed == {}
    assert all(r.reward == 1.0 and r.exit_reason == ExitReason.SUBMITTED for r in results)
    print(f"164 canonical HumanEval solutions scored in {time.monotonic() - started:.1f}s")
    assert runner.sandboxes.live == {}


async def test_a_full_function_definition_scores_1(runner: StageRunner) -> None:
    # No import of List: prompt_code (with it) is put before a full definition.
    full = (
        "def has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
        "    ordered = sorted(numbers)\n"
        "    return any(b - a < threshold for a, b in zip(ordered, ordered[1:]))\n"
    )
    result = await score(runner, humaneval(0), full)
    assert result.reward == 1.0, result.evaluation


async def test_a_wrong_solution_scores_0(runner: StageRunner) -> None:
    result = await score(runner, humaneval(0), "    return False\n")
    assert result.reward == 0.0
    details = result.evaluation
    assert details["passed"] is False and details["tests_passed"] == 0
    assert details["outcomes"] == {"wrong_answer": 1}
    assert details["tests"][0]["outcome"] == "wrong_answer"
    assert "AssertionError" in details["tests"][0]["stderr_tail"]
    assert details["reason"].startswith("check: a test assertion failed")


async def test_a_syntax_error_scores_0_with_the_reason(runner: StageRunner) -> None:
    result = await score(runner, humaneval(0), "    return numbers[\n")
    assert result.reward == 0.0
    test = result.evaluation["tests"][0]
    assert test["outcome"] == "syntax_error"
    assert "SyntaxError" in test["message"] and "line" in test["message"]
    assert "SyntaxError" in result.evaluation["reason"]


async def test_a_runtime_error_scores_0_with_the_stderr_tail(runner: StageRunner) -> None:
    result = await score(runner, humaneval(0), "    return numbers[10 ** 9]\n")
    test = result.evaluation["tests"][0]
    assert (result.reward, test["outcome"]) == (0.0, "runtime_error")
    assert "IndexError" in test["message"] and "Traceback" in test["stderr_tail"]


async def test_a_hang_scores_0_timed_out(runner: StageRunner) -> None:
    started = time.monotonic()
    result = await score(runner, humaneval(0, time_limit_s=1), "    while True:\n        pass\n")
    assert time.monotonic() - started < 30
    assert result.reward == 0.0
    assert result.evaluation["tests"][0]["outcome"] == "timed_out"
    assert "timed out" in result.evaluation["reason"]


async def test_a_memory_hog_scores_0(runner: StageRunner) -> None:
    hog = "    hog = b'x' * (1 << 30)\n    return bool(hog)\n"  # 1 GiB against 256 MB
    result = await score(runner, humaneval(0, memory_mb=256), hog)
    assert result.reward == 0.0
    test = result.evaluation["tests"][0]
    assert test["outcome"] == "memory_limit", test
    assert "256 MB" in test["message"]


async def test_the_memory_limit_is_the_tasks(runner: StageRunner) -> None:
    # 300 MB passes with the default 512 MB, though not with 256 MB.
    body = "    block = b'x' * (300 << 20)\n    return len(block) < 0 or " + (
        "any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1 :])\n"
    )
    assert (await score(runner, humaneval(0), body)).reward == 1.0
    assert (await score(runner, humaneval(0, memory_mb=256), body)).reward == 0.0


async def test_an_output_flood_scores_0_with_a_truncated_tail(runner: StageRunner) -> None:
    flood = "    while True:\n        print('flood' * 1000)\n"
    result = await score(runner, humaneval(0), flood)
    assert result.reward == 0.0
    test = result.evaluation["tests"][0]
    assert test["outcome"] == "output_limit"
    assert test["stdout_tail"].startswith("[... ") and len(test["stdout_tail"]) < 3000
    assert test["duration_s"] < 10  # the output cap stopped it, not the time limit


async def test_a_flood_that_ignores_the_cap_times_out(runner: StageRunner) -> None:
    flood = (
        "    while True:\n        try:\n            print('flood' * 1000)\n"
        "        except OSError:\n            pass\n"
    )
    result = await score(runner, humaneval(0, time_limit_s=2), flood)
    test = result.evaluation["tests"][0]
    assert (result.reward, test["outcome"]) == (0.0, "timed_out")
    assert len(json.dumps(result.evaluation)) < 20_000


async def test_leaving_early_does_not_pass(runner: StageRunner) -> None:
    for leave in ("    import sys\n    sys.exit(0)\n", "import os\nos._exit(0)\n"):
        result = await score(runner, humaneval(0), leave)
        assert result.reward == 0.0
        assert result.evaluation["tests"][0]["outcome"] == "exited_early", leave


async def test_a_main_guard_stays_quiet(runner: StageRunner) -> None:
    code = HUMANEVAL[0]["metadata"]["canonical_solution"] + (
        "\n\nif __name__ == '__main__':\n    input()\n"
    )
    assert (await score(runner, humaneval(0), code)).reward == 1.0


@pytest.mark.parametrize("task", STDIO, ids=[t["task_id"] for t in STDIO])
async def test_stdio_reference_solutions_score_1(runner: StageRunner, task: dict[str, Any]) -> None:
    result = await score(runner, task, task["metadata"]["solution"])
    assert result.reward == 1.0, result.evaluation
    details = result.evaluation
    assert details["style"] == "stdio"
    assert details["tests_passed"] == details["tests_total"] == len(task["io_tests"])


async def test_a_wrong_stdio_program_scores_0(runner: StageRunner) -> None:
    task = STDIO[0]  # pair sums
    wrong = "import sys\nfor line in sys.stdin.read().splitlines()[1:]:\n    print(0)\n"
    result = await score(runner, task, wrong)
    assert result.reward == 0.0
    details = result.evaluation
    assert details["tests_passed"] < details["tests_total"]
    failed = next(t for t in details["tests"] if t["outcome"] == "wrong_answer")
    assert failed["mismatch"]["got"] == "0" and "expected" in failed["message"]


async def test_stdio_output_ignores_trailing_whitespace(runner: StageRunner) -> None:
    task = {"task_id": "t", "kind": "code", "io_tests": [{"input": "", "output": "a b\nc\n"}]}
    assert (await score(runner, task, "print('a b   ')\nprint('c')\nprint()\n")).reward == 1.0
    assert (await score(runner, task, "print('a  b')\nprint('c')\n")).reward == 0.0


async def test_stdio_runtime_error_and_skips_after_a_timeout(runner: StageRunner) -> None:
    task = {
        "task_id": "t",
        "kind": "code",
        "time_limit_s": 1,
        "io_tests": [{"input": x, "output": "ok\n"} for x in ("1", "boom", "hang", "1")],
    }
    program = (
        "import sys\nword = sys.stdin.read().strip()\n"
        "if word == 'boom':\n    raise ValueError('boom')\n"
        "while word == 'hang':\n    pass\nprint('ok')\n"
    )
    result = await score(runner, task, program)
    outcomes = [t["outcome"] for t in result.evaluation["tests"]]
    assert outcomes == ["passed", "runtime_error", "timed_out", "skipped"]
    assert "ValueError: boom" in result.evaluation["tests"][1]["stderr_tail"]
    assert result.evaluation["outcomes"] == {
        "passed": 1,
        "runtime_error": 1,
        "timed_out": 1,
        "skipped": 1,
    }


async def test_the_last_fenced_block_is_the_fallback(runner: StageRunner) -> None:
    task = STDIO[0]
    request = request_for(task, "unused")
    reply = (
        "First try:\n```python\nprint('nope')\n```\nBetter:\n```python\n"
        + task["metadata"]["solution"]
        + "```\n"
    )
    messages = [
        {"role": "assistant", "content": "```python\nprint(1)\n```"},
        {"role": "user", "content": "go on"},
        {"role": "assistant", "content": reply},
    ]
    output = RunOutput(ExitReason.MAX_TURNS, submission=None, messages=messages)
    result = await runner.evaluate(request, output)
    assert result.reward == 1.0, result.evaluation
    assert result.evaluation["source"] == "fenced"


async def test_no_code_scores_0_without_a_sandbox(runner: StageRunner) -> None:
    request = request_for(STDIO[0], "unused")
    messages = [{"role": "assistant", "content": "I give up."}]
    output = RunOutput(ExitReason.MAX_TURNS, submission=None, messages=messages)
    result = await runner.evaluate(request, output)
    assert result.reward == 0.0 and "no code" in result.evaluation["reason"]


async def test_an_image_without_python3_is_an_infrastructure_error(tmp_path: Path) -> None:
    class NoPython:
        """A sandbox whose image lacks python3, as bash reports it."""

        workspace = tmp_path

        async def exec(self, command: str, *, timeout: float | None = None) -> ExecResult:
            (tmp_path / ".judge").mkdir(exist_ok=True)
            (tmp_path / ".judge" / "check.err").write_text(
                "bash: line 1: exec: python3: not found\n"
            )
            return ExecResult(exit_code=127, stdout="", stderr="", duration_s=0.01)

        async def read_file(self, path: str) -> bytes:
            return (tmp_path / path).read_bytes()

    with pytest.raises(InfrastructureError, match="no python3"):
        await run_python(
            NoPython(),  # type: ignore[arg-type]
            ["solution.py"],
            "check",
            stdin_path=None,
            time_limit_s=1,
            cap=1024,
        )


def test_submissions_are_taken_from_the_run() -> None:
    fenced = RunOutput(ExitReason.SUBMITTED, submission="```python\n    return 1\n```\nDone.")
    assert submitted_code(fenced) == ("    return 1\n", "submit")
    plain = RunOutput(ExitReason.SUBMITTED, submission="    return 1\n")
    assert submitted_code(plain) == ("    return 1\n", "submit")
    parts = [{"type": "text", "text": "```py\nx = 1\n```"}]
    listed = RunOutput(ExitReason.MAX_TURNS, messages=[{"role": "assistant", "content": parts}])
    assert submitted_code(listed) == ("x = 1\n", "fenced")
    other = RunOutput(ExitReason.MAX_TURNS, messages=[{"role": "assistant", "content": "```\n"}])
    assert submitted_code(other) == (None, None)


def test_programs_are_assembled_the_humaneval_way() -> None:
    prompt = "import math\n\ndef f(x):\n    '''Doc.'''\n"
    assert function_program(prompt, "    return x\n", "f") == prompt + "    return x\n"
    full = "def f(x):\n    return math.floor(x)\n"
    assert function_program(prompt, full, "f") == f"{prompt}\n{full}"
    # A prompt that is prose, not code, is left out before a full definition.
    assert function_program("Write f.", full, "f") == full
    assert defines("async def f (x): pass", "f") and defines("f = len", "f")
    assert not defines("    def f(x): pass", "f") and not defines("def fa(x): pass", "f")


def test_the_sandbox_gets_the_tasks_memory_limit() -> None:
    task = Task.model_validate({**STDIO[0], "memory_mb": 300})
    base = spec_for("bwrap", limits={"memory_mb": 4096, "wall_time_s": 99})
    spec = CodeHandler().sandbox_spec(task, base)
    assert spec is not None and spec.limits.memory_mb == 300 and spec.limits.wall_time_s == 99
    assert base.limits.memory_mb == 4096


def test_prompt_and_tools() -> None:
    handler = CodeHandler()
    function = Task.model_validate(HUMANEVAL[0])
    assert "`has_close_elements`" in handler.system_prompt(function)
    assert "submit" in handler.system_prompt(function)
    stdio = Task.model_validate(STDIO[0])
    assert "standard input" in handler.system_prompt(stdio) and "5s" in handler.system_prompt(stdio)
    assert handler.tools(function) == ["bash", "editor", "submit"]
    assert "code" in default_plugins().handlers.names()


GOOD = {"task_id": "t", "kind": "code", "entry_point": "f", "tests": "def check(c):\n    pass\n"}


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"entry_point": None, "tests": None}, "task.tests"),
        ({"entry_point": "not a name"}, "task.entry_point"),
        ({"entry_point": "class"}, "task.entry_point"),
        ({"entry_point": 3}, "task.entry_point"),
        ({"tests": "assert True"}, "task.tests"),
        ({"tests": None}, "task.tests"),
        ({"io_tests": [{"input": "", "output": ""}]}, "task.io_tests"),
        ({"time_limit_s": 0}, "task.time_limit_s"),
        ({"memory_mb": "lots"}, "task.memory_mb"),
        ({"hidden": 1}, "task.hidden"),
        ({"entry_point": None, "tests": None, "io_tests": []}, "task.io_tests"),
        (
            {"entry_point": None, "tests": None, "io_tests": [{"input": ""}]},
            "task.io_tests.0.output",
        ),
        (
            {"entry_point": None, "tests": None, "io_tests": [{"input": "", "output": ""}]}
            | {"prompt_code": "def f(): ..."},
            "task.prompt_code",
        ),
    ],
)
def test_bad_fields_name_the_field(fields: dict[str, Any], field: str) -> None:
    raw = {k: v for k, v in {**GOOD, **fields}.items() if v is not None}
    task = Task.model_validate(raw)
    with pytest.raises(InvalidInputError) as caught:
        CodeHandler().validate(task)
    assert caught.value.details["field"] == field
    assert field in caught.value.message
