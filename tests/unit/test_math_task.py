"""The math task: reference-answer validation, answer extraction and math-verify scoring."""

from __future__ import annotations

import asyncio
import threading
from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest

from rollserve.errors import InvalidInputError
from rollserve.sandbox.base import Sandbox
from rollserve.schema.jobs import ExitReason, Task
from rollserve.schema.run import RunOutput
from rollserve.schema.sandbox import LocalSpec
from rollserve.tasks.base import Evaluation
from rollserve.tasks.math import MathHandler, answers_match, last_boxed


def task(answer: Any = "42", **extra: Any) -> Task:
    fields = {} if answer is None else {"answer": answer}
    return Task(task_id="t1", kind="math", prompt="What is 6*7?", **fields, **extra)


def no_sandbox() -> AbstractAsyncContextManager[Sandbox]:
    raise AssertionError("math evaluation must not open a sandbox")


def evaluate(answer: Any, submission: str | None, messages: list[Any] | None = None) -> Evaluation:
    output = RunOutput(ExitReason.SUBMITTED, submission=submission, messages=messages or [])
    return asyncio.run(MathHandler().evaluate(task(answer), output, no_sandbox))


@pytest.mark.parametrize("answer", ["42", " x^2 ", 7, 0.5, -3])
def test_valid_answers(answer: Any) -> None:
    MathHandler().validate(task(answer))


@pytest.mark.parametrize("answer", [None, "", "   ", True, [1], {"a": 1}, float("nan")])
def test_invalid_answer_names_the_field(answer: Any) -> None:
    with pytest.raises(InvalidInputError, match="'answer'") as caught:
        MathHandler().validate(task(answer))
    assert caught.value.details["field"] == "task.answer"


@pytest.mark.parametrize(
    ("gold", "submission"),
    [
        ("1/2", "0.5"),
        ("0.5", "\\frac{1}{2}"),
        ("\\frac{1}{2}", "1/2"),
        (0.5, "\\frac12"),
        (42, "42"),
        ("42", " 42 "),
        ("42", "$42$"),
        ("42", "\\boxed{42}"),
        ("5", "x = 5"),
        ("x^2+1", "1 + x^2"),
        ("\\sqrt{2}", "2^{1/2}"),
        ("\\frac{\\sqrt{3}}{2}", "\\frac{\\sqrt 3}{2}"),
        ("1,000", "1000"),
    ],
)
def test_equivalent_forms_score_1(gold: Any, submission: str) -> None:
    result = evaluate(gold, submission)
    assert result.reward == 1.0
    assert result.details == {
        "answer": submission.strip(),
        "expected": str(gold),
        "correct": True,
        "source": "submit",
    }


@pytest.mark.parametrize(
    ("gold", "submission"),
    [("42", "41"), ("1/2", "0.51"), ("3", "-3"), ("1", "x^2+1"), ("\\frac{1}{2}", "2")],
)
def test_wrong_answers_score_0(gold: str, submission: str) -> None:
    result = evaluate(gold, submission)
    assert result.reward == 0.0
    assert result.details["correct"] is False
    assert "reason" not in result.details


def test_boxed_answer_in_the_last_assistant_message() -> None:
    messages = [
        {"role": "user", "content": "What is 1/2 + 0?"},
        {"role": "assistant", "content": "Maybe \\boxed{3}."},
        {"role": "tool", "content": "0.5"},
        {"role": "assistant", "content": "First \\boxed{2}, no: \\boxed{\\frac{1}{2}}."},
    ]
    result = evaluate("0.5", None, messages)
    assert result.reward == 1.0
    assert result.details["answer"] == "\\frac{1}{2}"
    assert result.details["source"] == "boxed"


def test_submission_wins_over_boxed() -> None:
    messages = [{"role": "assistant", "content": "\\boxed{7}"}]
    assert evaluate("7", "8", messages).reward == 0.0


def test_boxed_in_content_parts() -> None:
    messages = [{"role": "assistant", "content": [{"type": "text", "text": "\\boxed{9}"}]}]
    assert evaluate(9, None, messages).reward == 1.0


@pytest.mark.parametrize(
    "messages",
    [
        [],
        [{"role": "user", "content": "\\boxed{42}"}],
        [{"role": "assistant", "content": "no box here"}],
        [{"role": "assistant", "content": "\\boxed{42}"}, {"role": "assistant", "content": "hm"}],
        [{"role": "assistant", "content": None, "tool_calls": []}],
    ],
)
def test_nothing_submitted_scores_0_with_a_reason(messages: list[Any]) -> None:
    for submission in (None, "  "):
        result = evaluate("42", submission, messages)
        assert result.reward == 0.0
        assert result.details["answer"] is None
        assert result.details["expected"] == "42"
        assert result.details["correct"] is False
        assert "no answer" in result.details["reason"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("\\boxed{5}", "5"),
        ("a \\boxed{1} b \\boxed{2} c", "2"),
        ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt{3}}{2}"),
        ("\\boxed{\\{1, 2\\} \\cup {3}}", "\\{1, 2\\} \\cup {3}"),
        ("\\boxed{\\left\\{1\\right.}", "\\left\\{1\\right."),
        ("\\boxed{\\}}", "\\}"),
        ("\\boxed {x}", "x"),
        ("\\fbox{y}", "y"),
        ("\\boxed{1} and then \\boxed{\\frac{1}{2", "1"),  # the last one was cut off
        ("\\boxed{}", None),
        ("no box", None),
        ("\\boxed{unclosed", None),
    ],
)
def test_last_boxed(text: str, expected: str | None) -> None:
    assert last_boxed(text) == expected


def test_verification_works_off_the_main_thread() -> None:
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(answers_match("\\frac{1}{2}", "0.5"))
            outcome.append(evaluate("\\sqrt{4}", "2").reward)
        except Exception as exc:  # reported below, with the thread's traceback
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert outcome == [True, 1.0]


async def test_evaluate_in_the_event_loop() -> None:
    output = RunOutput(ExitReason.MAX_TURNS, submission="0.25")
    result = await MathHandler().evaluate(task("1/4"), output, no_sandbox)
    assert result.reward == 1.0


def test_handler_surface() -> None:
    handler = MathHandler()
    base = LocalSpec()
    assert handler.name == "math"
    assert handler.sandbox_spec(task(), base) is base
    assert handler.tools(task()) == ["bash", "submit"]
    prompt = handler.system_prompt(task())
    assert "submit" in prompt
    assert "bash" in prompt
    asyncio.run(handler.prepare(task(), sandbox=None))  # type: ignore[arg-type]


async def test_a_comparison_that_never_ends_holds_only_its_checker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """math-verify looping on an expression: the answer is judged not a match after the
    limit, at most two checker threads are held, and the default thread pool — which every
    store call uses — stays free."""
    import rollserve.tasks.math as math_task

    release = threading.Event()
    started: list[str] = []

    def stuck(expected: str, answer: str) -> bool:
        started.append(answer)
        release.wait()
        return True

    monkeypatch.setattr(math_task, "answers_match", stuck)
    monkeypatch.setattr(math_task, "_CHECK_S", 0.5)
    handler = MathHandler()
    outputs = [RunOutput(ExitReason.SUBMITTED, submission=f"{i}+0") for i in range(4)]
    results = await asyncio.gather(*(handler.evaluate(task("1"), o, no_sandbox) for o in outputs))
    assert [r.reward for r in results] == [0.0] * 4
    assert all("took over" in r.details["reason"] for r in results)
    assert len(started) == 2  # the other two never got a checker
    assert await asyncio.to_thread(lambda: "free") == "free"
    release.set()
