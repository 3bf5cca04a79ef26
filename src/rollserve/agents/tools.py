"""The tool agent's tools (``bash``, ``editor``, ``submit``): their OpenAI function schemas and
how a call runs in the sandbox. A call that cannot run becomes an observation, never an
exception; only a failure of the sandbox itself (an infrastructure error) is raised."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from rollserve.agents.editor import COMMANDS, Editor
from rollserve.errors import InvalidCommandError, ShellExitedError
from rollserve.llm.toolcalls import ToolCall
from rollserve.sandbox.base import Sandbox
from rollserve.schema.sandbox import SandboxLimits
from rollserve.schema.shell import CommandResult
from rollserve.shell import ShellSession


def _editor_schema() -> dict[str, Any]:
    """The ``editor`` function (DESIGN.md, "Contract details"); built afresh for each caller."""
    return {
        "description": "View, create and edit text files in the workspace. view shows a file with "
        "line numbers (or a directory's files two levels deep); create writes a new file; "
        "str_replace replaces one exact occurrence of a text; insert adds text after a line; "
        "undo_edit reverts the last edit of a file.",
        "parameters": {
            "type": "object",
            "properties": {
                "command": {"type": "string", "enum": list(COMMANDS), "description": "what to do"},
                "path": {
                    "type": "string",
                    "description": "the file or directory, relative to the workspace root or "
                    "absolute inside it (/workspace/...)",
                },
                "file_text": {"type": "string", "description": "create: the new file's content"},
                "old_str": {
                    "type": "string",
                    "description": "str_replace: the exact text to replace (whitespace included); "
                    "it must occur exactly once in the file",
                },
                "new_str": {
                    "type": "string",
                    "description": "str_replace: the replacement (default: empty, deleting "
                    "old_str); insert: the text to insert",
                },
                "insert_line": {
                    "type": "integer",
                    "description": "insert: the line after which new_str goes (0: the top)",
                },
                "view_range": {
                    "type": "array",
                    "items": {"type": "integer"},
                    "description": "view: [start, end] lines of a file, from 1, inclusive; "
                    "end -1 means to the end of the file",
                },
            },
            "required": ["command", "path"],
        },
    }


def tool_schemas(names: list[str]) -> list[dict[str, Any]]:
    """OpenAI function schemas of the named tools (DESIGN.md, "Contract details")."""
    known = {
        "bash": {
            "description": "Run a bash command in the workspace (a persistent shell: cwd and "
            "environment carry over). Commands must not wait for keyboard input.",
            "parameters": {
                "type": "object",
                "properties": {
                    "command": {"type": "string", "description": "the command to run"},
                    "timeout": {"type": "number", "description": "seconds (optional)"},
                },
                "required": ["command"],
            },
        },
        "editor": _editor_schema(),
        "submit": {
            "description": "Finish: submit the final answer. For a repository task, call it "
            "without an answer: the changes in the workspace are the submission.",
            "parameters": {
                "type": "object",
                "properties": {"answer": {"type": "string", "description": "the final answer"}},
                "required": [],
            },
        },
    }
    return [{"type": "function", "function": {"name": n, **known[n]}} for n in names]


@dataclass
class ToolOutcome:
    """What a tool call gave back to the model, and whether it ended the episode."""

    output: str
    submitted: bool = False
    submission: str | None = None
    error: bool = False
    command: CommandResult | None = None  # bash: how the command ended


class Toolbox:
    """Runs tool calls for one episode in its sandbox (one persistent shell)."""

    def __init__(self, sandbox: Sandbox | None, names: list[str], command_timeout_s: float) -> None:
        self.sandbox = sandbox
        self.names = names
        self.command_timeout_s = command_timeout_s
        self._shell: ShellSession | None = None
        self._editor: Editor | None = None

    async def close(self) -> None:
        if self._shell is not None:
            await self._shell.close()
            self._shell = None

    async def call(self, call: ToolCall) -> ToolOutcome:
        if call.name not in self.names:
            return ToolOutcome(
                f"unknown tool {call.name!r}; the tools are: {', '.join(self.names)}", error=True
            )
        if call.name == "bash":
            return await self._bash(call.arguments)
        if call.name == "editor":
            return await self._edit(call.arguments)
        return await self._submit(call.arguments)

    async def _bash(self, arguments: dict[str, Any]) -> ToolOutcome:
        command = arguments.get("command")
        if not isinstance(command, str) or not command.strip():
            return ToolOutcome("bash needs a non-empty string argument 'command'", error=True)
        timeout = self.command_timeout_s
        asked = arguments.get("timeout")
        if isinstance(asked, int | float) and asked > 0:
            timeout = min(float(asked), timeout)
        if self.sandbox is None:
            return ToolOutcome("this task has no sandbox: bash is unavailable", error=True)
        if self._shell is None or not self._shell.alive:
            self._shell = await ShellSession.open(self.sandbox)
        before = self.sandbox.limit_events()
        try:
            result = await self._shell.run(command, timeout=timeout)
        except InvalidCommandError as exc:  # the model's command cannot be typed (a NUL byte)
            return ToolOutcome(exc.message, error=True)
        except ShellExitedError as exc:
            await self.close()
            return ToolOutcome(f"{exc.message}; the next command starts a new shell", error=True)
        if result.waiting_for_input:
            await self._shell.interrupt()
        hits = _limits_hit(before, self.sandbox.limit_events(), self.sandbox.limits)
        return ToolOutcome(_describe(result, timeout) + hits, command=result)

    async def _edit(self, arguments: dict[str, Any]) -> ToolOutcome:
        if self.sandbox is None:
            return ToolOutcome("this task has no sandbox: editor is unavailable", error=True)
        if self._editor is None:
            self._editor = Editor(self.sandbox)
        result = await self._editor.run(arguments)
        return ToolOutcome(result.output, error=result.error)

    async def _submit(self, arguments: dict[str, Any]) -> ToolOutcome:
        answer = arguments.get("answer")
        if answer is not None and not isinstance(answer, str):
            answer = json.dumps(answer)
        # A repository task: the workspace's changes. A writable root's whole filesystem is
        # the outcome (kept as its layer), no diff.
        if (
            answer is None
            and self.sandbox is not None
            and not getattr(self.sandbox, "has_layer", False)
        ):
            answer = await self.sandbox.diff()
        return ToolOutcome("submitted", submitted=True, submission=answer)


def _limits_hit(before: dict[str, int], after: dict[str, int], limits: SandboxLimits) -> str:
    """What the model should know of limits the command ran into (the kernel's kill of a
    process over the memory limit shows as a bare exit code 137 otherwise)."""
    notes = []
    if after.get("memory_mb", 0) > before.get("memory_mb", 0):
        notes.append(
            f"a process was killed: the sandbox's memory limit of {limits.memory_mb} MB was reached"
        )
    if after.get("max_processes", 0) > before.get("max_processes", 0):
        notes.append(
            f"new processes were refused: the sandbox's limit of {limits.max_processes} "
            "processes was reached"
        )
    return "".join(f"\n[{note}]" for note in notes)


def _describe(result: CommandResult, timeout: float) -> str:
    """A command's result as the model reads it."""
    text = result.output.rstrip("\n")
    if result.waiting_for_input:
        note = "the command waited for keyboard input and was interrupted; pipe input instead"
    elif result.timed_out:
        note = f"the command timed out after {timeout:g}s and was interrupted"
    else:
        note = f"exit code {result.exit_code}"
    return f"{text}\n[{note}]" if text else f"[{note}]"
