"""Token fidelity: in token mode the trajectory is exactly what the backend saw and generated,
never re-tokenized — against the tiny model (whose decode → re-encode is lossy) served by
``rollserve llm serve``, and against the scripted server for turns with real tool calls."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from rollserve.agents.base import RunContext
from rollserve.agents.tool import ToolAgent
from rollserve.agents.tools import tool_schemas
from rollserve.llm.base import ChatCompletion, LLMBackend, SamplingParams, TokenCompletion
from rollserve.llm.kinds import default_kinds
from rollserve.llm.parsers import default_parsers
from rollserve.llm.router import BackendFactory, Router
from rollserve.llm.session import Models
from rollserve.llm.templates import TemplateCache
from rollserve.registry import Registry
from rollserve.sandbox import SandboxManager, spec_for
from rollserve.schema.backends import BackendSpec, BackendView
from rollserve.schema.jobs import AgentConfig, JobRequest, Task
from rollserve.schema.run import RunOutput
from rollserve.settings import Settings
from rollserve.storage import SqliteJobStore
from rollserve.testing.scripted import ScriptedLLMServer
from tests.servers import LlmServer


class Recording:
    """A backend that keeps every token request: the prompt it sent and what came back."""

    def __init__(self, inner: LLMBackend) -> None:
        self.inner = inner
        self.calls: list[tuple[list[int], TokenCompletion]] = []

    @property
    def view(self) -> BackendView:
        return self.inner.view

    @property
    def token_mode(self) -> bool:
        return self.inner.token_mode

    async def check(self) -> None:
        await self.inner.check()

    async def verify(self) -> None:
        await self.inner.verify()

    async def complete_tokens(
        self, prompt_ids: list[int], sampling: SamplingParams
    ) -> TokenCompletion:
        done = await self.inner.complete_tokens(prompt_ids, sampling)
        self.calls.append((list(prompt_ids), done))
        return done

    async def chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        sampling: SamplingParams,
    ) -> ChatCompletion:
        return await self.inner.chat(messages, tools, sampling)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def _rollout(
    settings: Settings, spec: BackendSpec, agent: dict[str, Any], *, turn_tokens: int = 24
) -> tuple[RunOutput, Recording, TemplateCache]:
    templates = TemplateCache()
    made: list[Recording] = []

    real = default_kinds(templates)

    def build(view: BackendView, s: Settings) -> Recording:
        made.append(Recording(real.get(view.kind)(view, s)))
        return made[-1]

    kinds: Registry[BackendFactory] = Registry("backend kind")
    kinds.register(spec.kind, build)
    store = SqliteJobStore(settings.data_dir / "jobs.db")
    router = Router(settings, store, kinds)
    await router.start()
    try:
        await router.register(spec)
        made[-1].calls.clear()  # the registration's probe
        request = JobRequest(
            task=Task(task_id="t", kind="math", prompt="What is 6*7?", answer="42"),
            model=spec.model,
            agent=AgentConfig.model_validate({"name": "tool", **agent}),
            sampling={"max_tokens": turn_tokens, "temperature": 1.0, "seed": 3},
        )
        assert request.agent is not None
        context = RunContext(
            request=request,
            llm=Models(router, templates, settings.llm_abort_resumes).session("t", spec.model),
            system_prompt="Solve the problem; use the tools.",
            tools=["bash", "submit"],
        )
        async with SandboxManager(settings) as manager:
            sandbox = await manager.start(spec_for("bwrap"))
            try:
                output = await ToolAgent(default_parsers()).run(sandbox, request.agent, context)
            finally:
                await manager.close(sandbox)
    finally:
        await router.stop()
        store.close()
    return output, made[-1], templates


def _check_fidelity(output: RunOutput, recording: Recording) -> dict[str, list[Any]]:
    assert output.tokens is not None
    tokens = output.tokens
    ids, mask, logprobs = (
        tokens["response_ids"],
        tokens["response_mask"],
        tokens["response_logprobs"],
    )
    assert len(ids) == len(mask) == len(logprobs)
    prompts = [prompt for prompt, _ in recording.calls]
    assert len(prompts) >= 2  # multi-turn
    for earlier, later in itertools.pairwise(prompts):
        assert later[: len(earlier)] == earlier  # every prompt extends the one before
    last_prompt, last = recording.calls[-1]
    assert tokens["prompt_ids"] + ids == last_prompt + last.token_ids
    assert tokens["prompt_ids"] == prompts[0]
    generated = [t for t, m in zip(ids, mask, strict=True) if m == 1]
    assert generated == [t for _, done in recording.calls for t in done.token_ids]
    kept = [lp for lp, m in zip(logprobs, mask, strict=True) if m == 1]
    assert kept == [lp for _, done in recording.calls for lp in done.logprobs]
    assert all(lp == 0.0 for lp, m in zip(logprobs, mask, strict=True) if m == 0)
    assert 0 in mask and 1 in mask
    assert [t["backend_id"] for t in tokens["turns"]] == ["b"] * len(recording.calls)
    return tokens


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
async def test_tiny_model_trajectory_is_token_exact(
    settings: Settings,
    tiny_model: Path,
    llm_server_factory: Callable[[Path, str], LlmServer],
    kind: str,
) -> None:
    server = llm_server_factory(tiny_model, "tiny")
    spec = BackendSpec(id="b", kind=kind, url=server.url, model="tiny", tokenizer=str(tiny_model))
    # The tiny model never calls a tool: each reply gets an observation asking it to.
    output, recording, templates = await _rollout(
        settings, spec, {"max_turns": 3, "end_without_tool_call": False}
    )
    assert output.exit_reason == "max_turns" and output.turns == 3
    tokens = _check_fidelity(output, recording)
    # The logprobs are the model's: one forward pass over the whole sequence agrees.
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    sequence = tokens["prompt_ids"] + tokens["response_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([sequence])).logits[0]
    table = torch.log_softmax(logits.float(), dim=-1)
    start = len(tokens["prompt_ids"])
    for offset, (token, m, lp) in enumerate(
        zip(
            tokens["response_ids"],
            tokens["response_mask"],
            tokens["response_logprobs"],
            strict=True,
        )
    ):
        if m == 1:
            expected = table[start + offset - 1, token].item()
            assert abs(expected - lp) < 1e-4, (offset, expected, lp)
    # Re-tokenizing the conversation's text would not give these ids back.
    template = templates.get(str(tiny_model))
    assert template.encode(template.decode(sequence)) != sequence


async def test_tool_calls_and_observations_in_token_mode(
    settings: Settings, tiny_model: Path
) -> None:
    probe = {"content": "ok"}  # registration checks that the server generates from token ids
    turns = [
        probe,
        {
            "content": "Let me compute it.",
            "tool_calls": [{"name": "bash", "arguments": {"command": "echo $((6*7))"}}],
        },
        {"content": "", "tool_calls": [{"name": "submit", "arguments": {"answer": "42"}}]},
    ]
    with ScriptedLLMServer(turns, tokenizer=tiny_model) as llm:
        spec = BackendSpec(
            id="b", kind="vllm", url=llm.url, model="scripted", tokenizer=str(tiny_model)
        )
        output, recording, templates = await _rollout(
            settings, spec, {"max_turns": 5}, turn_tokens=400
        )
    assert output.exit_reason == "submitted" and output.submission == "42"
    tokens = _check_fidelity(output, recording)
    template = templates.get(str(tiny_model))
    observed = [
        t for t, m in zip(tokens["response_ids"], tokens["response_mask"], strict=True) if m == 0
    ]
    text = template.decode(observed)
    assert "<tool_response>" in text and "42" in text and text.endswith("<|im_start|>assistant\n")
    assert [m["role"] for m in output.messages][-3:] == ["tool", "assistant", "tool"]


async def test_the_context_budget_ends_the_episode_with_max_tokens(
    settings: Settings, tiny_model: Path, llm_server_factory: Callable[[Path, str], LlmServer]
) -> None:
    server = llm_server_factory(tiny_model, "tiny")
    spec = BackendSpec(id="b", kind="vllm", url=server.url, model="tiny", tokenizer=str(tiny_model))
    template = TemplateCache().get(str(tiny_model))
    messages = [
        {"role": "system", "content": "Solve the problem; use the tools."},
        {"role": "user", "content": "What is 6*7?"},
    ]
    prompt = len(template.prompt_ids(messages, tool_schemas(["bash", "submit"])))
    budget = prompt + 10  # less than one turn's 24 tokens
    output, recording, _ = await _rollout(
        settings, spec, {"max_turns": 5, "max_tokens": budget, "end_without_tool_call": False}
    )
    assert output.exit_reason == "max_tokens"
    assert output.tokens is not None
    [turn] = output.tokens["turns"]
    assert turn["truncated"] is True and turn["finish_reason"] == "length"
    assert len(output.tokens["prompt_ids"]) + len(output.tokens["response_ids"]) == budget
    [(_, done)] = recording.calls
    assert len(done.token_ids) == 10
