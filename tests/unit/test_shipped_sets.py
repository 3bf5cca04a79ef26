"""The task sets shipped under examples/: every line is a valid job's task that its handler
accepts, and every math reference answer is one math-verify reads and verifies."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rollserve.node import default_plugins
from rollserve.schema.jobs import JobRequest
from rollserve.tasks.math import answers_match

EXAMPLES = Path(__file__).parents[2] / "examples"
SETS = {
    "humaneval/tasks.jsonl": ("code", 164),
    "math/tasks.jsonl": ("math", 50),
    "code/stdio.jsonl": ("code", 5),
}


def lines(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (EXAMPLES / name).read_text().splitlines()]


@pytest.mark.parametrize("name", sorted(SETS))
def test_every_line_is_a_valid_task(name: str) -> None:
    kind, at_least = SETS[name]
    handlers = default_plugins().handlers
    tasks = [JobRequest.model_validate({"task": line}).task for line in lines(name)]
    assert len(tasks) >= at_least
    assert len({t.task_id for t in tasks}) == len(tasks)
    for task in tasks:
        assert task.kind == kind and task.prompt.strip()
        handlers.get(task.kind).validate(task)
    assert (EXAMPLES / name).parent.joinpath("README.md").is_file()


def test_humaneval_is_complete_with_canonical_solutions() -> None:
    tasks = lines("humaneval/tasks.jsonl")
    assert [t["task_id"] for t in tasks] == [f"HumanEval/{i}" for i in range(164)]
    assert all(t["metadata"]["canonical_solution"].strip() for t in tasks)


def test_stdio_tasks_carry_a_reference_solution() -> None:
    for task in lines("code/stdio.jsonl"):
        assert task["io_tests"] and "metadata" in task
        compile(task["metadata"]["solution"], task["task_id"], "exec")


def test_every_math_answer_parses_and_verifies_against_itself() -> None:
    from math_verify import parse, verify

    for task in lines("math/tasks.jsonl"):
        answer = task["answer"]
        gold = parse(f"${answer}$", parsing_timeout=None)
        assert gold, f"{task['task_id']}: math-verify cannot parse {answer!r}"
        again = parse(f"${answer}$", parsing_timeout=None)
        assert verify(gold, again, timeout_seconds=None), task["task_id"]
        assert answers_match(answer, answer)
        assert answers_match(answer, f"\\boxed{{{answer}}}"), task["task_id"]
