"""The tool-call parsers by name: hermes (Qwen2.5 and Hermes JSON in tags), Qwen3-Coder's XML,
Llama 3's JSON and Mistral's ``[TOOL_CALLS]``; and which one a chat template writes."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from typing import Any

from rollserve.llm.toolcalls import HermesParser, ParsedTurn, ToolCall, ToolCallParser, call_id
from rollserve.registry import Registry

_UNDECODABLE = (ValueError, RecursionError)


def _arguments(value: Any, where: str, errors: list[str]) -> dict[str, Any] | None:
    """A call's arguments as an object (a JSON string holding one is read), or None with the
    reason in ``errors``."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except _UNDECODABLE:
            errors.append(f"{where}: the arguments are a string that is not valid JSON")
            return None
    if value is None:
        return {}
    if not isinstance(value, dict):
        errors.append(f"{where}: the arguments must be a JSON object")
        return None
    return value


class Qwen3CoderParser:
    """Qwen3-Coder's format: ``<tool_call><function=NAME><parameter=P>VALUE</parameter>…
    </function></tool_call>``; a value that is JSON other than a string (a number, an object)
    is read as that value, any other as text."""

    name = "qwen3_coder"
    open_tag, close_tag = "<tool_call>", "</tool_call>"
    _function = re.compile(r"<function=([^>\n]*)>(.*?)</function>", re.S)
    _parameter = re.compile(r"<parameter=([^>\n]*)>\n?(.*?)\n?</parameter>", re.S)

    def turn_call_id(self, turn: int, index: int) -> str:
        return f"call_{turn}_{index}"

    def format(self, calls: Sequence[ToolCall]) -> str:
        blocks = []
        for call in calls:
            params = "".join(
                f"<parameter={key}>\n{_xml_value(value)}\n</parameter>\n"
                for key, value in call.arguments.items()
            )
            blocks.append(
                f"{self.open_tag}\n<function={call.name}>\n{params}</function>\n{self.close_tag}"
            )
        return "\n".join(blocks)

    def parse(self, text: str) -> ParsedTurn:
        content: list[str] = []
        calls: list[ToolCall] = []
        errors: list[str] = []
        pos = 0
        while True:
            start = text.find(self.open_tag, pos)
            if start < 0:
                content.append(text[pos:])
                break
            content.append(text[pos:start])
            end = text.find(self.close_tag, start)
            if end < 0:
                errors.append(
                    f"tool call {len(calls) + len(errors) + 1}: {self.open_tag} is never closed "
                    f"by {self.close_tag}; the call was not run"
                )
                break
            body = text[start + len(self.open_tag) : end]
            found = self._function.search(body)
            if found is None or not found.group(1).strip():
                errors.append(
                    f"tool call {len(calls) + len(errors) + 1}: no <function=NAME>…</function> "
                    "in it; the call was not run"
                )
            else:
                arguments = {
                    key.strip(): _read_value(value)
                    for key, value in self._parameter.findall(found.group(2))
                }
                calls.append(ToolCall(found.group(1).strip(), arguments, call_id(len(calls))))
            pos = end + len(self.close_tag)
        prose = "\n".join(part.strip() for part in content if part.strip())
        return ParsedTurn(content=prose, calls=calls, errors=errors)


def _xml_value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _read_value(text: str) -> Any:
    try:
        value = json.loads(text)
    except _UNDECODABLE:
        return text
    return text if isinstance(value, str) else value


class Llama3JsonParser:
    """Llama 3.1+'s JSON tool calls: the whole reply is ``{"name": …, "parameters": {…}}``
    (optionally after ``<|python_tag|>``; several separated by ``;``)."""

    name = "llama3_json"
    python_tag = "<|python_tag|>"

    def turn_call_id(self, turn: int, index: int) -> str:
        return f"call_{turn}_{index}"

    def format(self, calls: Sequence[ToolCall]) -> str:
        return "; ".join(
            json.dumps({"name": c.name, "parameters": c.arguments}, ensure_ascii=False)
            for c in calls
        )

    def parse(self, text: str) -> ParsedTurn:
        body = text.strip()
        tagged = body.startswith(self.python_tag)
        if tagged:
            body = body[len(self.python_tag) :].strip()
        if not body.startswith("{"):
            return ParsedTurn(content=text.strip())
        decoder = json.JSONDecoder()
        calls: list[ToolCall] = []
        errors: list[str] = []
        pos = 0
        while pos < len(body):
            try:
                value, pos = decoder.raw_decode(body, pos)
            except _UNDECODABLE:
                if calls or tagged or '"name"' in body:
                    errors.append(f"tool call {len(calls) + 1}: invalid JSON; it was not run")
                    return ParsedTurn(content="", calls=calls, errors=errors)
                return ParsedTurn(content=text.strip())
            name = value.get("name") if isinstance(value, dict) else None
            if not isinstance(name, str) or not name.strip():
                if not calls:  # a JSON answer, not a call
                    return ParsedTurn(content=text.strip())
                errors.append(f"tool call {len(calls) + 1}: no 'name'; it was not run")
            else:
                given = value.get("parameters", value.get("arguments"))
                arguments = _arguments(given, f"tool call {len(calls) + 1} ({name})", errors)
                if arguments is not None:
                    calls.append(ToolCall(name.strip(), arguments, call_id(len(calls))))
            while pos < len(body) and (body[pos].isspace() or body[pos] == ";"):
                pos += 1
        return ParsedTurn(content="", calls=calls, errors=errors)


class MistralParser:
    """Mistral's ``[TOOL_CALLS]``: a JSON array of ``{"name", "arguments", "id"}`` (v3
    tokenizers), or ``[TOOL_CALLS]NAME[ARGS]{…}`` per call (v11 and later). Mistral's
    templates want call ids of 9 letters and digits: ids made here have that form."""

    name = "mistral"
    tag, args_tag = "[TOOL_CALLS]", "[ARGS]"

    def turn_call_id(self, turn: int, index: int) -> str:
        return mistral_id(index, salt=str(turn))

    def format(self, calls: Sequence[ToolCall]) -> str:
        if not calls:
            return ""
        listed = [{"name": c.name, "arguments": c.arguments, "id": c.id} for c in calls]
        return self.tag + json.dumps(listed, ensure_ascii=False)

    def parse(self, text: str) -> ParsedTurn:
        start = text.find(self.tag)
        if start < 0:
            return ParsedTurn(content=text.strip())
        content = text[:start].strip()
        rest = text[start + len(self.tag) :].lstrip()
        calls: list[ToolCall] = []
        errors: list[str] = []
        if rest.startswith("["):
            try:
                listed, _ = json.JSONDecoder().raw_decode(rest)
            except _UNDECODABLE:
                return ParsedTurn(content, errors=["the [TOOL_CALLS] list is not valid JSON"])
            for item in listed if isinstance(listed, list) else [listed]:
                self._add(item, calls, errors)
            return ParsedTurn(content, calls, errors)
        for piece in text[start:].split(self.tag)[1:]:
            name, found, arguments = piece.partition(self.args_tag)
            if not found:
                errors.append(f"tool call {len(calls) + 1}: no {self.args_tag}; it was not run")
                continue
            try:
                value, _ = json.JSONDecoder().raw_decode(arguments.strip())
            except _UNDECODABLE:
                errors.append(f"tool call {len(calls) + 1} ({name.strip()}): invalid JSON")
                continue
            self._add({"name": name.strip(), "arguments": value}, calls, errors)
        return ParsedTurn(content, calls, errors)

    def _add(self, item: Any, calls: list[ToolCall], errors: list[str]) -> None:
        where = f"tool call {len(calls) + 1}"
        name = item.get("name") if isinstance(item, dict) else None
        if not isinstance(name, str) or not name.strip():
            errors.append(f"{where}: no 'name'; it was not run")
            return
        arguments = _arguments(item.get("arguments"), f"{where} ({name})", errors)
        if arguments is None:
            return
        given = item.get("id")
        ident = given if isinstance(given, str) and given else mistral_id(len(calls))
        calls.append(ToolCall(name.strip(), arguments, ident))


def mistral_id(index: int, salt: str = "") -> str:
    """A call id in Mistral's form: 9 letters and digits."""
    return hashlib.sha256(f"{salt}:{index}".encode()).hexdigest()[:9]


# The marks each format's template writes, most specific first.
_TEMPLATE_MARKS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("qwen3_coder", ("<function=", "<parameter=")),
    ("mistral", ("[TOOL_CALLS]",)),
    ("llama3_json", ("<|python_tag|>",)),
    ("llama3_json", ("ipython", "<|eot_id|>")),
    ("hermes", ("<tool_call>",)),
)


def parser_for_template(template: str | None) -> str:
    """The tool-call format a chat template's source writes (hermes when it names none)."""
    source = template or ""
    for name, marks in _TEMPLATE_MARKS:
        if all(mark in source for mark in marks):
            return name
    return "hermes"


def default_parsers() -> Registry[ToolCallParser]:
    """A registry holding the built-in tool-call parsers."""
    parsers: Registry[ToolCallParser] = Registry("tool-call parser")
    for parser in (HermesParser(), Qwen3CoderParser(), Llama3JsonParser(), MistralParser()):
        parsers.register(parser.name, parser)
    return parsers
