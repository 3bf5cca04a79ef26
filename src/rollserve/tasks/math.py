"""The ``math`` task kind: a problem with a reference answer, scored with math-verify."""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
import threading
from typing import Any

from rollserve.errors import InfrastructureError, InvalidInputError
from rollserve.sandbox.base import Sandbox
from rollserve.schema.jobs import Task
from rollserve.schema.run import RunOutput
from rollserve.schema.sandbox import SandboxSpec
from rollserve.tasks.base import Evaluation, SandboxOpener

SYSTEM_PROMPT = (
    "Solve the math problem. You may run shell commands with the bash tool to compute or check "
    "intermediate results. When you are done, call the submit tool with only the final answer "
    "(a number or a LaTeX expression, such as 42 or \\frac{1}{2}) as its `answer`."
)

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_CHECKERS = 2  # threads that compare answers; a pathological one holds only these
_CHECK_S = 10.0  # one comparison at most; past it the answer does not match


class MathHandler:
    """Task kind ``math``: reward 1 when the submitted answer equals ``task.answer``
    mathematically (``1/2``, ``0.5`` and ``\\frac{1}{2}`` are one answer), else 0."""

    name = "math"

    def __init__(self) -> None:
        # Its own threads, at most _CHECKERS: math-verify's timeouts only work on the main
        # thread, so an expression that makes it loop holds one of these — never a thread the
        # store's calls need — and, being a daemon, never holds up the process's exit.
        self._lock = threading.Lock()
        self._checking = 0

    def validate(self, task: Task) -> None:
        self.expected(task)

    def expected(self, task: Task) -> str:
        """The reference answer as text; InvalidInputError naming ``task.answer`` if unusable."""
        answer = (task.model_extra or {}).get("answer")
        if isinstance(answer, str) and answer.strip():
            return answer.strip()
        finite = isinstance(answer, int | float) and math.isfinite(answer)
        if finite and not isinstance(answer, bool):
            return str(answer)
        got = "it is missing" if answer is None else f"got {answer!r}"
        raise InvalidInputError(
            f"a math task needs 'answer', the reference answer as a non-empty string or a "
            f"finite number ({got})",
            field="task.answer",
        )

    def sandbox_spec(self, task: Task, base: SandboxSpec) -> SandboxSpec | None:
        return base  # the agent may compute with the bash tool

    async def prepare(self, task: Task, sandbox: Sandbox) -> None:
        return None

    def system_prompt(self, task: Task) -> str:
        return SYSTEM_PROMPT

    def tools(self, task: Task) -> list[str]:
        return ["bash", "submit"]

    async def evaluate(
        self, task: Task, output: RunOutput, open_sandbox: SandboxOpener
    ) -> Evaluation:
        expected = self.expected(task)
        answer, source = submitted_answer(output)
        details: dict[str, Any] = {"answer": answer, "expected": expected, "correct": False}
        if answer is None:
            details["reason"] = (
                "no answer: the submit tool was not called with one, and the last assistant "
                "message has no \\boxed{...}"
            )
            return Evaluation(reward=0.0, details=details)
        details["source"] = source
        try:
            async with asyncio.timeout(_CHECK_S):
                details["correct"] = await self._matches(expected, answer)
        except TimeoutError:
            details["reason"] = f"comparing the answer took over {_CHECK_S:.0f} s: not a match"
        return Evaluation(reward=1.0 if details["correct"] else 0.0, details=details)

    async def _matches(self, expected: str, answer: str) -> bool:
        """``answers_match`` on a checker thread, once one of the _CHECKERS is free."""
        while True:
            with self._lock:
                if self._checking < _CHECKERS:
                    self._checking += 1
                    break
            await asyncio.sleep(0.05)
        loop = asyncio.get_running_loop()
        outcome: asyncio.Future[bool] = loop.create_future()

        def settle(value: bool | None, error: BaseException | None) -> None:
            if outcome.done():  # the caller gave up waiting
                return
            if error is not None:
                outcome.set_exception(error)
            else:
                outcome.set_result(bool(value))

        def check() -> None:
            try:
                value, error = answers_match(expected, answer), None
            except Exception as exc:  # handed to the caller
                value, error = None, exc
            finally:
                with self._lock:
                    self._checking -= 1
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits
                loop.call_soon_threadsafe(settle, value, error)

        threading.Thread(target=check, name="rollserve-math", daemon=True).start()
        return await outcome


def submitted_answer(output: RunOutput) -> tuple[str | None, str | None]:
    """The answer and where it came from: the submit tool's answer (``"submit"``), else the
    last ``\\boxed{...}`` of the last assistant message (``"boxed"``); else ``(None, None)``."""
    if output.submission is not None and output.submission.strip():
        return output.submission.strip(), "submit"
    for message in reversed(output.messages):
        if message.get("role") == "assistant":
            boxed = last_boxed(_text(message.get("content")))
            return (boxed, "boxed") if boxed else (None, None)
    return None, None


def last_boxed(text: str) -> str | None:
    """The content of the last complete ``\\boxed{...}`` (braces balanced) in ``text``."""
    for match in reversed(list(_BOXED.finditer(text))):
        depth, pos = 1, match.end()
        while pos < len(text):
            char = text[pos]
            if char == "\\":  # an escaped brace (\{ \}) is a literal, not a group
                pos += 1
            elif char in "{}":
                depth += 1 if char == "{" else -1
                if depth == 0:
                    content = text[match.end() : pos].strip()
                    if content:
                        return content
                    break
            pos += 1
    return None


def answers_match(expected: str, answer: str) -> bool:
    """Whether ``answer`` equals ``expected`` mathematically. CPU-bound and signal-free, so it
    may run in any thread."""
    if _squash(expected) == _squash(answer):
        return True
    try:
        from math_verify import parse, verify
    except ImportError as exc:
        raise InfrastructureError(
            "the math task needs math-verify: pip install math-verify"
        ) from exc
    # math-verify's timeouts use SIGALRM, which only works in the main thread: turn them off.
    gold = parse(_as_latex(expected), parsing_timeout=None)
    target = parse(_as_latex(answer), parsing_timeout=None)
    return bool(verify(gold, target, timeout_seconds=None))


def _as_latex(text: str) -> str:
    """A bare answer put in math mode, so that math-verify reads it as one expression."""
    if any(mark in text for mark in ("$", "\\boxed", "\\(", "\\[")):
        return text
    return f"${text}$"


def _squash(text: str) -> str:
    return "".join(text.split()).strip("$")


def _text(content: Any) -> str:
    """The text of an OpenAI message content: a string, or a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""
