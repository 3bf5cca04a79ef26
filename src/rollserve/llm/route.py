"""The route of one trajectory through the router: its calls stick to one backend, fail over
to another when that one fails, and wait out a pause of the model."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from rollserve.errors import BackendUnavailableError
from rollserve.llm.base import LLMBackend
from rollserve.llm.health import BackendState
from rollserve.llm.pause import PauseAborted, Pauses
from rollserve.schema.backends import BackendView

T = TypeVar("T")


class Routing(Protocol):
    """What a route needs of the router (``rollserve.llm.router.Router``)."""

    @property
    def pauses(self) -> Pauses: ...

    @property
    def failover_attempts(self) -> int: ...

    def state(self, backend_id: str) -> BackendState | None: ...

    def newest_version(self, model: str | None) -> int | None: ...

    async def acquire(
        self, model: str | None, sticky: str | None, floor: int | None = None
    ) -> BackendState: ...

    def release(self, state: BackendState) -> None: ...

    async def wait_changed(self, timeout: float) -> bool: ...


class RouteSession:
    """The calls of one trajectory: every turn goes to the same backend (its prefix cache
    holds the conversation) while that backend is usable; a failing backend is ejected and
    the call fails over to another. ``floor`` is the oldest policy version its next call may
    use (bounded staleness)."""

    def __init__(self, router: Routing, key: str, model: str | None) -> None:
        self.key = key
        self.model = model
        self.floor: int | None = None
        self._router = router
        self._sticky: str | None = None

    @property
    def backend(self) -> BackendView | None:
        """The backend this trajectory sticks to, if it is still registered."""
        state = self._router.state(self._sticky) if self._sticky else None
        return state.view() if state is not None else None

    @property
    def pauses(self) -> Pauses:
        return self._router.pauses

    def newest_version(self) -> int | None:
        return self._router.newest_version(self.model)

    async def pick(self) -> LLMBackend:
        """The backend the next call will go to (waiting up to ``llm_wait_s`` for one), made
        sticky; nothing is sent or counted."""
        state = await self._router.acquire(self.model, self._sticky, self.floor)
        self._router.release(state)
        self._sticky = state.id
        return state.backend

    async def settle(self) -> None:
        """Wait while the model is paused (after an aborted generation)."""
        router = self._router
        while self.pauses.paused(self.model):
            await router.wait_changed(60.0)

    async def call(self, fn: Callable[[LLMBackend], Awaitable[T]]) -> tuple[T, BackendView]:
        """Run ``fn`` on a chosen backend; returns its result and the backend's registration
        as it was when the call was sent. Raises BackendUnavailableError when no backend is
        usable (after ``llm_wait_s``) or when ``llm_failover_attempts`` backends failed in
        turn. A call cancelled by an ``abort`` pause, or failing while its model is paused,
        is sent again after the resume without counting as a failure."""
        router = self._router
        error: BackendUnavailableError | None = None
        attempts = 0
        while attempts < router.failover_attempts:
            try:
                state = await router.acquire(self.model, self._sticky, self.floor)
            except BackendUnavailableError as exc:
                if error is None:
                    raise
                raise exc from error
            sent = state.spec
            stalled = self.pauses.stalled_s(sent.model)
            try:
                result = await self.pauses.run(sent.model, fn(state.backend))
            except PauseAborted:
                continue
            except BackendUnavailableError as exc:
                if self.pauses.stalled_s(sent.model) > stalled:  # paused meanwhile: no fault
                    continue
                state.failures += 1
                state.eject(str(exc))
                error = exc
                attempts += 1
                continue
            except Exception:
                state.failures += 1
                raise
            finally:
                router.release(state)
            state.served += 1
            self._sticky = state.id
            return result, sent
        assert error is not None
        raise error
