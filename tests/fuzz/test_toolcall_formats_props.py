"""Properties of the other families' tool-call formats (Qwen3-Coder XML, Llama 3 JSON,
Mistral [TOOL_CALLS]): calls survive format → parse, and no text makes a parser raise."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from rollserve.llm.parsers import Llama3JsonParser, MistralParser, Qwen3CoderParser
from rollserve.llm.toolcalls import ToolCall, ToolCallParser

FORMATS: list[ToolCallParser] = [Qwen3CoderParser(), Llama3JsonParser(), MistralParser()]
MARKS = (
    "<tool_call>",
    "</tool_call>",
    "<function=",
    "</function>",
    "<parameter=",
    "</parameter>",
    "[TOOL_CALLS]",
    "[ARGS]",
    "<|python_tag|>",
)

texts = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=30).filter(
    lambda s: not any(mark in s for mark in MARKS)
)


def _plain_string(value: str) -> bool:
    """A string XML carries as itself: not JSON of another kind, no edge newlines."""
    try:
        decoded = json.loads(value)
    except ValueError:
        decoded = value
    return isinstance(decoded, str) and value == value.strip("\n")


names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,15}", fullmatch=True)
values = st.one_of(
    texts.filter(_plain_string),
    st.integers(),
    st.booleans(),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(names, st.integers(), max_size=2),
)
calls = st.lists(st.tuples(names, st.dictionaries(names, values, max_size=4)), max_size=3)


@settings(max_examples=200, deadline=None)
@given(calls=calls, before=texts)
def test_formatted_calls_parse_back(calls: list[tuple[str, dict[str, Any]]], before: str) -> None:
    for parser in FORMATS:
        written = [ToolCall(n, a, parser.turn_call_id(1, i)) for i, (n, a) in enumerate(calls)]
        prose = "" if isinstance(parser, Llama3JsonParser) else before.strip()
        text = parser.format(written)
        if prose and written:
            text = prose + "\n" + text
        turn = parser.parse(text)
        assert turn.errors == []
        assert [(c.name, c.arguments) for c in turn.calls] == [
            (c.name, c.arguments) for c in written
        ]
        if written:
            assert turn.content == prose


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(st.sampled_from([*MARKS, "{", "}", '"name"', ":", "[", "]"]), texts), max_size=12
    ).map("".join)
)
def test_arbitrary_text_never_raises(text: str) -> None:
    for parser in FORMATS:
        turn = parser.parse(text)
        assert all(isinstance(error, str) and error for error in turn.errors)
        for call in turn.calls:
            call.to_openai()
        assert parser.parse(text) == turn


def test_mistral_ids_are_nine_letters_and_digits() -> None:
    parser = MistralParser()
    ids = {parser.turn_call_id(turn, index) for turn in range(20) for index in range(5)}
    assert len(ids) == 100 and all(len(i) == 9 and i.isalnum() for i in ids)
