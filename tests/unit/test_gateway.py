"""The gateway's parts: how messages are compared for prefix matching, the format a chat
template writes, OpenAI's answer and chunk formats, keys, the request model, the relay."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from rollserve.errors import InfrastructureError
from rollserve.gateway.answers import chunks, completion
from rollserve.gateway.base import Refusal
from rollserve.gateway.history import extends, normal, tools_key, why_new
from rollserve.gateway.job import Reply
from rollserve.gateway.keys import Gateway
from rollserve.gateway.relay import relay_binary
from rollserve.llm.parsers import parser_for_template
from rollserve.schema.openai import ChatRequest
from rollserve.settings import Settings


def _call(arguments: str) -> dict[str, object]:
    return {
        "id": "call_1_0",
        "type": "function",
        "function": {"name": "bash", "arguments": arguments},
    }


def test_messages_compare_by_what_the_template_renders() -> None:
    ours = {"role": "assistant", "content": None, "tool_calls": [_call('{"command": "ls"}')]}
    # What an SDK sends back: extra fields, "" for None, the arguments spelled differently.
    echoed = {
        "role": "assistant",
        "content": "",
        "refusal": None,
        "annotations": [],
        "tool_calls": [_call('{ "command" :"ls" }')],
    }
    assert normal(ours) == normal(echoed)
    parts = {
        "role": "user",
        "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
    }
    assert normal(parts) == normal({"role": "user", "content": "ab"})
    assert normal(ours) != normal({**ours, "tool_calls": [_call('{"command": "pwd"}')]})
    assert normal({"role": "tool", "tool_call_id": "a", "content": "x"}) != normal(
        {"role": "tool", "tool_call_id": "b", "content": "x"}
    )


def test_extension_and_why_not() -> None:
    history = [normal({"role": "system", "content": "s"}), normal({"role": "user", "content": "u"})]
    longer = [*history, normal({"role": "assistant", "content": "a"})]
    assert extends(history, longer)
    assert not extends(history, history)  # nothing new
    rewritten = [normal({"role": "system", "content": "other"}), *longer[1:]]
    assert not extends(history, rewritten)
    assert why_new(history, rewritten, True) == (
        "the agent's history differs from the segment's at message 0 (system)"
    )
    assert why_new(history, longer, False) == "the request's tools differ from the segment's"
    assert tools_key(None) == tools_key([])


@pytest.mark.parametrize(
    ("source", "name"),
    [
        ("{{- '<tool_call>\\n' + tool_call | tojson + '\\n</tool_call>' }}", "hermes"),
        ("<tool_call>\n<function={{ name }}>\n<parameter={{ k }}>", "qwen3_coder"),
        ("{{- '[TOOL_CALLS][' }}", "mistral"),
        ("{{- '<|python_tag|>' }}", "llama3_json"),
        ("{%- if message.role == 'ipython' %}<|eot_id|>", "llama3_json"),
        ("plain {{ messages }}", "hermes"),
        (None, "hermes"),
    ],
)
def test_the_format_a_template_writes(source: str | None, name: str) -> None:
    assert parser_for_template(source) == name


def _reply(**message: object) -> Reply:
    body = {"role": "assistant", "content": "hi", **message}
    return Reply(
        body,
        "tool_calls" if "tool_calls" in message else "stop",
        10,
        3,
        "policy",
        logprobs=[("h", -0.5), ("i", -0.25)],
    )


def test_a_completion_in_openais_shape() -> None:
    answer = completion(_reply())
    assert answer["object"] == "chat.completion" and answer["model"] == "policy"
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["message"]["content"] == "hi"
    assert [e["logprob"] for e in choice["logprobs"]["content"]] == [-0.5, -0.25]
    assert answer["usage"] == {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}


def test_chunks_put_back_together_are_the_reply() -> None:
    reply = _reply(tool_calls=[_call('{"command": "ls"}')])
    events = [e.decode() for e in chunks(reply, include_usage=True)]
    assert all(e.startswith("data: ") and e.endswith("\n\n") for e in events)
    assert events[-1] == "data: [DONE]\n\n"
    bodies = [json.loads(e[6:]) for e in events[:-1]]
    assert {b["object"] for b in bodies} == {"chat.completion.chunk"}
    content, calls, finish = "", {}, None
    for body in bodies[:-1]:
        delta = body["choices"][0]["delta"]
        content += delta.get("content") or ""
        for call in delta.get("tool_calls") or []:
            slot = calls.setdefault(call["index"], {"id": "", "name": "", "arguments": ""})
            slot["id"] = call.get("id") or slot["id"]
            slot["name"] += call.get("function", {}).get("name") or ""
            slot["arguments"] += call.get("function", {}).get("arguments") or ""
        finish = body["choices"][0]["finish_reason"] or finish
    assert content == "hi" and finish == "tool_calls"
    assert calls == {0: {"id": "call_1_0", "name": "bash", "arguments": '{"command": "ls"}'}}
    assert bodies[-1]["choices"] == [] and bodies[-1]["usage"]["total_tokens"] == 13


class _Job:
    job_id = "j1"


def test_keys_open_only_while_their_job_runs() -> None:
    gateway = Gateway()
    key = gateway.open(_Job())  # type: ignore[arg-type]
    assert gateway.job(key).job_id == "j1" and len(gateway) == 1
    gateway.close(key, "its run stage ended")
    with pytest.raises(Refusal) as ended:
        gateway.job(key)
    assert ended.value.status == 410 and ended.value.code == "job_ended"
    assert "job j1 is no longer running (its run stage ended)" in ended.value.message
    with pytest.raises(Refusal) as unknown:
        gateway.job("guess")
    assert unknown.value.status == 404
    assert unknown.value.body()["error"]["type"] == "not_found_error"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages"),
        ({"messages": [{"role": "user", "content": "x"}], "n": 2}, "n"),
        ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "x"}]}, "tools"),
    ],
)
def test_bad_requests_name_the_field(body: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        ChatRequest.model_validate(body)
    assert caught.value.errors()[0]["loc"][0] == field


def test_extra_fields_an_sdk_sends_are_accepted() -> None:
    request = ChatRequest.model_validate(
        {
            "messages": [{"role": "user", "content": "x"}],
            "parallel_tool_calls": True,
            "user": "u",
            "stop": "END",
            "tool_choice": "none",
            "tools": [{"type": "function", "function": {"name": "bash"}}],
        }
    )
    assert request.stops == ("END",) and not request.parses_tools


def test_the_relay_says_what_it_misses(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, gateway_relay_cc="no-such-cc")
    with pytest.raises(InfrastructureError, match=r"no-such-cc.*not on PATH"):
        relay_binary(settings)
    built = relay_binary(Settings(data_dir=tmp_path))
    assert built.is_file() and built == relay_binary(Settings(data_dir=tmp_path))
