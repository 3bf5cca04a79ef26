"""A ``keyword`` task kind: reward = the fraction of the task's ``keywords`` (characters or
words) that appear in the model's final reply. Deterministic, graded and without a sandbox, so
that even a random tiny model gets rewards that differ between samples — a training signal for
examples and tests of the trainer side."""

from __future__ import annotations

from typing import Any

from rollserve.errors import InvalidInputError
from rollserve.sandbox.base import Sandbox
from rollserve.schema.jobs import Task
from rollserve.schema.run import RunOutput
from rollserve.schema.sandbox import SandboxSpec
from rollserve.tasks.base import Evaluation, SandboxOpener

SYSTEM_PROMPT = "Reply to the user in a few words."


class KeywordHandler:
    """Task kind ``keyword``: ``task.keywords`` (a non-empty list of non-empty strings) are
    looked for in the final reply (the last assistant message; a submission, when an agent
    makes one). The tool agent gets no tools: its first reply without a tool call ends the
    episode; a malformed call is told to the model, which then has another turn."""

    name = "keyword"

    def keywords(self, task: Task) -> list[str]:
        words = (task.model_extra or {}).get("keywords")
        if (
            not isinstance(words, list)
            or not words
            or not all(isinstance(w, str) and w for w in words)
        ):
            raise InvalidInputError(
                "a keyword task needs 'keywords', a non-empty list of non-empty strings",
                field="task.keywords",
            )
        return words

    def validate(self, task: Task) -> None:
        self.keywords(task)

    def system_prompt(self, task: Task) -> str:
        return SYSTEM_PROMPT

    def tools(self, task: Task) -> list[str]:
        return []  # the reply is the answer; a short prompt keeps a CPU model fast

    def sandbox_spec(self, task: Task, base: SandboxSpec) -> SandboxSpec | None:
        return None

    async def prepare(self, task: Task, sandbox: Sandbox) -> None:
        return None

    async def evaluate(
        self, task: Task, output: RunOutput, open_sandbox: SandboxOpener
    ) -> Evaluation:
        words = self.keywords(task)
        reply = final_reply(output)
        found = [w for w in words if w in reply]
        details: dict[str, Any] = {"reply": reply[:2000], "found": found, "of": len(words)}
        return Evaluation(reward=len(found) / len(words), details=details)


def final_reply(output: RunOutput) -> str:
    """The submitted answer, else the text of the last assistant message."""
    if output.submission:
        return output.submission
    for message in reversed(output.messages):
        if message.get("role") == "assistant":
            content = message.get("content")
            return content if isinstance(content, str) else ""
    return ""
