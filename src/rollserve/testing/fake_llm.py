"""In-process fake inference backends that emulate a server's speed and parallel slots, for
testing the router and whatever drives it, and for ``rollserve bench router``."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from rollserve.errors import BackendUnavailableError, InvalidInputError, RollserveError
from rollserve.llm.base import ChatCompletion, SamplingParams, TokenCompletion
from rollserve.schema.backends import BackendView
from rollserve.settings import Settings


@dataclass(frozen=True)
class FakeBehaviour:
    """How a fake server answers: a call takes ``latency_s + per_token_s * max_tokens``, at
    most ``slots`` calls run at once (the rest queue, as in a real server), and whether it
    generates from token ids; ``verify_error`` refuses the registration."""

    latency_s: float = 0.0
    per_token_s: float = 0.0
    slots: int | None = None
    token_mode: bool = True
    verify_error: RollserveError | None = None


class FakeLLMBackend:
    """An LLMBackend without a server. Tests steer it through its public attributes: clear
    ``healthy`` to fail health checks, set ``failing`` to make calls raise
    BackendUnavailableError, set ``verify_error`` to refuse registration, and give it a
    ``gate`` (an unset asyncio.Event) to hold calls in flight until the event is set."""

    def __init__(self, view: BackendView, behaviour: FakeBehaviour | None = None) -> None:
        self.view = view
        self.behaviour = behaviour or FakeBehaviour()
        self._slots = asyncio.Semaphore(self.behaviour.slots) if self.behaviour.slots else None
        self.healthy = True
        self.failing = False
        self.verify_error = self.behaviour.verify_error
        self.gate: asyncio.Event | None = None
        self.closed = False
        self.checks = 0
        self.attempts = 0  # calls received
        self.calls = 0  # calls answered
        self.in_flight = 0
        self.max_in_flight = 0

    @property
    def token_mode(self) -> bool:
        """Whether ``complete_tokens`` works (set by the behaviour)."""
        return self.behaviour.token_mode

    async def check(self) -> None:
        """Raise BackendUnavailableError while ``healthy`` is cleared or after ``aclose``."""
        self.checks += 1
        if self.closed or not self.healthy:
            raise BackendUnavailableError(f"{self.view.url}: connection refused")

    async def verify(self) -> None:
        """Raise ``verify_error`` if one is set, else behave as ``check``."""
        if self.verify_error is not None:
            raise self.verify_error
        await self.check()

    async def complete_tokens(
        self, prompt_ids: list[int], sampling: SamplingParams
    ) -> TokenCompletion:
        """``max_tokens`` made-up token ids, after the emulated generation time."""
        if not self.token_mode:
            raise InvalidInputError(f"backend {self.view.id} has no token mode", field="tokenizer")
        await self._generate(sampling.max_tokens)
        ids = [(len(prompt_ids) + i) % 1000 + 1 for i in range(sampling.max_tokens)]
        return TokenCompletion(ids, [-0.5] * len(ids), "length")

    async def chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        sampling: SamplingParams,
    ) -> ChatCompletion:
        """A fixed reply naming this backend, after the emulated generation time."""
        await self._generate(sampling.max_tokens)
        return ChatCompletion(content=f"reply {len(messages)} from {self.view.id}")

    async def aclose(self) -> None:
        """Mark the backend closed: later calls and checks fail."""
        self.closed = True

    async def _generate(self, tokens: int) -> None:
        self.attempts += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.closed or self.failing:
                raise BackendUnavailableError(f"{self.view.url}: connection reset")
            if self.gate is not None:
                await self.gate.wait()
                if self.closed or self.failing:  # it went down while the call waited
                    raise BackendUnavailableError(f"{self.view.url}: connection reset")
            seconds = self.behaviour.latency_s + self.behaviour.per_token_s * tokens
            if self._slots is None:
                await asyncio.sleep(seconds)
            else:
                async with self._slots:
                    await asyncio.sleep(seconds)
            self.calls += 1
        finally:
            self.in_flight -= 1


class FakeLLMFactory:
    """A router backend factory that builds FakeLLMBackends (behaviour by backend id, else
    ``default``) and keeps every one it built."""

    def __init__(
        self,
        default: FakeBehaviour | None = None,
        behaviours: dict[str, FakeBehaviour] | None = None,
    ) -> None:
        self.default = default or FakeBehaviour()
        self.behaviours = dict(behaviours or {})
        self.built: list[FakeLLMBackend] = []

    def __call__(self, view: BackendView, settings: Settings) -> FakeLLMBackend:
        backend = FakeLLMBackend(view, self.behaviours.get(view.id, self.default))
        self.built.append(backend)
        return backend

    def latest(self, backend_id: str) -> FakeLLMBackend:
        """The backend built last for ``backend_id``."""
        for backend in reversed(self.built):
            if backend.view.id == backend_id:
                return backend
        raise KeyError(backend_id)
