"""The local CPU inference server over HTTP, as vLLM and SGLang clients call it."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import torch

from rollserve.llm.local.engine import LocalEngine
from tests.servers import LlmServer

MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is 12 + 30?"},
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]


def chat_ids(engine: LocalEngine, messages: list[dict[str, Any]], **kwargs: Any) -> list[int]:
    text = engine.tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, **kwargs
    )
    return list(engine.tokenizer.encode(str(text), add_special_tokens=False))


def forward_logprobs(engine: LocalEngine, prompt: list[int], output: list[int]) -> torch.Tensor:
    """log_softmax at each output position, from one forward pass over prompt + output."""
    with torch.inference_mode():
        logits = engine.model(input_ids=torch.tensor([prompt + output])).logits[0].float()
    return torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)


def complete(server: LlmServer, **body: Any) -> httpx.Response:
    body.setdefault("model", server.model)
    return httpx.post(f"{server.root}/v1/completions", json=body, timeout=60)


@pytest.fixture(scope="module")
def prompt(tiny_engine: LocalEngine) -> list[int]:
    return chat_ids(tiny_engine, MESSAGES)


def test_models_lists_the_served_model(local_llm_server: LlmServer) -> None:
    assert httpx.get(f"{local_llm_server.root}/health").status_code == 200
    answer = httpx.get(f"{local_llm_server.root}/v1/models").json()
    assert answer["object"] == "list"
    (card,) = answer["data"]
    assert card["id"] == local_llm_server.model
    assert card["object"] == "model"
    assert card["owned_by"] == "rollserve"
    assert card["max_model_len"] == 2048


def test_token_ids_and_logprobs_come_back_aligned(
    local_llm_server: LlmServer, prompt: list[int]
) -> None:
    r = complete(
        local_llm_server,
        prompt=prompt,
        max_tokens=12,
        temperature=1.0,
        seed=7,
        logprobs=1,
        return_token_ids=True,
    )
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["object"] == "text_completion"
    assert answer["id"].startswith("cmpl-")
    assert answer["model"] == local_llm_server.model
    (choice,) = answer["choices"]
    assert choice["index"] == 0
    assert choice["prompt_token_ids"] == prompt
    ids, logprobs = choice["token_ids"], choice["logprobs"]
    assert len(ids) == len(logprobs["token_logprobs"]) == len(logprobs["tokens"])
    assert len(ids) == len(logprobs["top_logprobs"]) == len(logprobs["text_offset"])
    assert all(1 <= len(top) <= 2 for top in logprobs["top_logprobs"])
    assert logprobs["text_offset"][0] == 0
    assert answer["usage"] == {
        "prompt_tokens": len(prompt),
        "completion_tokens": len(ids),
        "total_tokens": len(prompt) + len(ids),
    }


def test_logprobs_are_those_of_the_raw_logits(
    local_llm_server: LlmServer, tiny_engine: LocalEngine, prompt: list[int]
) -> None:
    # Sampled at temperature 0.5 with top-p: the reported logprobs must still be the model's own.
    r = complete(
        local_llm_server,
        prompt=prompt,
        max_tokens=24,
        temperature=0.5,
        top_p=0.9,
        seed=3,
        logprobs=0,
        return_token_ids=True,
    )
    choice = r.json()["choices"][0]
    ids, reported = choice["token_ids"], choice["logprobs"]["token_logprobs"]
    expected = forward_logprobs(tiny_engine, prompt, ids)
    for step, (token, logprob) in enumerate(zip(ids, reported, strict=True)):
        assert logprob == pytest.approx(float(expected[step, token]), abs=1e-4)


def test_a_seed_makes_sampling_reproducible(local_llm_server: LlmServer, prompt: list[int]) -> None:
    def sample(seed: int) -> list[int]:
        body = {"prompt": prompt, "max_tokens": 16, "seed": seed, "return_token_ids": True}
        ids: list[int] = complete(local_llm_server, **body).json()["choices"][0]["token_ids"]
        return ids

    assert sample(11) == sample(11)
    assert sample(11) != sample(12)


def test_greedy_is_deterministic_and_takes_the_argmax(
    local_llm_server: LlmServer, tiny_engine: LocalEngine, prompt: list[int]
) -> None:
    body = {"prompt": prompt, "max_tokens": 10, "temperature": 0, "return_token_ids": True}
    first = complete(local_llm_server, **body).json()["choices"][0]["token_ids"]
    assert complete(local_llm_server, **body).json()["choices"][0]["token_ids"] == first
    expected = forward_logprobs(tiny_engine, prompt, first).argmax(dim=-1).tolist()
    assert first == expected


def test_finish_reason_length_then_stop_with_the_stop_token_included(
    local_llm_server: LlmServer, tiny_engine: LocalEngine, prompt: list[int]
) -> None:
    body = {"prompt": prompt, "max_tokens": 8, "temperature": 0, "return_token_ids": True}
    full = complete(local_llm_server, **body).json()["choices"][0]
    assert full["finish_reason"] == "length"
    assert len(full["token_ids"]) == 8

    ids = full["token_ids"]
    stop = ids[4]
    cut = ids.index(stop) + 1
    stopped = complete(local_llm_server, **body, stop_token_ids=[stop]).json()["choices"][0]
    assert stopped["finish_reason"] == "stop"
    assert stopped["stop_reason"] == stop
    assert stopped["token_ids"] == ids[:cut]  # the stop token is part of the ids
    text = tiny_engine.tokenizer.decode(ids[: cut - 1], skip_special_tokens=True)
    assert stopped["text"] == text  # ... but not of the text


def test_the_eos_of_tokenizer_and_generation_config_ends_a_generation(
    tiny_engine: LocalEngine,
) -> None:
    eos = tiny_engine.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert tiny_engine.eos_token_ids == {eos}


def test_context_overflow_is_a_400_with_an_openai_error(
    local_llm_server: LlmServer,
) -> None:
    r = complete(local_llm_server, prompt=[5] * 2040, max_tokens=16)
    assert r.status_code == 400
    error = r.json()["error"]
    assert "maximum context length is 2048 tokens" in error["message"]
    assert error["type"] == "BadRequestError"
    assert error["code"] == 400

    body = {"input_ids": [5] * 2040, "sampling_params": {"max_new_tokens": 16}}
    r = httpx.post(f"{local_llm_server.root}/generate", json=body)
    assert r.status_code == 400
    assert "maximum context length of 2048 tokens" in r.json()["error"]["message"]


def test_invalid_requests_name_the_field(local_llm_server: LlmServer) -> None:
    r = complete(local_llm_server, prompt=[5, 6], n=2)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "n"
    assert "n" in r.json()["error"]["message"]

    r = complete(local_llm_server, prompt=[5, 6], temperature=-1)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "temperature"

    r = httpx.post(f"{local_llm_server.root}/v1/completions", json={"max_tokens": 3})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "prompt"

    r = complete(local_llm_server, prompt=[5, 6], model="gpt-4")
    assert r.status_code == 404
    assert r.json()["error"]["param"] == "model"


def test_a_text_prompt_is_tokenized_by_the_server(
    local_llm_server: LlmServer, tiny_engine: LocalEngine
) -> None:
    r = complete(local_llm_server, prompt="ls -la", max_tokens=3, return_token_ids=True)
    choice = r.json()["choices"][0]
    assert choice["prompt_token_ids"] == tiny_engine.tokenizer.encode("ls -la")
    assert len(choice["token_ids"]) == 3


def test_chat_completions_render_the_template_and_answer(
    local_llm_server: LlmServer, tiny_engine: LocalEngine
) -> None:
    body = {
        "model": local_llm_server.model,
        "messages": MESSAGES,
        "tools": TOOLS,
        "max_tokens": 6,
        "seed": 1,
        "return_token_ids": True,
    }
    r = httpx.post(f"{local_llm_server.root}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["object"] == "chat.completion"
    assert answer["prompt_token_ids"] == chat_ids(tiny_engine, MESSAGES, tools=TOOLS)
    (choice,) = answer["choices"]
    assert choice["message"]["role"] == "assistant"
    assert isinstance(choice["message"]["content"], str)
    assert choice["finish_reason"] in {"stop", "length"}
    assert answer["usage"]["prompt_tokens"] == len(answer["prompt_token_ids"])
    assert answer["usage"]["completion_tokens"] == len(choice["token_ids"])


def test_sglang_generate_answers_in_sglang_shape(
    local_llm_server: LlmServer, prompt: list[int]
) -> None:
    body: dict[str, Any] = {
        "input_ids": prompt,
        "sampling_params": {"max_new_tokens": 6, "temperature": 0},
        "return_logprob": True,
    }
    answer = httpx.post(f"{local_llm_server.root}/generate", json=body, timeout=60).json()
    meta = answer["meta_info"]
    assert len(answer["output_ids"]) == 6
    assert isinstance(answer["text"], str)
    assert meta["finish_reason"] == {"type": "length", "length": 6}
    assert meta["prompt_tokens"] == len(prompt)
    assert meta["completion_tokens"] == 6
    assert [entry[1] for entry in meta["output_token_logprobs"]] == answer["output_ids"]
    assert all(entry[2] is None for entry in meta["output_token_logprobs"])

    # The same engine behind both protocols: the same greedy ids and logprobs.
    vllm = complete(
        local_llm_server,
        prompt=prompt,
        max_tokens=6,
        temperature=0,
        logprobs=0,
        return_token_ids=True,
    ).json()["choices"][0]
    assert vllm["token_ids"] == answer["output_ids"]
    assert vllm["logprobs"]["token_logprobs"] == [e[0] for e in meta["output_token_logprobs"]]

    stop = answer["output_ids"][2]
    body["sampling_params"]["stop_token_ids"] = [stop]
    meta = httpx.post(f"{local_llm_server.root}/generate", json=body).json()["meta_info"]
    assert meta["finish_reason"] == {"type": "stop", "matched": stop}
    assert meta["output_token_logprobs"][-1][1] == stop
