"""The backend kinds: ``vllm`` (token mode through ``/v1/completions`` with a token-id prompt),
``sglang`` (token mode through its native ``/generate``), ``openai`` (chat only)."""

from __future__ import annotations

from typing import Any

from rollserve.errors import BackendRequestError, InvalidInputError, RollserveError
from rollserve.llm.base import LLMBackend, SamplingParams, TokenCompletion
from rollserve.llm.http import HttpBackend
from rollserve.llm.router import BackendFactory
from rollserve.llm.templates import TemplateCache
from rollserve.registry import Registry
from rollserve.schema.backends import BackendView
from rollserve.settings import Settings


class VllmBackend(HttpBackend):
    """A vLLM OpenAI-compatible server."""

    supports_tokens = True

    async def complete_tokens(
        self, prompt_ids: list[int], sampling: SamplingParams
    ) -> TokenCompletion:
        body: dict[str, Any] = {
            "model": self.view.model,
            "prompt": prompt_ids,
            "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "logprobs": 1,
            "return_token_ids": True,
            "skip_special_tokens": False,
        }
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if sampling.stop_token_ids:
            body["stop_token_ids"] = list(sampling.stop_token_ids)
        answer = await self.request("POST", f"{self.view.url}/completions", body)
        try:
            choice = answer["choices"][0]
            ids = [int(i) for i in choice["token_ids"]]
            logprobs = [float(x) for x in choice["logprobs"]["token_logprobs"]]
            finish = str(choice.get("finish_reason") or "stop")
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise BackendRequestError(
                f"backend {self.view.id}: no token_ids/logprobs in its completion (is it a vLLM "
                f"server that supports return_token_ids?): {str(answer)[:300]}",
                backend_id=self.view.id,
            ) from exc
        return _checked(self.view.id, ids, logprobs, finish)

    async def probe_tokens(self) -> None:
        await _probe(self, "POST /completions with a token-id prompt and return_token_ids")


class SglangBackend(HttpBackend):
    """An SGLang server: token mode through its native ``/generate``."""

    supports_tokens = True

    async def complete_tokens(
        self, prompt_ids: list[int], sampling: SamplingParams
    ) -> TokenCompletion:
        params: dict[str, Any] = {
            "max_new_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "skip_special_tokens": False,
        }
        if sampling.seed is not None:
            params["sampling_seed"] = sampling.seed
        if sampling.stop_token_ids:
            params["stop_token_ids"] = list(sampling.stop_token_ids)
        body = {"input_ids": prompt_ids, "sampling_params": params, "return_logprob": True}
        answer = await self.request("POST", f"{self.root}/generate", body)
        try:
            meta = answer["meta_info"]
            pairs = meta["output_token_logprobs"]
            ids = [int(i) for i in answer.get("output_ids") or [p[1] for p in pairs]]
            logprobs = [float(p[0]) for p in pairs]
            reason = meta.get("finish_reason") or {}
            finish = str(reason.get("type") if isinstance(reason, dict) else reason) or "stop"
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise BackendRequestError(
                f"backend {self.view.id}: no output ids/logprobs in its /generate answer: "
                f"{str(answer)[:300]}",
                backend_id=self.view.id,
            ) from exc
        return _checked(self.view.id, ids, logprobs, "length" if finish == "length" else "stop")

    async def probe_tokens(self) -> None:
        await _probe(self, "POST /generate with input_ids")


class OpenAIBackend(HttpBackend):
    """Any OpenAI-compatible chat endpoint (hosted models): text mode, native tool calls."""

    async def complete_tokens(
        self, prompt_ids: list[int], sampling: SamplingParams
    ) -> TokenCompletion:
        raise InvalidInputError(f"backend {self.view.id} (openai) has no token mode")


def _checked(
    backend_id: str, ids: list[int], logprobs: list[float], finish: str
) -> TokenCompletion:
    if len(ids) != len(logprobs):
        raise BackendRequestError(
            f"backend {backend_id} returned {len(ids)} token ids but {len(logprobs)} logprobs",
            backend_id=backend_id,
        )
    return TokenCompletion(token_ids=ids, logprobs=logprobs, finish_reason=finish)


async def _probe(backend: VllmBackend | SglangBackend, what: str) -> None:
    """One token generated from a one-token prompt: the server speaks the kind's protocol."""
    template = backend.templates.get(backend.view.tokenizer or "")
    start = template.encode(
        template.render([{"role": "user", "content": "hi"}], None, generation_prompt=True)
    )
    try:
        await backend.complete_tokens(start, SamplingParams(max_tokens=1, temperature=0.0))
    except RollserveError as exc:
        raise InvalidInputError(
            f"backend {backend.view.url} is not a working {backend.view.kind} server in token "
            f"mode ({what}): {exc.message}",
            field="kind",
        ) from exc


def default_kinds(templates: TemplateCache) -> Registry[BackendFactory]:
    """The backend kinds by name, sharing one cache of chat templates."""
    kinds: Registry[BackendFactory] = Registry("backend kind")
    kinds.register("vllm", _factory(VllmBackend, templates))
    kinds.register("sglang", _factory(SglangBackend, templates))
    kinds.register("openai", _factory(OpenAIBackend, templates))
    return kinds


def _factory(
    cls: type[VllmBackend | SglangBackend | OpenAIBackend], templates: TemplateCache
) -> BackendFactory:
    def build(view: BackendView, settings: Settings) -> LLMBackend:
        return cls(view, settings, templates)

    return build
