"""Properties of the hermes tool-call parser (the format the tool agent asks for): every
well-formed call survives format → parse, and no text, however broken, makes it raise or
invent a call that the text does not hold. The other formats: test_toolcall_formats_props."""

from __future__ import annotations

import contextlib
import json
import re
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from rollserve.llm.toolcalls import HermesParser, ToolCall, ToolCallParser

PARSERS: list[ToolCallParser] = [HermesParser()]
TAGS = ("<tool_call>", "</tool_call>")

# Any unicode (lone surrogates included: a JSON "\ud800" escape decodes to one), weighted
# towards the characters that matter to the format.
chars = st.one_of(
    st.characters(codec=None, categories=None),
    st.sampled_from('{}[]":,\\\n\r\t <>/_'),
)
texts = st.text(chars, max_size=40)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts
    | st.sampled_from(list(TAGS)),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=12,
)
names = texts.filter(lambda s: s.strip() == s and s != "")
tool_calls = st.lists(st.tuples(names, st.dictionaries(texts, json_values, max_size=5)), max_size=4)
prose = texts.filter(lambda s: not any(tag in s for tag in TAGS))


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON values, with 1 and 1.0 (and True and 1) kept apart."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True) and a == b


@settings(max_examples=300, deadline=None)
@given(calls=tool_calls, before=prose, after=prose)
@example(
    calls=[("bash", {"command": 'echo "</tool_call>" {}\n<tool_call>', "x": [{"y": None}]})],
    before="Let me {see}",
    after="}",
)
def test_formatted_calls_parse_back(
    calls: list[tuple[str, dict[str, Any]]], before: str, after: str
) -> None:
    for parser in PARSERS:
        written = [
            ToolCall(name, arguments, f"call_{i}") for i, (name, arguments) in enumerate(calls)
        ]
        text = before + "\n" + parser.format(written) + "\n" + after
        turn = parser.parse(text)
        assert turn.errors == []
        assert [(c.name, c.id) for c in turn.calls] == [(c.name, c.id) for c in written]
        for got, sent in zip(turn.calls, written, strict=True):
            assert _same(got.arguments, sent.arguments)
            assert json.loads(got.to_openai()["function"]["arguments"]) == sent.arguments
        parts = (before, after) if written else (text,)
        assert turn.content == "\n".join(p.strip() for p in parts if p.strip())


# Fragments that arbitrary text is built from: tags, pieces of JSON, whole (good and bad) call
# bodies, very deep nesting and very long numbers (the JSON decoder's own limits), any text.
_bodies = st.builds(
    lambda name, arguments: json.dumps({"name": name, "arguments": arguments}),
    names,
    st.dictionaries(texts, json_values, max_size=3),
)
fragments = st.one_of(
    st.sampled_from([*TAGS, "\n", " ", "{", "}", "[", "]", '"', ",", ":", '"name"', '"arguments"']),
    _bodies,
    _bodies.map(lambda body: body[: len(body) // 2]),
    st.integers(1, 3000).map(lambda n: "[" * n + "]" * n),
    st.integers(1, 3000).map(lambda n: '{"a":' * n + "1" + "}" * n),
    st.integers(4000, 6000).map(lambda n: "1" * n),
    st.integers(4000, 6000).map(lambda n: json.dumps({"name": "n", "arguments": "1" * n})),
    texts,
)


def _candidates(text: str) -> list[Any]:
    """Every JSON value that some ``<tool_call>`` … ``</tool_call>`` stretch of ``text`` holds."""
    decoder = json.JSONDecoder()
    found = []
    for start in (m.end() for m in re.finditer(re.escape(TAGS[0]), text)):
        at = start
        while at < len(text) and text[at].isspace():
            at += 1
        try:
            value, end = decoder.raw_decode(text, at)
        except (ValueError, RecursionError):
            pass
        else:
            if text[end:].lstrip().startswith(TAGS[1]):
                found.append(value)
        for close in (m.start() for m in re.finditer(re.escape(TAGS[1]), text[start:])):
            with contextlib.suppress(ValueError, RecursionError):
                found.append(json.loads(text[start : start + close]))
    return found


def _held(call: ToolCall, candidates: list[Any]) -> bool:
    for value in candidates:
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            continue
        arguments = value.get("arguments")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except (ValueError, RecursionError):
                continue
        if value["name"].strip() == call.name and (arguments or {}) == call.arguments:
            return True
    return False


@settings(max_examples=300, deadline=None)
@given(st.lists(fragments, max_size=12).map("".join))
@example('<tool_call>{"name": "bash", "arguments": {"n": ' + "9" * 5000 + "}}</tool_call>")
@example("<tool_call>" + "[" * 100_000 + "</tool_call>")
@example('<tool_call>{"name": "b", "arguments": "' + "[" * 100_000 + '"}</tool_call>')
def test_arbitrary_text_never_raises_nor_invents_calls(text: str) -> None:
    for parser in PARSERS:
        turn = parser.parse(text)  # must not raise
        assert all(isinstance(error, str) and error for error in turn.errors)
        assert [c.id for c in turn.calls] == [f"call_{i}" for i in range(len(turn.calls))]
        candidates = _candidates(text)
        for call in turn.calls:
            assert _held(call, candidates), call
            call.to_openai()  # must not raise either
        assert parser.parse(text) == turn  # deterministic


@settings(max_examples=200, deadline=None)
@given(prose)
def test_text_without_tags_is_all_content(text: str) -> None:
    for parser in PARSERS:
        assert parser.parse(text).calls == []
        assert parser.parse(text).content == text.strip()
