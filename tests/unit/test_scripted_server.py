"""The scripted LLM server over real HTTP: OpenAI chat, vLLM token completions, SGLang generate,
recording, injected failures, and shutdown."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from rollserve.errors import InvalidInputError
from rollserve.llm.toolcalls import HermesParser, ToolCall
from rollserve.testing.scripted import Hold, ScriptedLLMServer, ScriptedTurn

EOS = "<|im_end|>"
BASH_TURN = {
    "content": "Let me look.",
    "tool_calls": [{"name": "bash", "arguments": {"command": "ls -la"}}],
}
SUBMIT_TURN = {"content": "", "tool_calls": [{"name": "submit", "arguments": {"answer": "42"}}]}


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small byte-level BPE tokenizer with a ChatML eos, trained on the spot."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>", "<|im_start|>", EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    corpus = ['<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'] * 20
    bpe.train_from_iterator([*corpus, "Let me look at the answer."] * 5, trainer=trainer)
    path = tmp_path_factory.mktemp("tokenizer")
    PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=EOS).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir))


def chat(server: ScriptedLLMServer, **extra: Any) -> httpx.Response:
    body = {"model": "scripted", "messages": [{"role": "user", "content": "hi"}], **extra}
    return httpx.post(f"{server.url}/chat/completions", json=body)


def test_models_lists_the_model() -> None:
    with ScriptedLLMServer([], model="tiny") as server:
        assert server.url == f"http://127.0.0.1:{server.port}{server.prefix}/v1"
        answer = httpx.get(f"{server.url}/models")
        assert answer.status_code == 200
        assert answer.json() == {
            "object": "list",
            "data": [{"id": "tiny", "object": "model", "owned_by": "scripted", "created": 0}],
        }
        assert httpx.get(f"{server.base_url}/health").status_code == 200


def test_a_client_of_an_earlier_server_on_the_port_gets_no_turn() -> None:
    """A server that took over a port answers a stale client (another prefix) with 404s."""
    with ScriptedLLMServer([{"content": "mine"}]) as server:
        stale = f"http://127.0.0.1:{server.port}/scripted-0000/v1"
        body = {"model": "scripted", "messages": [{"role": "user", "content": "hi"}]}
        assert httpx.get(f"{stale}/models").status_code == 404
        assert httpx.post(f"{stale}/chat/completions", json=body).status_code == 404
        assert server.turns_left == 1
        answer = httpx.post(f"{server.url}/chat/completions", json=body).json()
        assert answer["choices"][0]["message"]["content"] == "mine"


def test_chat_replays_turns_in_order_with_hermes_calls_in_content() -> None:
    turns = [BASH_TURN, SUBMIT_TURN, {"content": "done"}]
    with ScriptedLLMServer(turns) as server:
        first, second, third = (chat(server).json() for _ in range(3))
        assert server.turns_left == 0
    assert first["object"] == "chat.completion"
    assert first["model"] == "scripted"
    assert set(first["usage"]) == {"prompt_tokens", "completion_tokens", "total_tokens"}
    [choice] = first["choices"]
    assert choice["finish_reason"] == "stop"
    assert "tool_calls" not in choice["message"]
    parsed = HermesParser().parse(choice["message"]["content"])
    assert parsed.content == "Let me look."
    assert parsed.calls == [ToolCall("bash", {"command": "ls -la"}, "call_0")]
    assert choice["message"]["content"] == (
        'Let me look.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}'
        "\n</tool_call>"
    )
    assert HermesParser().parse(second["choices"][0]["message"]["content"]).calls[0].name == (
        "submit"
    )
    assert third["choices"][0]["message"]["content"] == "done"


def test_chat_native_tool_calls() -> None:
    with ScriptedLLMServer([BASH_TURN, SUBMIT_TURN], native_tool_calls=True) as server:
        first, second = chat(server).json(), chat(server).json()
    message = first["choices"][0]["message"]
    assert first["choices"][0]["finish_reason"] == "tool_calls"
    assert message["content"] == "Let me look."
    assert message["tool_calls"] == [
        {
            "id": "call_0_0",
            "type": "function",
            "function": {"name": "bash", "arguments": '{"command": "ls -la"}'},
        }
    ]
    assert second["choices"][0]["message"]["content"] is None
    assert second["choices"][0]["message"]["tool_calls"][0]["id"] == "call_1_0"


def test_exhausted_script_answers_500() -> None:
    with ScriptedLLMServer([{"content": "only"}]) as server:
        assert chat(server).status_code == 200
        answer = chat(server)
    assert answer.status_code == 500
    assert "no turn left" in answer.json()["error"]["message"]
    assert answer.json()["error"]["code"] == 500


def test_requests_are_recorded() -> None:
    with ScriptedLLMServer([{"content": "a"}, {"content": "b"}]) as server:
        chat(server, temperature=0.5)
        chat(server, tools=[{"type": "function", "function": {"name": "bash"}}])
        requests = server.requests
    assert [path for path, _ in requests] == ["/v1/chat/completions"] * 2
    assert requests[0][1]["temperature"] == 0.5
    assert requests[1][1]["tools"][0]["function"]["name"] == "bash"


def test_fail_next_answers_503_without_using_a_turn() -> None:
    with ScriptedLLMServer([{"content": "ok"}]) as server:
        server.fail_next(2)
        assert [chat(server).status_code for _ in range(2)] == [503, 503]
        assert httpx.get(f"{server.url}/models").status_code == 200
        answer = chat(server)
        assert len(server.requests) == 3
    assert answer.status_code == 200
    assert answer.json()["choices"][0]["message"]["content"] == "ok"


def test_wrong_model_is_refused_without_using_a_turn() -> None:
    with ScriptedLLMServer([{"content": "ok"}]) as server:
        answer = chat(server, model="other")
        assert answer.status_code == 404
        assert "other" in answer.json()["error"]["message"]
        assert server.turns_left == 1


def test_vllm_token_completions(tokenizer_dir: Path, tokenizer: Any) -> None:
    with ScriptedLLMServer([BASH_TURN, SUBMIT_TURN], tokenizer=tokenizer_dir) as server:
        prompt = tokenizer.encode("<|im_start|>user\nhi", add_special_tokens=False)
        body = {"model": "scripted", "prompt": prompt, "logprobs": 1, "return_token_ids": True}
        first = httpx.post(f"{server.url}/completions", json=body).json()
        generated = first["choices"][0]["token_ids"]
        second_prompt = prompt + generated + [1, 2, 3]
        second = httpx.post(
            f"{server.url}/completions", json={**body, "prompt": second_prompt}
        ).json()
        sent = [b["prompt"] for path, b in server.requests if path == "/v1/completions"]
    text = server.turn_text(ScriptedTurn.model_validate(BASH_TURN))
    expected = [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]
    [choice] = first["choices"]
    assert choice["token_ids"] == expected
    assert choice["prompt_token_ids"] == prompt
    assert choice["logprobs"]["token_logprobs"] == [-0.25] * len(expected)
    assert len(choice["logprobs"]["tokens"]) == len(expected)
    assert choice["finish_reason"] == "stop"
    assert HermesParser().parse(choice["text"]).calls[0].arguments == {"command": "ls -la"}
    assert first["usage"]["completion_tokens"] == len(expected)
    assert second["choices"][0]["prompt_token_ids"] == second_prompt
    assert sent[1][: len(sent[0])] == sent[0]  # each token prompt extends the previous one


def test_vllm_max_tokens_cuts_the_turn(tokenizer_dir: Path) -> None:
    with ScriptedLLMServer([BASH_TURN], tokenizer=tokenizer_dir) as server:
        body = {"prompt": [5, 6], "max_tokens": 3, "logprobs": 1, "return_token_ids": True}
        choice = httpx.post(f"{server.url}/completions", json=body).json()["choices"][0]
    assert choice["finish_reason"] == "length"
    assert len(choice["token_ids"]) == 3
    assert len(choice["logprobs"]["token_logprobs"]) == 3


def test_vllm_without_token_ids_or_logprobs(tokenizer_dir: Path) -> None:
    with ScriptedLLMServer([{"content": "hi"}], tokenizer=tokenizer_dir) as server:
        choice = httpx.post(f"{server.url}/completions", json={"prompt": [5]}).json()["choices"][0]
    assert choice["token_ids"] is None
    assert choice["prompt_token_ids"] is None
    assert choice["logprobs"] is None
    assert choice["text"] == "hi"


def test_sglang_generate_with_a_loaded_tokenizer(tokenizer: Any) -> None:
    with ScriptedLLMServer([SUBMIT_TURN, SUBMIT_TURN], tokenizer=tokenizer) as server:
        body = {
            "input_ids": [7, 8, 9],
            "sampling_params": {"temperature": 1.0, "max_new_tokens": 512},
            "return_logprob": True,
        }
        answer = httpx.post(f"{server.base_url}/generate", json=body).json()
        cut = httpx.post(
            f"{server.base_url}/generate",
            json={**body, "sampling_params": {"max_new_tokens": 2}},
        ).json()
    ids = answer["output_ids"]
    assert ids[-1] == tokenizer.eos_token_id
    meta = answer["meta_info"]
    assert meta["output_token_logprobs"] == [[-0.25, i, None] for i in ids]
    assert meta["finish_reason"] == {"type": "stop", "matched": tokenizer.eos_token_id}
    assert meta["prompt_tokens"] == 3
    assert meta["completion_tokens"] == len(ids)
    assert HermesParser().parse(answer["text"]).calls[0].arguments == {"answer": "42"}
    assert cut["meta_info"]["finish_reason"] == {"type": "length", "length": 2}
    assert cut["output_ids"] == ids[:2]


def test_token_endpoints_need_a_tokenizer() -> None:
    with ScriptedLLMServer([{"content": "x"}]) as server:
        answer = httpx.post(f"{server.url}/completions", json={"prompt": [1, 2]})
        assert answer.status_code == 400
        assert "tokenizer" in answer.json()["error"]["message"]
        assert server.turns_left == 1


def test_bad_prompt_is_refused_without_using_a_turn(tokenizer_dir: Path) -> None:
    with ScriptedLLMServer([{"content": "x"}], tokenizer=tokenizer_dir) as server:
        answer = httpx.post(f"{server.url}/completions", json={"prompt": [[1, 2]]})
        assert answer.status_code == 400
        assert server.turns_left == 1


def test_invalid_turn_is_refused() -> None:
    with pytest.raises(InvalidInputError, match="scripted turn 1"):
        ScriptedLLMServer([{"content": "ok"}, {"content": "x", "tool_call": []}])


def test_delay_then_kill_resets_the_request_in_flight() -> None:
    server = ScriptedLLMServer([{"content": "slow"}], delay_s=60).start()
    outcome: list[BaseException | int] = []

    def call() -> None:
        try:
            outcome.append(chat(server).status_code)
        except httpx.HTTPError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=call)
    thread.start()
    while not server.requests:  # recorded on arrival, answered only after the delay
        thread.join(0.01)
    assert thread.is_alive()
    server.kill()
    thread.join()
    assert isinstance(outcome[0], httpx.TransportError)
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{server.url}/models")


def test_stop_answers_the_request_in_flight() -> None:
    server = ScriptedLLMServer([{"content": "slow"}], delay_s=0.2).start()
    outcome: list[int] = []
    thread = threading.Thread(target=lambda: outcome.append(chat(server).status_code))
    thread.start()
    while not server.requests:
        thread.join(0.01)
    server.stop()
    thread.join()
    assert outcome == [200]
    server.stop()  # idempotent


def test_a_held_answer_comes_when_released_and_the_rest_are_served_meanwhile() -> None:
    release = threading.Event()
    hold_first = lambda path, body, answer: Hold(release) if "held" in str(body) else answer  # noqa: E731
    turns = [{"content": "first"}, {"content": "second"}]
    with ScriptedLLMServer(turns, rewrite=hold_first) as server:
        answers: list[httpx.Response] = []
        body = {"messages": [{"role": "user", "content": "held"}]}
        thread = threading.Thread(target=lambda: answers.append(chat(server, **body)))
        thread.start()
        while server.served < 1:
            thread.join(0.01)
        assert chat(server).json()["choices"][0]["message"]["content"] == "second"
        thread.join(0.3)
        assert thread.is_alive() and answers == []  # still held
        release.set()
        thread.join()
        assert answers[0].json()["choices"][0]["message"]["content"] == "first"


def test_stop_releases_the_answers_held() -> None:
    server = ScriptedLLMServer([{"content": "held"}], rewrite=lambda *a: Hold(threading.Event()))
    server.start()
    outcome: list[int] = []
    thread = threading.Thread(target=lambda: outcome.append(chat(server).status_code))
    thread.start()
    while server.served < 1:
        thread.join(0.01)
    server.stop()
    thread.join()
    assert outcome == [200]
