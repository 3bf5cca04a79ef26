"""The lookup task: fields checked with the field named, files laid out in a real bwrap
sandbox, scoring by exact answer; the bench's task family (disjoint splits) and its warm
start's view of an episode, which must be what the tool agent shows the model."""

from __future__ import annotations

import asyncio
from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest

from rollserve.agents.tools import Toolbox
from rollserve.errors import InvalidInputError
from rollserve.learn.policy import observation
from rollserve.learn.tasks import FILES, SECRET, instances, split_numbers
from rollserve.llm.toolcalls import ToolCall
from rollserve.sandbox import SandboxManager, spec_for
from rollserve.sandbox.base import Sandbox
from rollserve.schema.jobs import ExitReason, Task
from rollserve.schema.run import RunOutput
from rollserve.tasks.base import Evaluation
from rollserve.tasks.lookup import LookupHandler
from tests.conformance.conftest import require


def task(**fields: Any) -> Task:
    given = {"files": {"red.txt": "602\n", "notes/deep.txt": "x"}, "answer": "602", **fields}
    return Task(task_id="t1", kind="lookup", prompt="What is in red.txt?", **given)


def no_sandbox() -> AbstractAsyncContextManager[Sandbox]:
    raise AssertionError("lookup evaluation must not open a sandbox")


def evaluate(submission: str | None) -> Evaluation:
    output = RunOutput(ExitReason.SUBMITTED, submission=submission)
    return asyncio.run(LookupHandler().evaluate(task(), output, no_sandbox))


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"files": None}, "task.files"),
        ({"files": {}}, "task.files"),
        ({"files": {"/etc/passwd": "x"}}, "task.files"),
        ({"files": {"../up.txt": "x"}}, "task.files"),
        ({"files": {"a/../../up.txt": "x"}}, "task.files"),
        ({"files": {".git/config": "x"}}, "task.files"),
        ({"files": {".": "x"}}, "task.files"),
        ({"files": {"a.txt": 3}}, "task.files"),
        ({"answer": "  "}, "task.answer"),
        ({"answer": None}, "task.answer"),
    ],
)
def test_bad_fields_are_refused_naming_the_field(fields: dict[str, Any], named: str) -> None:
    with pytest.raises(InvalidInputError) as caught:
        LookupHandler().validate(task(**fields))
    assert caught.value.details["field"].startswith(named)


def test_the_answer_must_match_exactly_once_stripped() -> None:
    assert evaluate("602").reward == 1.0
    assert evaluate(" 602\n").reward == 1.0
    assert evaluate("603").reward == 0.0
    assert evaluate("602 is the answer").reward == 0.0
    missing = evaluate(None)
    assert missing.reward == 0.0 and "no answer" in missing.details["reason"]


async def test_the_files_are_in_the_workspace_and_cat_shows_what_the_warm_start_expects(
    manager: SandboxManager,
) -> None:
    require(manager, "bwrap")
    box = await manager.start(spec_for("bwrap"))
    toolbox = Toolbox(box, ["bash"], command_timeout_s=30.0)
    try:
        await LookupHandler().prepare(task(), box)
        seen = await toolbox.call(ToolCall("bash", {"command": "cat red.txt"}, "call_0"))
        assert seen.output == observation("602\n")
        deep = await toolbox.call(ToolCall("bash", {"command": "cat notes/deep.txt"}, "call_1"))
        assert deep.output == "x\n[exit code 0]"
    finally:
        await toolbox.close()
        await manager.close(box)


def test_the_bench_family_splits_share_no_number_and_no_case() -> None:
    train, held = split_numbers("train"), split_numbers("heldout")
    assert not set(train) & set(held) and len(train) + len(held) == 900
    training, heldout = instances("train", 400, 0), instances("heldout", 64, 0)
    assert not {i.case for i in training} & {i.case for i in heldout}
    assert len({i.case for i in training}) == 400
    for split, group in (("train", training), ("heldout", heldout)):
        pool = set(split_numbers(split))  # type: ignore[arg-type]
        for instance in group:
            assert set(instance.numbers.values()) <= pool
            files = instance.task()["files"]
            assert set(files) == {f"{name}.txt" for name in (SECRET, *FILES)}
            assert len(set(files.values())) == len(files)  # a wrong file holds a wrong number
            assert files[f"{SECRET}.txt"] == f"{instance.answer}\n"
            LookupHandler().validate(Task.model_validate(instance.task()))
    # The secret differs between instances: only reading it in the sandbox finds it.
    assert len({i.answer for i in heldout}) > len(heldout) // 2
    assert instances("heldout", 64, 0) == heldout  # the same seed, the same instances
