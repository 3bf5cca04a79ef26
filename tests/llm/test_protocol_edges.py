"""vLLM's and SGLang's protocol edges, each against the scripted server (a test double that
replays given turns over real HTTP) made to behave like the server version that has it:
SGLang ≤ 0.5.4's prompt tokens in ``output_ids``, aborts while queued, partial aborts resumed
under a newer version, vLLM 0.34's ``error`` and ``repetition`` finish reasons, the context
length the server reports, sampling sent in full, logprob conventions and SGLang's seeds."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from rollserve.errors import BackendRequestError, InvalidInputError
from rollserve.llm.base import SamplingParams, TokenCompletion
from rollserve.llm.kinds import default_kinds
from rollserve.llm.router import Router
from rollserve.llm.session import ModelSession, VersionBound
from rollserve.llm.templates import TemplateCache
from rollserve.schema.backends import BackendSpec, BackendView, PauseRequest, ResumeRequest
from rollserve.schema.tokens import TurnInfo
from rollserve.settings import Settings
from rollserve.storage import SqliteJobStore
from rollserve.testing.scripted import ScriptedLLMServer, ScriptedTurn

MODEL = "scripted"
PROBE = {"content": "ok"}  # the turn a registration's probe uses


@pytest.fixture
async def router(tmp_path: Path) -> AsyncIterator[Router]:
    settings = Settings(data_dir=tmp_path / "data", llm_health_interval_s=3600.0, llm_wait_s=1.0)
    store = SqliteJobStore(tmp_path / "jobs.db")
    made = Router(settings, store, default_kinds(TemplateCache()))
    await made.start()
    yield made
    await made.stop()
    store.close()


def nth_generation(n: int, change: Callable[[dict[str, Any], dict[str, Any]], Any]) -> Any:
    """A rewrite applied to the n-th generation request only (the probe is the first)."""
    seen = 0
    lock = threading.Lock()

    def rewrite(path: str, body: dict[str, Any], answer: dict[str, Any]) -> Any:
        nonlocal seen
        with lock:
            seen += 1
            mine = seen == n
        return change(body, answer) if mine else answer

    return rewrite


async def register(
    router: Router, llm: ScriptedLLMServer, kind: str, tokenizer: Path, **fields: Any
) -> BackendView:
    spec = BackendSpec(kind=kind, url=llm.url, model=MODEL, tokenizer=str(tokenizer), **fields)  # type: ignore[arg-type]
    return await router.register(spec)


async def one_turn(
    router: Router, key: str = "t", max_tokens: int = 64, seed: int | None = None
) -> tuple[TokenCompletion, TurnInfo, list[int], ModelSession]:
    session = ModelSession(router.session(key, MODEL), TemplateCache(), VersionBound(), 3)
    await session.open()
    assert session.template is not None
    prompt = session.template.prompt_ids([{"role": "user", "content": "hi"}], [])
    sampling = SamplingParams(
        max_tokens=max_tokens, seed=seed, stop_token_ids=session.template.stop_ids
    )
    done, info = await session.complete_tokens(prompt, sampling)
    return done, info, prompt, session


def ids_of(llm: ScriptedLLMServer, content: str) -> list[int]:
    assert llm.tokenizer is not None
    text = llm.turn_text(ScriptedTurn(content=content))
    return [*llm.tokenizer.encode(text, add_special_tokens=False), int(llm.tokenizer.eos_token_id)]


def generations(llm: ScriptedLLMServer) -> list[dict[str, Any]]:
    return [body for path, body in llm.requests if path in ("/generate", "/v1/completions")]


async def test_sglang_054_prompt_tokens_in_output_ids(router: Router, tiny_model: Path) -> None:
    def prefixed(body: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
        answer["output_ids"] = body["input_ids"][-3:] + answer["output_ids"]
        return answer

    rewrite = nth_generation(2, prefixed)
    with ScriptedLLMServer(
        [PROBE, {"content": "hello"}], tokenizer=tiny_model, rewrite=rewrite
    ) as llm:
        await register(router, llm, "sglang", tiny_model)
        done, info, _, _ = await one_turn(router)
        assert done.token_ids == ids_of(llm, "hello")  # from the logprobs, not output_ids
        assert info.finish_reason == "stop" and info.generated_tokens == len(done.token_ids)


@pytest.mark.parametrize("flavour", ["sglang-0.5.4", "sglang-0.5.23", "vllm"])
async def test_an_abort_while_queued_is_resumed_not_taken_for_an_answer(
    router: Router, tiny_model: Path, flavour: str
) -> None:
    def aborted(body: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
        if flavour == "vllm":
            answer["choices"][0].update(token_ids=[], finish_reason="abort", text="")
            answer["choices"][0]["logprobs"] = {"token_logprobs": [], "tokens": []}
            return answer
        meta = answer["meta_info"]
        meta["finish_reason"] = {"type": "abort", "message": "Abort in waiting queue"}
        answer["output_ids"], answer["text"] = [], ""
        if flavour == "sglang-0.5.4":
            del meta["output_token_logprobs"]  # 200, and no logprobs at all
        else:
            meta["output_token_logprobs"] = []
        return answer

    turns = [PROBE, {"content": "lost"}, {"content": "answer"}]
    rewrite = nth_generation(2, aborted)
    kind = "vllm" if flavour == "vllm" else "sglang"
    with ScriptedLLMServer(turns, tokenizer=tiny_model, rewrite=rewrite) as llm:
        await register(router, llm, kind, tiny_model)
        done, info, _, _ = await one_turn(router)
        assert done.token_ids == ids_of(llm, "answer")
        assert [s.finish_reason for s in info.segments] == ["stop"]  # the empty abort made none
        first, again = generations(llm)[1:]
        assert first == again  # sent again as it was: nothing had been generated


async def test_a_partial_abort_resumes_under_the_new_version(
    router: Router, tiny_model: Path
) -> None:
    """The server aborts a generation during a weight update (vLLM ``/pause?mode=abort``):
    the prompt plus the tokens generated so far are sent again with the remaining budget, to
    the new weights; each segment keeps its version."""
    hold = threading.Event()
    kept = 3

    def partial(body: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
        hold.wait(10)  # until the trainer has paused the model
        choice = answer["choices"][0]
        choice["token_ids"] = choice["token_ids"][:kept]
        choice["logprobs"]["token_logprobs"] = choice["logprobs"]["token_logprobs"][:kept]
        choice["finish_reason"] = "abort"
        choice["weight_versions"] = [{"version": "w0", "start": 0, "end": kept}]
        return answer

    turns = [PROBE, {"content": "first words"}, {"content": "rest"}]
    with ScriptedLLMServer(turns, tokenizer=tiny_model, rewrite=nth_generation(2, partial)) as llm:
        await register(router, llm, "vllm", tiny_model, policy_version=0)
        turn = asyncio.create_task(one_turn(router, max_tokens=40))
        while len(generations(llm)) < 2:  # noqa: ASYNC110 - the server runs in a thread
            await asyncio.sleep(0.01)
        await router.pause(MODEL, PauseRequest(mode="wait", timeout_s=0))
        hold.set()
        await asyncio.sleep(0.1)
        assert len(generations(llm)) == 2  # not resumed while paused
        await router.resume(MODEL, ResumeRequest(policy_version=1))
        done, info, prompt, session = await turn
        head = ids_of(llm, "first words")[:kept]
        assert done.token_ids == head + ids_of(llm, "rest")
        assert len(done.logprobs) == len(done.token_ids)
        resumed = generations(llm)[2]
        assert resumed["prompt"] == prompt + head and resumed["max_tokens"] == 40 - kept
        assert [(s.policy_version, s.generated_tokens, s.finish_reason) for s in info.segments] == [
            (0, kept, "abort"),
            (1, len(done.token_ids) - kept, "stop"),
        ]
        assert info.segments[0].weight_version == "w0"
        assert info.policy_version == 1 and session.versions == [0, 1]
        assert info.generation is not None and info.generation.start == len(prompt)
        assert info.generation.end == len(prompt) + len(done.token_ids)


async def test_vllm_error_finish_fails_over_and_repetition_is_recorded(
    router: Router, tiny_model: Path
) -> None:
    def error(body: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
        answer["choices"][0]["finish_reason"] = "error"
        return answer

    def repetition(body: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
        answer["choices"][0]["finish_reason"] = "repetition"
        return answer

    turns = [PROBE, {"content": "x"}]
    with (
        ScriptedLLMServer(turns, tokenizer=tiny_model, rewrite=nth_generation(2, error)) as bad,
        ScriptedLLMServer(turns, tokenizer=tiny_model, rewrite=nth_generation(2, repetition)) as ok,
    ):
        first = await register(router, bad, "vllm", tiny_model, id="a", weight=100.0)
        await register(router, ok, "vllm", tiny_model, id="b", weight=0.01)
        _, info, _, _ = await one_turn(router)
        assert info.backend_id == "b" and info.finish_reason == "repetition"
        ejected = next(v for v in router.views() if v.id == first.id)
        assert not ejected.healthy and "ended in an error" in (ejected.last_error or "")


async def test_an_unknown_finish_reason_is_refused(router: Router, tiny_model: Path) -> None:
    def odd(body: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
        answer["meta_info"]["finish_reason"] = {"type": "weird"}
        return answer

    turns = [PROBE, {"content": "x"}]
    with ScriptedLLMServer(turns, tokenizer=tiny_model, rewrite=nth_generation(2, odd)) as llm:
        await register(router, llm, "sglang", tiny_model)
        with pytest.raises(BackendRequestError, match="unknown finish reason 'weird'"):
            await one_turn(router)


@pytest.mark.parametrize(("kind", "headroom"), [("vllm", 0), ("sglang", 1)])
async def test_the_context_budget_is_what_the_server_reports(
    router: Router, tiny_model: Path, kind: str, headroom: int
) -> None:
    with ScriptedLLMServer([PROBE] * 3, tokenizer=tiny_model, max_model_len=300) as llm:
        view = await register(router, llm, kind, tiny_model, id="served")
        assert view.context_limit == 300 - headroom  # not the tokenizer's 2048
        capped = await register(router, llm, kind, tiny_model, id="capped", max_model_len=100)
        assert capped.context_limit == 100 - headroom
    with ScriptedLLMServer([PROBE], tokenizer=tiny_model) as silent:
        fallback = await register(router, silent, kind, tiny_model, id="tokenizer")
        assert fallback.context_limit == 2048 - headroom


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
async def test_every_sampling_field_is_sent_and_recorded(
    router: Router, tiny_model: Path, kind: str
) -> None:
    with ScriptedLLMServer([PROBE] + [{"content": "x"}] * 3, tokenizer=tiny_model) as llm:
        await register(router, llm, kind, tiny_model)
        _, info, _, _ = await one_turn(router, key="sample-1")
        _, other, _, _ = await one_turn(router, key="sample-2")
        _, given, _, _ = await one_turn(router, key="sample-3", seed=11)
        sent = generations(llm)[1:]
    fields = {"temperature", "top_p", "top_k", "min_p", "repetition_penalty"}
    fields |= {"presence_penalty", "frequency_penalty"}
    for body, turn in zip(sent, (info, other, given), strict=True):
        params = body["sampling_params"] if kind == "sglang" else body
        assert fields <= set(params), params  # no field left to the server's defaults
        assert params["top_k"] == -1 and params["min_p"] == 0.0
        assert params["repetition_penalty"] == 1.0
        seed = params["sampling_seed"] if kind == "sglang" else params["seed"]
        assert turn.sampling["seed"] == seed and turn.sampling["top_k"] == -1
    assert info.sampling["seed"] != other.sampling["seed"]  # each sample its own seed
    assert given.sampling["seed"] == 11


async def test_logprob_conventions_are_recorded_and_never_mixed(
    router: Router, tiny_model: Path
) -> None:
    with ScriptedLLMServer([PROBE] * 4, tokenizer=tiny_model) as llm:
        assert (await register(router, llm, "vllm", tiny_model, id="v")).logprob_mode == "raw"
        with pytest.raises(InvalidInputError, match="one trajectory must not mix them"):
            await register(router, llm, "vllm", tiny_model, id="p", logprob_mode="processed")
        await router.remove("v")
        chosen = await register(router, llm, "vllm", tiny_model, id="p", logprob_mode="processed")
        assert chosen.logprob_mode == "processed"
        session = ModelSession(router.session("t", MODEL), TemplateCache(), VersionBound(), 3)
        await session.open()
        assert session.logprob_mode == "processed"


@pytest.mark.parametrize(
    ("info", "warning"),
    [
        (None, "cannot tell whether sampling seeds are honoured"),
        ({"enable_deterministic_inference": False}, "sampling seeds are not honoured"),
        ({"enable_deterministic_inference": True}, None),
    ],
)
async def test_sglang_warns_when_seeds_are_not_honoured(
    router: Router, tiny_model: Path, info: dict[str, Any] | None, warning: str | None
) -> None:
    with ScriptedLLMServer([PROBE], tokenizer=tiny_model, server_info=info) as llm:
        view = await register(router, llm, "sglang", tiny_model)
    if warning is None:
        assert view.warnings == []
    else:
        assert len(view.warnings) == 1 and warning in view.warnings[0]
    assert [v.warnings for v in router.views()] == [view.warnings]
