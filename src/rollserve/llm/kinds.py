"""The backend kinds: ``vllm`` (token mode through ``/v1/completions`` with a token-id prompt),
``sglang`` (token mode through its native ``/generate``), ``openai`` (chat only)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from rollserve.errors import (
    BackendRequestError,
    BackendUnavailableError,
    InvalidInputError,
    RollserveError,
)
from rollserve.llm.base import (
    FINISH_REASONS,
    LOGPROB_FLOOR,
    LLMBackend,
    SamplingParams,
    TokenCompletion,
)
from rollserve.llm.http import HttpBackend
from rollserve.llm.router import BackendFactory
from rollserve.llm.templates import TemplateCache
from rollserve.registry import Registry
from rollserve.schema.backends import BackendView
from rollserve.settings import Settings

_ALL_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "seed",
)


class VllmBackend(HttpBackend):
    """A vLLM OpenAI-compatible server. Its logprobs are raw (before temperature) unless it was
    started with ``--logprobs-mode processed_logprobs``."""

    supports_tokens = True
    default_logprob_mode = "raw"
    chat_fields = _ALL_FIELDS

    async def complete_tokens(
        self, prompt_ids: list[int], sampling: SamplingParams
    ) -> TokenCompletion:
        body: dict[str, Any] = {
            "model": self.view.model,
            "prompt": prompt_ids,
            **sampling.fields(),
            "stop_token_ids": list(sampling.stop_token_ids),
            "logprobs": 1,
            "return_token_ids": True,
            "return_weight_versions": True,
            "skip_special_tokens": False,
        }
        answer = await self.request("POST", f"{self.view.url}/completions", body)
        try:
            choice = answer["choices"][0]
            finish = choice.get("finish_reason")
            token_ids = choice.get("token_ids")
            if token_ids is None and finish != "abort":
                raise KeyError("token_ids")
            entries = (choice.get("logprobs") or {}).get("token_logprobs") or []
            spans = choice.get("weight_versions") or []  # vLLM 0.34 with return_weight_versions
            version = spans[-1].get("version") if spans else None
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
            raise _broken(
                self.view.id,
                "no token_ids/logprobs in its completion (is it a vLLM server that supports "
                f"return_token_ids?): {str(answer)[:300]}",
            ) from exc
        done = _checked(self, token_ids or [], entries, _finish(self.view.id, finish))
        done.weight_version = None if version is None else str(version)
        return done

    async def probe_tokens(self) -> None:
        await _probe(self, "POST /completions with a token-id prompt and return_token_ids")


class SglangBackend(HttpBackend):
    """An SGLang server: token mode through its native ``/generate``. It refuses a request
    whose prompt plus ``max_new_tokens`` reaches the context length, hence one token of
    headroom; its logprobs are after temperature unless started with
    ``SGLANG_RETURN_ORIGINAL_LOGPROB=1``."""

    supports_tokens = True
    default_logprob_mode = "processed"
    context_headroom = 1
    chat_fields = _ALL_FIELDS

    async def complete_tokens(
        self, prompt_ids: list[int], sampling: SamplingParams
    ) -> TokenCompletion:
        fields = sampling.fields()
        params: dict[str, Any] = {
            "max_new_tokens": fields.pop("max_tokens"),
            "sampling_seed": fields.pop("seed"),
            **fields,
            "stop_token_ids": list(sampling.stop_token_ids),
            "skip_special_tokens": False,
        }
        body = {"input_ids": prompt_ids, "sampling_params": params, "return_logprob": True}
        answer = await self.request("POST", f"{self.root}/generate", body)
        try:
            meta = answer["meta_info"]
            reason = meta.get("finish_reason")
            finish = reason.get("type") if isinstance(reason, dict) else reason
            pairs = meta.get("output_token_logprobs")
            if pairs is None and finish != "abort":
                raise KeyError("output_token_logprobs")
            # The ids come from the logprobs: up to SGLang 0.5.4, output_ids starts with up to
            # five prompt tokens.
            ids = [p[1] for p in pairs or []]
            logprobs = [p[0] for p in pairs or []]
            version = meta.get("weight_version")
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
            raise _broken(
                self.view.id, f"no output ids/logprobs in its /generate answer: {str(answer)[:300]}"
            ) from exc
        done = _checked(self, ids, logprobs, _finish(self.view.id, finish))
        done.weight_version = None if version is None else str(version)
        return done

    async def probe_tokens(self) -> None:
        await _probe(self, "POST /generate with input_ids")

    async def warnings(self) -> list[str]:
        """Seeds: SGLang honours ``sampling_seed`` only in deterministic mode."""
        info: Any = None
        for route in ("/server_info", "/get_server_info"):  # the second before SGLang 0.5.x
            try:
                info = await self.request("GET", f"{self.root}{route}")
                break
            except RollserveError as exc:
                problem = exc.message[:200]
        if info is None:
            return [
                f"cannot tell whether sampling seeds are honoured (GET /server_info: {problem});"
                " SGLang ignores them unless started with --enable-deterministic-inference"
            ]
        if isinstance(info, dict) and info.get("enable_deterministic_inference"):
            return []
        return [
            "sampling seeds are not honoured: this SGLang server was not started with "
            "--enable-deterministic-inference, so a sample cannot be reproduced from its seed"
        ]


class OpenAIBackend(HttpBackend):
    """Any OpenAI-compatible chat endpoint (hosted models): text mode, native tool calls."""

    async def complete_tokens(
        self, prompt_ids: list[int], sampling: SamplingParams
    ) -> TokenCompletion:
        raise InvalidInputError(f"backend {self.view.id} (openai) has no token mode")


def _finish(backend_id: str, reported: Any) -> str:
    """The finish reason as rollserve handles it; ``error`` (vLLM 0.34) is a failure of the
    server, retried elsewhere; anything unknown is refused, never taken for an ending."""
    if reported in FINISH_REASONS:
        return str(reported)
    if reported == "error":
        raise BackendUnavailableError(
            f"backend {backend_id}: the generation ended in an error", backend_id=backend_id
        )
    raise BackendRequestError(
        f"backend {backend_id}: unknown finish reason {reported!r}", backend_id=backend_id
    )


def _checked(
    backend: VllmBackend | SglangBackend, ids: Any, logprobs: Any, finish: str
) -> TokenCompletion:
    """The generation as a trajectory may keep it: one integer id of the model's vocabulary
    and one number (null: the floor) per token. Anything else raises BackendUnavailableError:
    the server is broken, and the turn goes to another backend."""
    name = backend.view.id
    if not isinstance(ids, list) or not isinstance(logprobs, list):
        raise _broken(name, "its token ids or logprobs are not lists")
    tokenizer = backend.view.tokenizer
    vocab = backend.templates.get(tokenizer).vocab_size if tokenizer else None
    wrong = [i for i in ids if type(i) is not int or i < 0 or (vocab is not None and i >= vocab)]
    if wrong:
        within = f"integers 0 to {vocab - 1}" if vocab else "integers"
        raise _broken(name, f"token ids outside the vocabulary ({within}): {wrong[:5]!r}")
    if len(ids) != len(logprobs):
        raise _broken(name, f"{len(ids)} token ids but {len(logprobs)} logprobs")
    odd = [x for x in logprobs if x is not None and not _is_logprob(x)]
    if odd:
        raise _broken(name, f"logprobs that are not numbers: {odd[:5]!r}")
    values = [LOGPROB_FLOOR if x is None or x == -math.inf else float(x) for x in logprobs]
    return TokenCompletion(token_ids=ids, logprobs=values, finish_reason=finish)


def _is_logprob(value: Any) -> bool:
    return type(value) in (int, float) and not math.isnan(value) and value != math.inf


def _broken(backend_id: str, what: str) -> BackendUnavailableError:
    return BackendUnavailableError(
        f"backend {backend_id} answered a malformed generation: {what}", backend_id=backend_id
    )


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


KindFactory = Callable[[BackendView, Settings, TemplateCache], LLMBackend]
"""Makes an inference backend of one kind (``BackendSpec.kind``) for a registration; the
node's cache of chat templates is shared by all (a backend class taking these is one)."""


def built_in_kinds() -> Registry[KindFactory]:
    """The backend kinds rollserve ships, by name."""
    kinds: Registry[KindFactory] = Registry("backend kind")
    kinds.register("vllm", VllmBackend)
    kinds.register("sglang", SglangBackend)
    kinds.register("openai", OpenAIBackend)
    return kinds


def with_templates(
    kinds: Registry[KindFactory], templates: TemplateCache
) -> Registry[BackendFactory]:
    """The router's registry of ``kinds``, all sharing ``templates``."""
    registry: Registry[BackendFactory] = Registry(kinds.kind)
    for name in kinds:
        registry.register(name, _bound(kinds.get(name), templates))
    return registry


def default_kinds(templates: TemplateCache) -> Registry[BackendFactory]:
    """The built-in backend kinds for a router, sharing one cache of chat templates."""
    return with_templates(built_in_kinds(), templates)


def _bound(kind: KindFactory, templates: TemplateCache) -> BackendFactory:
    def build(view: BackendView, settings: Settings) -> LLMBackend:
        return kind(view, settings, templates)

    return build
