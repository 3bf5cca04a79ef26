"""One trajectory's access to its model: routed calls (sticky, failing over), token or text mode
decided by the backend that serves it, and a record of every turn."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rollserve.errors import BackendRequestError
from rollserve.llm.base import ChatCompletion, LLMBackend, SamplingParams, TokenCompletion
from rollserve.llm.templates import ChatTemplate, TemplateCache
from rollserve.schema.tokens import TurnInfo

if TYPE_CHECKING:
    from rollserve.llm.router import Router, RouteSession


class ModelSession:
    """Model calls for one rollout. ``open`` picks its backend (waiting for one if needed)."""

    def __init__(self, route: RouteSession, templates: TemplateCache) -> None:
        self._route = route
        self._templates = templates
        self.token_mode = False
        self.template: ChatTemplate | None = None
        self.context_limit: int | None = None

    async def open(self) -> None:
        backend = await self._route.pick()
        self.token_mode = backend.token_mode
        if self.token_mode:
            assert backend.view.tokenizer is not None
            self.template = self._templates.get(backend.view.tokenizer)
        limits = [n for n in (backend.view.max_model_len, self._max_length()) if n]
        self.context_limit = min(limits) if limits else None

    def _max_length(self) -> int | None:
        return self.template.max_length if self.template is not None else None

    async def complete_tokens(
        self, prompt_ids: list[int], sampling: SamplingParams
    ) -> tuple[TokenCompletion, TurnInfo]:
        async def call(backend: LLMBackend) -> TokenCompletion:
            self._same_mode(backend)
            return await backend.complete_tokens(prompt_ids, sampling)

        done, backend = await self._route.call(call)
        return done, _turn(backend, done.finish_reason, len(prompt_ids), len(done.token_ids))

    async def chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        sampling: SamplingParams,
    ) -> tuple[ChatCompletion, TurnInfo]:
        async def call(backend: LLMBackend) -> ChatCompletion:
            self._same_mode(backend)
            return await backend.chat(messages, tools, sampling)

        done, backend = await self._route.call(call)
        usage = done.usage
        info = _turn(
            backend,
            done.finish_reason,
            int(usage.get("prompt_tokens", 0)),
            int(usage.get("completion_tokens", 0)),
        )
        return done, info

    def _same_mode(self, backend: LLMBackend) -> None:
        if backend.token_mode != self.token_mode:
            raise BackendRequestError(
                f"backend {backend.view.id} serves {backend.view.model!r} in "
                f"{'token' if backend.token_mode else 'text'} mode, but this rollout started "
                f"in {'token' if self.token_mode else 'text'} mode",
                backend_id=backend.view.id,
            )


def _turn(backend: LLMBackend, finish: str, prompt: int, generated: int) -> TurnInfo:
    view = backend.view
    return TurnInfo(
        backend_id=view.id,
        model=view.model,
        policy_version=view.policy_version,
        prompt_tokens=prompt,
        generated_tokens=generated,
        finish_reason=finish,
    )


class Models:
    """The node's models for the pipeline: a ModelSession per rollout."""

    def __init__(self, router: Router, templates: TemplateCache) -> None:
        self.router = router
        self.templates = templates

    def session(self, key: str, model: str | None) -> ModelSession:
        return ModelSession(self.router.session(key, model), self.templates)
