"""Tool-call parsing: well-formed calls, prose around them, and every malformed form."""

from __future__ import annotations

import json

import pytest

from rollserve.errors import UnknownNameError
from rollserve.llm.parsers import default_parsers
from rollserve.llm.toolcalls import HermesParser, ParsedTurn, ToolCall


@pytest.fixture
def parser() -> HermesParser:
    return HermesParser()


def block(body: str) -> str:
    return f"<tool_call>\n{body}\n</tool_call>"


def test_text_without_calls_is_all_content(parser: HermesParser) -> None:
    turn = parser.parse("  The answer is 4.\n")
    assert turn == ParsedTurn(content="The answer is 4.", calls=[], errors=[])


def test_empty_text(parser: HermesParser) -> None:
    assert parser.parse("") == ParsedTurn(content="", calls=[], errors=[])


def test_one_call(parser: HermesParser) -> None:
    turn = parser.parse(block('{"name": "bash", "arguments": {"command": "ls"}}'))
    assert turn.calls == [ToolCall(name="bash", arguments={"command": "ls"}, id="call_0")]
    assert turn.content == ""
    assert turn.errors == []


def test_two_calls_get_deterministic_ids(parser: HermesParser) -> None:
    text = (
        block('{"name": "bash", "arguments": {"command": "ls"}}')
        + "\n"
        + block('{"name": "submit", "arguments": {"answer": "42"}}')
    )
    turn = parser.parse(text)
    assert [(c.name, c.arguments, c.id) for c in turn.calls] == [
        ("bash", {"command": "ls"}, "call_0"),
        ("submit", {"answer": "42"}, "call_1"),
    ]
    assert parser.parse(text) == turn


def test_prose_around_calls_is_content(parser: HermesParser) -> None:
    text = (
        "Let me look.\n"
        + block('{"name": "bash", "arguments": {"command": "ls"}}')
        + "\nThen count.\n"
        + block('{"name": "bash", "arguments": {"command": "wc -l f"}}')
        + "\nDone.  "
    )
    turn = parser.parse(text)
    assert turn.content == "Let me look.\nThen count.\nDone."
    assert [c.arguments["command"] for c in turn.calls] == ["ls", "wc -l f"]
    assert turn.errors == []


def test_nested_json_arguments(parser: HermesParser) -> None:
    arguments = {"command": "x", "options": {"env": {"A": [1, 2, {"b": None}]}, "flag": True}}
    turn = parser.parse(block(json.dumps({"name": "bash", "arguments": arguments})))
    assert turn.calls[0].arguments == arguments


def test_arguments_as_json_string(parser: HermesParser) -> None:
    body = json.dumps({"name": "bash", "arguments": json.dumps({"command": "pwd"})})
    assert parser.parse(block(body)).calls[0].arguments == {"command": "pwd"}


def test_missing_or_null_arguments_mean_none(parser: HermesParser) -> None:
    text = block('{"name": "submit"}') + block('{"name": "submit", "arguments": null}')
    turn = parser.parse(text)
    assert [c.arguments for c in turn.calls] == [{}, {}]
    assert turn.errors == []


def test_unicode_survives(parser: HermesParser) -> None:
    text = "Größe → " + block('{"name": "bash", "arguments": {"command": "echo 日本語 🚀"}}')
    turn = parser.parse(text)
    assert turn.content == "Größe →"
    assert turn.calls[0].arguments == {"command": "echo 日本語 🚀"}


def test_close_tag_inside_a_string_argument(parser: HermesParser) -> None:
    body = json.dumps({"name": "bash", "arguments": {"command": "echo '</tool_call>'"}})
    turn = parser.parse(block(body) + " after")
    assert turn.calls[0].arguments == {"command": "echo '</tool_call>'"}
    assert turn.content == "after"
    assert turn.errors == []


def test_tags_on_one_line(parser: HermesParser) -> None:
    turn = parser.parse('<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>')
    assert turn.calls[0].name == "bash"


def test_invalid_json_reports_the_decoder_message(parser: HermesParser) -> None:
    turn = parser.parse("ok " + block('{"name": "bash", "arguments": {"command": "ls"}'))
    assert turn.calls == []
    assert turn.content == "ok"
    [error] = turn.errors
    assert "invalid JSON" in error
    assert "Expecting" in error  # the decoder's own words
    assert '<tool_call>\n{"name": "<tool name>", "arguments": ' in error


def test_a_bad_call_does_not_hide_a_good_one(parser: HermesParser) -> None:
    text = block("{not json}") + block('{"name": "bash", "arguments": {"command": "ls"}}')
    turn = parser.parse(text)
    assert [c.name for c in turn.calls] == ["bash"]
    assert turn.calls[0].id == "call_0"
    assert len(turn.errors) == 1
    assert turn.errors[0].startswith("tool call 1:")


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ('{"arguments": {}}', "'name' must be a non-empty string"),
        ('{"name": "", "arguments": {}}', "'name' must be a non-empty string"),
        ('{"name": "  ", "arguments": {}}', "'name' must be a non-empty string"),
        ('{"name": 3, "arguments": {}}', "got 3"),
        ('{"name": "bash", "arguments": [1, 2]}', "got an array"),
        ('{"name": "bash", "arguments": 7}', "got a number"),
        ('{"name": "bash", "arguments": "[1]"}', "got an array"),
        ('{"name": "bash", "arguments": "{oops"}', "a string that is not valid JSON"),
        ('["bash", {"command": "ls"}]', "expected a JSON object"),
        ('"bash"', "got a string"),
    ],
)
def test_malformed_calls_become_errors(parser: HermesParser, body: str, words: str) -> None:
    turn = parser.parse(block(body))
    assert turn.calls == []
    [error] = turn.errors
    assert words in error
    assert "the call was not run" in error
    assert "<tool_call>" in error  # shows the right form


def test_unclosed_call_cut_by_the_token_budget(parser: HermesParser) -> None:
    turn = parser.parse('Running it.\n<tool_call>\n{"name": "bash", "arguments": {"comm')
    assert turn.calls == []
    assert turn.content == "Running it."
    [error] = turn.errors
    assert "never closed" in error
    assert "cut short" in error


def test_complete_json_without_close_tag_is_unclosed(parser: HermesParser) -> None:
    turn = parser.parse('<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n')
    assert turn.calls == []
    assert "never closed" in turn.errors[0]


def test_unclosed_call_followed_by_a_good_one(parser: HermesParser) -> None:
    text = '<tool_call>\n{"name": "bash", ' + block(
        '{"name": "bash", "arguments": {"command": "ls"}}'
    )
    turn = parser.parse(text)
    assert [c.arguments for c in turn.calls] == [{"command": "ls"}]
    assert len(turn.errors) == 1
    assert "never closed" in turn.errors[0]


def test_close_tag_without_open_tag(parser: HermesParser) -> None:
    turn = parser.parse('{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>')
    assert turn.calls == []
    [error] = turn.errors
    assert "without an opening <tool_call>" in error


def test_format_matches_the_qwen_template(parser: HermesParser) -> None:
    calls = [ToolCall("bash", {"command": "ls"}, "call_0"), ToolCall("submit", {}, "call_1")]
    assert parser.format(calls) == (
        '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "submit", "arguments": {}}\n</tool_call>'
    )
    assert parser.format([]) == ""


@pytest.mark.parametrize(
    "calls",
    [
        [],
        [ToolCall("bash", {"command": "ls -la"}, "call_0")],
        [
            ToolCall("bash", {"command": "printf '%s\\n' \"é\" '</tool_call>'"}, "call_0"),
            ToolCall("editor", {"command": "create", "path": "a.py", "text": "{\n}"}, "call_1"),
            ToolCall("submit", {"answer": "\\frac{1}{2}", "n": [1, 2.5, None]}, "call_2"),
        ],
    ],
)
def test_round_trip(parser: HermesParser, calls: list[ToolCall]) -> None:
    text = "Thinking: 日本 {braces}\n" + parser.format(calls)
    turn = parser.parse(text)
    assert turn.calls == calls
    assert turn.content == "Thinking: 日本 {braces}"
    assert turn.errors == []


def test_to_openai() -> None:
    call = ToolCall("bash", {"command": "echo ü"}, "call_3")
    assert call.to_openai() == {
        "id": "call_3",
        "type": "function",
        "function": {"name": "bash", "arguments": '{"command": "echo ü"}'},
    }


def test_default_parsers() -> None:
    parsers = default_parsers()
    assert sorted(parsers.names()) == ["hermes", "llama3_json", "mistral", "qwen3_coder"]
    assert isinstance(parsers.get("hermes"), HermesParser)
    with pytest.raises(UnknownNameError, match="qwen3_coder"):
        parsers.get("granite")


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ('{"name": "bash", "arguments": {"n": ' + "9" * 5000 + "}}", "Exceeds the limit"),
        ("[" * 100_000, "nested too deeply"),
        ('{"name": "bash", "arguments": "' + "[" * 100_000 + '"}', "nested too deeply"),
    ],
)
def test_json_beyond_the_decoders_limits_is_an_error(
    parser: HermesParser, body: str, words: str
) -> None:
    turn = parser.parse("ok " + block(body))
    assert turn.calls == []
    assert turn.content == "ok"
    [error] = turn.errors
    assert words in error
    assert "set_int_max_str_digits" not in error  # Python's advice is not for the model
