"""The ``lookup`` task kind: a question whose answer is written somewhere in the sandbox's
workspace. The agent has to look (the bash tool) and submit what it found; a policy that does
not read the sandbox cannot know the answer."""

from __future__ import annotations

import posixpath
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rollserve.sandbox.base import Sandbox
from rollserve.schema.jobs import Task
from rollserve.schema.run import RunOutput
from rollserve.schema.sandbox import SandboxSpec
from rollserve.tasks.base import Evaluation, SandboxOpener, kind_fields

SYSTEM_PROMPT = (
    "Answer the question. The answer is written in the files of your workspace: look with the "
    "bash tool, then call the submit tool with only the answer as its `answer`."
)

MAX_FILES = 256
MAX_FILE_BYTES = 1 << 20


class LookupFields(BaseModel):
    """A lookup task's own fields."""

    model_config = ConfigDict(extra="ignore")

    files: dict[str, str] = Field(
        min_length=1,
        max_length=MAX_FILES,
        description="workspace-relative path → text, laid out before the agent starts",
    )
    answer: str = Field(min_length=1, max_length=10_000, description="the reference answer")

    @field_validator("files")
    @classmethod
    def _paths(cls, files: dict[str, str]) -> dict[str, str]:
        for path, text in files.items():
            normal = posixpath.normpath(path) if path else ""
            if not path or path.startswith("/") or normal.startswith("..") or "\x00" in path:
                raise ValueError(f"{path!r} is not a relative path inside the workspace")
            if normal == "." or normal.split("/")[0] == ".git":
                raise ValueError(f"{path!r} does not name a file of the workspace")
            if len(text.encode("utf-8", "surrogatepass")) > MAX_FILE_BYTES:
                raise ValueError(f"{path!r} is larger than {MAX_FILE_BYTES} bytes")
        return files

    @field_validator("answer")
    @classmethod
    def _answer(cls, answer: str) -> str:
        if not answer.strip():
            raise ValueError("the answer is blank")
        return answer.strip()


class LookupHandler:
    """Task kind ``lookup``: ``task.files`` are written into the workspace; reward 1 when the
    submitted answer, stripped of surrounding whitespace, equals ``task.answer``, else 0."""

    name = "lookup"

    def validate(self, task: Task) -> None:
        kind_fields(LookupFields, task)

    def system_prompt(self, task: Task) -> str:
        return SYSTEM_PROMPT

    def tools(self, task: Task) -> list[str]:
        return ["bash", "submit"]

    def sandbox_spec(self, task: Task, base: SandboxSpec) -> SandboxSpec | None:
        return base

    async def prepare(self, task: Task, sandbox: Sandbox) -> None:
        for path, text in kind_fields(LookupFields, task).files.items():
            await sandbox.write_file(path, text.encode())

    async def evaluate(
        self, task: Task, output: RunOutput, open_sandbox: SandboxOpener
    ) -> Evaluation:
        expected = kind_fields(LookupFields, task).answer
        answer = output.submission.strip() if output.submission is not None else None
        details: dict[str, Any] = {"answer": answer, "expected": expected}
        if answer is None:
            details["reason"] = "no answer: the submit tool was not called with one"
        details["correct"] = answer == expected
        return Evaluation(reward=1.0 if details["correct"] else 0.0, details=details)
