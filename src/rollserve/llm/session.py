"""One trajectory's access to its model: routed calls (sticky, failing over), token or text mode
decided by the backend that serves it, aborted generations resumed from the tokens they had,
the job's bound on policy staleness, and a record of every turn."""

from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, Any

from rollserve.errors import BackendRequestError, BackendUnavailableError, StaleRolloutError
from rollserve.llm.base import ChatCompletion, LLMBackend, SamplingParams, TokenCompletion
from rollserve.llm.templates import ChatTemplate, TemplateCache
from rollserve.schema.tokens import LogprobMode, Segment, TokenSpan, TurnInfo

if TYPE_CHECKING:
    from rollserve.llm.route import RouteSession
    from rollserve.llm.router import Router
    from rollserve.schema.backends import BackendView


@dataclass(frozen=True)
class VersionBound:
    """A job's bound on the policy versions its turns may come from."""

    max_staleness: int | None = None
    min_policy_version: int | None = None


class ModelSession:
    """Model calls for one rollout. ``open`` picks its backend (waiting for one if needed)."""

    def __init__(
        self,
        route: RouteSession,
        templates: TemplateCache,
        bound: VersionBound,
        abort_resumes: int,
    ) -> None:
        self._route = route
        self._templates = templates
        self._bound = bound
        self._abort_resumes = abort_resumes
        self.token_mode = False
        self.template: ChatTemplate | None = None
        self.context_limit: int | None = None
        self.logprob_mode: LogprobMode | None = None
        self.versions: list[int] = []  # of every segment generated so far
        # Each sample gets its own seed unless the job gives one: a server that fixes an
        # unseeded request's seed (SGLang's deterministic mode) would make a group identical.
        digest = hashlib.sha256(route.key.encode()).digest()
        self.seed = int.from_bytes(digest[:4], "big") & 0x7FFFFFFF

    async def open(self) -> None:
        self._route.floor = self._floor()
        backend = await self._route.pick()
        self.token_mode = backend.token_mode
        self.logprob_mode = backend.view.logprob_mode
        if self.token_mode:
            assert backend.view.tokenizer is not None
            self.template = await self._templates.aget(backend.view.tokenizer)
        limits = [n for n in (backend.view.context_limit, self._max_length()) if n]
        self.context_limit = min(limits) if limits else None

    def _max_length(self) -> int | None:
        return self.template.max_length if self.template is not None else None

    def paused(self) -> bool:
        """Whether the model is paused for a weight update now."""
        return self._route.pauses.paused(self._route.model)

    def stalled_s(self) -> float:
        """Seconds the model has been paused in all (a rollout's timeout leaves them out)."""
        return self._route.pauses.stalled_s(self._route.model)

    # -- staleness ------------------------------------------------------------------------------

    def _floor(self) -> int | None:
        """The oldest version the next call may use."""
        floors = []
        if self._bound.min_policy_version is not None:
            floors.append(self._bound.min_policy_version)
        newest = self._route.newest_version()
        if self._bound.max_staleness is not None and newest is not None:
            floors.append(newest - self._bound.max_staleness)
        return max(floors) if floors else None

    def check_stale(self) -> None:
        """Raise StaleRolloutError when the trajectory's oldest turn lags the newest version
        registered for its model by more than the job's ``max_staleness``."""
        newest = self._route.newest_version()
        limit = self._bound.max_staleness
        if limit is None or newest is None or not self.versions:
            return
        oldest = min(self.versions)
        if newest - oldest > limit:
            raise StaleRolloutError(
                f"the rollout's oldest turn has policy version {oldest}; the newest registered "
                f"is {newest}, more than max_staleness={limit} ahead",
                min_policy_version=oldest,
                max_policy_version=max(self.versions),
                newest=newest,
                max_staleness=limit,
            )

    # -- calls ----------------------------------------------------------------------------------

    async def complete_tokens(
        self, prompt_ids: list[int], sampling: SamplingParams
    ) -> tuple[TokenCompletion, TurnInfo]:
        """One turn. An aborted generation is resumed: the prompt and the tokens generated so
        far go out again with the remaining budget, each segment keeping its own version."""
        sampling = self._seeded(sampling)
        began = time.monotonic()
        ids: list[int] = []
        logprobs: list[float] = []
        segments: list[Segment] = []
        remaining = sampling.max_tokens
        aborts = 0
        while True:
            self._prepare()
            left = replace(sampling, max_tokens=remaining)
            done, view = await self._route.call(partial(self._generate, prompt_ids + ids, left))
            if done.token_ids or done.finish_reason != "abort":  # an empty abort made nothing
                segments.append(
                    self._segment(
                        view, len(done.token_ids), done.finish_reason, done.weight_version
                    )
                )
            aborts += done.finish_reason == "abort"
            ids += done.token_ids
            logprobs += done.logprobs
            remaining -= len(done.token_ids)
            finish = done.finish_reason
            if finish != "abort":
                break
            if remaining <= 0:
                finish = "length"
                break
            await self._resume_after_abort(aborts, view.id)
        done = TokenCompletion(ids, logprobs, finish, segments[-1].weight_version)
        start = len(prompt_ids)
        info = self._turn(view, finish, start, len(ids), segments)
        info.sampling = sampling.fields()
        info.latency_s = round(time.monotonic() - began, 6)
        info.prompt = TokenSpan(start=0, end=start)
        info.generation = TokenSpan(start=start, end=start + len(ids))
        return done, info

    async def chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        sampling: SamplingParams,
    ) -> tuple[ChatCompletion, TurnInfo]:
        """One text-mode turn; an aborted one is generated again (text cannot be resumed
        exactly)."""
        sampling = self._seeded(sampling)
        began = time.monotonic()
        attempt = 0
        while True:
            self._prepare()

            async def call(backend: LLMBackend) -> ChatCompletion:
                self._same_mode(backend)
                return await backend.chat(messages, tools, sampling)

            done, view = await self._route.call(call)
            if done.finish_reason != "abort":
                break
            attempt += 1
            await self._resume_after_abort(attempt, view.id)
        usage = done.usage
        generated = int(usage.get("completion_tokens", 0))
        segment = self._segment(view, generated, done.finish_reason)
        info = self._turn(
            view,
            done.finish_reason,
            int(usage.get("prompt_tokens", 0)),
            generated,
            [segment],
        )
        info.sampling = sampling.fields()
        info.latency_s = round(time.monotonic() - began, 6)
        return done, info

    async def _generate(
        self, prompt_ids: list[int], sampling: SamplingParams, backend: LLMBackend
    ) -> TokenCompletion:
        self._same_mode(backend)
        return await backend.complete_tokens(prompt_ids, sampling)

    def _prepare(self) -> None:
        """Before each request: the bound still holds, and the route knows its floor."""
        self.check_stale()
        self._route.floor = self._floor()

    async def _resume_after_abort(self, aborted: int, backend_id: str) -> None:
        if aborted > self._abort_resumes:
            raise BackendUnavailableError(
                f"backend {backend_id}: the turn's generation was aborted {aborted} times",
                backend_id=backend_id,
            )
        if self.paused():
            await self._route.settle()
        else:  # aborted by the server itself: give it a moment before resuming
            await asyncio.sleep(min(0.05 * 2**aborted, 5.0))

    def _seeded(self, sampling: SamplingParams) -> SamplingParams:
        return sampling if sampling.seed is not None else replace(sampling, seed=self.seed)

    def _segment(
        self,
        view: BackendView,
        generated: int,
        finish: str,
        weight_version: str | None = None,
    ) -> Segment:
        """One request's record; its version joins the trajectory's."""
        if view.policy_version is not None:
            self.versions.append(view.policy_version)
        return Segment(
            backend_id=view.id,
            policy_version=view.policy_version,
            weight_version=weight_version,
            generated_tokens=generated,
            finish_reason=finish,
        )

    @staticmethod
    def _turn(
        view: BackendView, finish: str, prompt: int, generated: int, segments: list[Segment]
    ) -> TurnInfo:
        return TurnInfo(
            backend_id=view.id,
            model=view.model,
            policy_version=view.policy_version,
            prompt_tokens=prompt,
            generated_tokens=generated,
            finish_reason=finish,
            segments=segments,
        )

    def _same_mode(self, backend: LLMBackend) -> None:
        if backend.token_mode != self.token_mode:
            raise BackendRequestError(
                f"backend {backend.view.id} serves {backend.view.model!r} in "
                f"{'token' if backend.token_mode else 'text'} mode, but this rollout started "
                f"in {'token' if self.token_mode else 'text'} mode",
                backend_id=backend.view.id,
            )


class Models:
    """The node's models for the pipeline: a ModelSession per rollout."""

    def __init__(self, router: Router, templates: TemplateCache, abort_resumes: int) -> None:
        self.router = router
        self.templates = templates
        self.abort_resumes = abort_resumes

    def session(
        self, key: str, model: str | None, bound: VersionBound | None = None
    ) -> ModelSession:
        route = self.router.session(key, model)
        return ModelSession(route, self.templates, bound or VersionBound(), self.abort_resumes)
