"""The ``code`` task kind: write a Python function (HumanEval style, scored by hidden tests) or a
whole stdin/stdout program (scored against expected outputs), judged in a fresh sandbox."""

from __future__ import annotations

import keyword
import re
import secrets
from collections import Counter
from typing import Any, NoReturn

from pydantic import BaseModel, ConfigDict, Field

from rollserve.errors import InvalidInputError
from rollserve.sandbox.base import Sandbox
from rollserve.schema.jobs import Task
from rollserve.schema.run import RunOutput
from rollserve.schema.sandbox import SandboxSpec
from rollserve.tasks.base import Evaluation, SandboxOpener, kind_fields
from rollserve.tasks.code_judge import (
    JUDGE_DIR,
    Verdict,
    compare_output,
    failure,
    output_cap,
    run_python,
)
from rollserve.tasks.code_program import RUNNER, function_program, submitted_code

FUNCTION_PROMPT = (
    "Write the Python function `{entry_point}` that the problem describes: its signature and "
    "docstring are given. You may write files and run them with the bash tool (python3 is "
    "installed) and edit them with the editor tool to test your code. When you are done, call "
    "the submit tool with your code as its `answer`: the complete function definition, with "
    "the imports and helper functions it needs, as plain Python (no Markdown). Hidden tests "
    "will call `{entry_point}`; they run with a time limit of {time}s and a memory limit of "
    "{memory} MB."
)
STDIO_PROMPT = (
    "Write a complete Python 3 program that solves the problem: it reads the input from "
    "standard input and writes the answer to standard output, exactly in the format the "
    "problem describes. You may write files and run them with the bash tool (python3 is "
    "installed) and edit them with the editor tool to test your program. When you are done, "
    "call the submit tool with the whole program as its `answer`, as plain Python (no "
    "Markdown). Hidden tests run it with a time limit of {time}s per test and a memory limit "
    "of {memory} MB."
)

SOLUTION = "solution.py"


class IoTest(BaseModel):
    """One stdin/stdout test: the program gets ``input`` and must print ``output``."""

    model_config = ConfigDict(extra="forbid")

    input: str
    output: str


class CodeFields(BaseModel):
    """The kind-specific fields of a ``code`` task: ``entry_point`` + ``tests`` (function
    completion) or ``io_tests`` (a stdin/stdout program)."""

    model_config = ConfigDict(extra="forbid")

    entry_point: str | None = Field(None, description="the function the hidden tests call")
    tests: str | None = Field(None, description="hidden test code defining check(candidate)")
    prompt_code: str | None = Field(
        None, description="the signature + docstring a body continues; default: the prompt"
    )
    io_tests: list[IoTest] | None = Field(None, min_length=1, description="stdin/stdout tests")
    time_limit_s: float = Field(10.0, gt=0, le=3600, description="one test run at most")
    memory_mb: int = Field(512, ge=16, description="memory of the program's sandbox")


class CodeHandler:
    """Task kind ``code``: reward 1 when the submitted code passes every hidden test, else 0;
    ``evaluation`` holds each test's outcome and the counts."""

    name = "code"

    def fields(self, task: Task) -> CodeFields:
        """The kind-specific fields; InvalidInputError naming the field if they are wrong."""
        fields = kind_fields(CodeFields, task)
        function = fields.entry_point is not None or fields.tests is not None
        if function and fields.io_tests is not None:
            _bad("io_tests", "give entry_point + tests (a function) or io_tests, not both")
        if not function and fields.io_tests is None:
            _bad(
                "tests",
                "a code task needs entry_point + tests (function completion) or io_tests "
                "(a stdin/stdout program)",
            )
        if function:
            entry = fields.entry_point
            if entry is None or not entry.isidentifier() or keyword.iskeyword(entry):
                _bad("entry_point", f"must be a Python function name (got {entry!r})")
            if fields.tests is None or not re.search(r"^def check\s*\(", fields.tests, re.M):
                _bad("tests", "must be Python code defining check(candidate)")
        elif fields.prompt_code is not None:
            _bad("prompt_code", "belongs to function tasks (entry_point + tests), not io_tests")
        return fields

    def validate(self, task: Task) -> None:
        self.fields(task)

    def system_prompt(self, task: Task) -> str:
        fields = self.fields(task)
        limits = {"time": f"{fields.time_limit_s:g}", "memory": fields.memory_mb}
        if fields.io_tests is not None:
            return STDIO_PROMPT.format(**limits)
        return FUNCTION_PROMPT.format(entry_point=fields.entry_point, **limits)

    def tools(self, task: Task) -> list[str]:
        return ["bash", "editor", "submit"]

    def sandbox_spec(self, task: Task, base: SandboxSpec) -> SandboxSpec | None:
        # The run sandbox and the evaluation's fresh one both get the task's memory limit.
        memory = self.fields(task).memory_mb
        limits = base.limits.model_copy(update={"memory_mb": memory})
        return base.model_copy(update={"limits": limits})

    async def prepare(self, task: Task, sandbox: Sandbox) -> None:
        return None

    async def evaluate(
        self, task: Task, output: RunOutput, open_sandbox: SandboxOpener
    ) -> Evaluation:
        fields = self.fields(task)
        style = "stdio" if fields.io_tests is not None else "function"
        code, source = submitted_code(output)
        if code is None:
            reason = (
                "no code: the submit tool was not called with an answer, and the last "
                "assistant message has no ```python block"
            )
            return Evaluation(0.0, {"style": style, "passed": False, "reason": reason})
        async with open_sandbox() as sandbox:
            if fields.io_tests is not None:
                verdicts = await _judge_stdio(sandbox, fields, fields.io_tests, code)
            else:
                verdicts = [await _judge_function(sandbox, fields, task.prompt, code)]
        names = [f"test {i}" for i in range(len(verdicts))] if style == "stdio" else ["check"]
        passed = all(v.outcome == "passed" for v in verdicts)
        details: dict[str, Any] = {
            "style": style,
            "source": source,
            "passed": passed,
            "tests_total": len(verdicts),
            "tests_passed": sum(v.outcome == "passed" for v in verdicts),
            "outcomes": dict(Counter(v.outcome for v in verdicts)),
            "tests": [v.details(n) for v, n in zip(verdicts, names, strict=True)],
        }
        if not passed:
            name, first = next((n, v) for v, n in zip(verdicts, names, strict=True) if v.message)
            details["reason"] = f"{name}: {first.message}"
        return Evaluation(1.0 if passed else 0.0, details)


async def _judge_function(sandbox: Sandbox, fields: CodeFields, prompt: str, code: str) -> Verdict:
    """Run the program + hidden tests + ``check(entry_point)``; it passes when it gets to the
    end (a random marker printed last), so an early ``sys.exit(0)`` does not pass."""
    assert fields.entry_point is not None and fields.tests is not None
    marker = f"rollserve-tests-done-{secrets.token_hex(16)}"
    program = (
        f"{function_program(fields.prompt_code or prompt, code, fields.entry_point)}\n\n"
        f"{fields.tests}\n\ncheck({fields.entry_point})\n"
    )
    await sandbox.write_file(SOLUTION, program.encode())
    run = await run_python(
        sandbox,
        ["-c", RUNNER, SOLUTION, marker],
        "check",
        stdin_path=None,
        time_limit_s=fields.time_limit_s,
        cap=output_cap(),
    )
    failed = failure(run, fields.memory_mb)
    if failed is not None:
        return failed
    if _last_nonempty(run.stdout) != marker:
        message = "the program exited before the tests finished (sys.exit or os._exit?)"
        return Verdict("exited_early", message, run)
    return Verdict("passed", "", run)


async def _judge_stdio(
    sandbox: Sandbox, fields: CodeFields, tests: list[IoTest], code: str
) -> list[Verdict]:
    """Each test in turn in the same sandbox; after one times out the rest are skipped."""
    await sandbox.write_file(SOLUTION, code.encode())
    for index, test in enumerate(tests):
        await sandbox.write_file(f"{JUDGE_DIR}/{index}.in", test.input.encode())
    verdicts: list[Verdict] = []
    for index, test in enumerate(tests):
        if verdicts and verdicts[-1].outcome in ("timed_out", "skipped"):
            verdicts.append(Verdict("skipped", "not run: an earlier test timed out"))
            continue
        run = await run_python(
            sandbox,
            [SOLUTION],
            str(index),
            stdin_path=f"{JUDGE_DIR}/{index}.in",
            time_limit_s=fields.time_limit_s,
            cap=output_cap(test.output),
        )
        verdict = failure(run, fields.memory_mb)
        if verdict is None:
            mismatch = compare_output(test.output, run.stdout)
            if mismatch is None:
                verdict = Verdict("passed", "", run)
            else:
                message = (
                    f"wrong answer at line {mismatch['line']}: expected "
                    f"{mismatch['expected']!r}, got {mismatch['got']!r}"
                )
                verdict = Verdict("wrong_answer", message, run, {"mismatch": mismatch})
        verdicts.append(verdict)
    return verdicts


def _last_nonempty(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _bad(name: str, problem: str) -> NoReturn:
    raise InvalidInputError(f"task.{name}: {problem}", field=f"task.{name}")
