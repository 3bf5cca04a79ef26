"""Tool-call parsers: read the tool calls out of generated text, and write them back."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class ToolCall:
    """One call of a tool by the model; ``id`` links the tool's answer to it."""

    name: str
    arguments: dict[str, Any]
    id: str

    def to_openai(self) -> dict[str, Any]:
        """The call in OpenAI chat format (``arguments`` as a JSON string)."""
        return {
            "id": self.id,
            "type": "function",
            "function": {
                "name": self.name,
                "arguments": json.dumps(self.arguments, ensure_ascii=False),
            },
        }


@dataclass
class ParsedTurn:
    """A generated turn split into its prose (``content``), its well-formed calls, and one
    message per malformed call, written for the model to read and correct itself."""

    content: str
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class ToolCallParser(Protocol):
    """A tool-call format (``hermes`` …), registered under its ``name``."""

    name: str

    def parse(self, text: str) -> ParsedTurn:
        """Split generated text into content, calls and errors; never raises on bad input."""
        ...

    def format(self, calls: Sequence[ToolCall]) -> str:
        """The text a model would generate for ``calls`` (the inverse of ``parse``)."""
        ...

    def turn_call_id(self, turn: int, index: int) -> str:
        """A call id unique within a trajectory, in the form the family's template takes."""
        ...


def call_id(index: int) -> str:
    """The deterministic id of the ``index``-th call (from 0) of a turn."""
    return f"call_{index}"


class HermesParser:
    """The format of Qwen-family (and Hermes) chat templates: one JSON object per
    ``<tool_call>…</tool_call>`` block, ``{"name": …, "arguments": {…}}``."""

    name = "hermes"
    open_tag = "<tool_call>"
    close_tag = "</tool_call>"
    expected_form = (
        'Write each tool call as <tool_call>\n{"name": "<tool name>", "arguments": '
        '{"<parameter>": <value>, ...}}\n</tool_call>'
    )

    def turn_call_id(self, turn: int, index: int) -> str:
        return f"call_{turn}_{index}"

    def format(self, calls: Sequence[ToolCall]) -> str:
        blocks = []
        for call in calls:
            body = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
            blocks.append(f"{self.open_tag}\n{body}\n{self.close_tag}")
        return "\n".join(blocks)

    def parse(self, text: str) -> ParsedTurn:
        content: list[str] = []
        calls: list[ToolCall] = []
        errors: list[str] = []
        decoder = json.JSONDecoder()
        pos = 0
        block = 0
        while True:
            start = text.find(self.open_tag, pos)
            if start < 0:
                content.append(text[pos:])
                break
            content.append(text[pos:start])
            block += 1
            body_start = start + len(self.open_tag)
            # Decode the JSON first, so that a "</tool_call>" inside a string argument
            # (a command that prints the tag) does not end the block.
            value_start = _skip_space(text, body_start)
            try:
                value, value_end = decoder.raw_decode(text, value_start)
            except _UNDECODABLE:
                pass
            else:
                after = _skip_space(text, value_end)
                if text.startswith(self.close_tag, after):
                    self._check(value, block, len(calls), calls, errors)
                    pos = after + len(self.close_tag)
                    continue
            close = text.find(self.close_tag, body_start)
            reopen = text.find(self.open_tag, body_start)
            if close < 0 or 0 <= reopen < close:
                errors.append(
                    f"tool call {block}: {self.open_tag} is never closed by {self.close_tag} "
                    f"(was the answer cut short?); the call was not run. {self.expected_form}"
                )
                if reopen < 0:
                    break
                pos = reopen
                continue
            body = text[body_start:close]
            try:
                value = json.loads(body)
            except _UNDECODABLE as exc:
                errors.append(
                    f"tool call {block}: invalid JSON ({_why(exc)}); the call was not run. "
                    f"{self.expected_form}"
                )
            else:  # only where the tags and the decoder's framing disagree
                self._check(value, block, len(calls), calls, errors)
            pos = close + len(self.close_tag)
        prose = "\n".join(part.strip() for part in content if part.strip())
        if self.close_tag in prose:
            errors.append(
                f"found {self.close_tag} without an opening {self.open_tag}; "
                f"nothing was run for it. {self.expected_form}"
            )
        return ParsedTurn(content=prose, calls=calls, errors=errors)

    def _check(
        self, value: Any, block: int, index: int, calls: list[ToolCall], errors: list[str]
    ) -> None:
        """Append ``value`` to ``calls`` when it is a well-formed call, else say why not."""
        where = f"tool call {block}"
        if not isinstance(value, dict):
            errors.append(
                f"{where}: expected a JSON object with 'name' and 'arguments', got "
                f"{_json_kind(value)}; the call was not run. {self.expected_form}"
            )
            return
        name = value.get("name")
        if not isinstance(name, str) or not name.strip():
            got = "it is missing" if name is None else f"got {json.dumps(name)}"
            errors.append(
                f"{where}: 'name' must be a non-empty string naming the tool ({got}); "
                f"the call was not run. {self.expected_form}"
            )
            return
        arguments = value.get("arguments")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except _UNDECODABLE as exc:
                errors.append(
                    f"{where} ({name}): 'arguments' is a string that is not valid JSON "
                    f"({_why(exc)}); the call was not run. {self.expected_form}"
                )
                return
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            errors.append(
                f"{where} ({name}): 'arguments' must be a JSON object mapping parameter "
                f"names to values, got {_json_kind(arguments)}; the call was not run. "
                f"{self.expected_form}"
            )
            return
        calls.append(ToolCall(name=name.strip(), arguments=arguments, id=call_id(index)))


# What the JSON decoder raises on text it cannot take: malformed JSON (JSONDecodeError, a
# ValueError), an integer longer than Python's int-conversion limit (a plain ValueError), and
# nesting deeper than the interpreter's recursion limit (RecursionError).
_UNDECODABLE = (ValueError, RecursionError)


def _why(exc: Exception) -> str:
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    return str(exc).split("; use sys.set_int_max_str_digits", 1)[0]


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _json_kind(value: Any) -> str:
    kinds = {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    for kind, words in kinds.items():
        if isinstance(value, kind):
            return words
    return "a number"
