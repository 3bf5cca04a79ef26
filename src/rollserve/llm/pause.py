"""Models paused for a weight update: which are, since when, how long they have been paused in
all (time that counts against no timeout), and the model calls in flight that an ``abort``
pause cancels so that they are sent again after the resume."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from rollserve.schema.backends import PauseMode

T = TypeVar("T")


class PauseAborted(Exception):
    """A model call cancelled by an ``abort`` pause: it is sent again once the model resumes."""


@dataclass
class _Pause:
    mode: PauseMode
    admission: bool
    since: float  # monotonic
    token: str = ""  # names this pause across the nodes of a store
    aborted: int = 0


@dataclass
class Pauses:
    """The pause state of this node's models."""

    _paused: dict[str, _Pause] = field(default_factory=dict)
    _stalled: dict[str, float] = field(default_factory=dict)  # seconds of ended pauses
    _calls: dict[asyncio.Task[Any], str] = field(default_factory=dict)  # in flight → model
    _aborted: set[asyncio.Task[Any]] = field(default_factory=set)

    def paused(self, model: str | None) -> bool:
        """Whether new calls of ``model`` must wait."""
        return model is not None and model in self._paused

    def admission_paused(self, model: str | None) -> bool:
        """Whether new jobs of ``model`` must wait before their sandbox is made."""
        pause = self._paused.get(model) if model is not None else None
        return pause is not None and pause.admission

    def mode(self, model: str) -> PauseMode | None:
        pause = self._paused.get(model)
        return pause.mode if pause is not None else None

    def token(self, model: str) -> str | None:
        """The token of the pause of ``model`` (None when it is not paused)."""
        pause = self._paused.get(model)
        return pause.token if pause is not None else None

    def aborted(self, model: str) -> int:
        pause = self._paused.get(model)
        return pause.aborted if pause is not None else 0

    def paused_for(self, model: str) -> float:
        """How long the current pause of ``model`` has lasted (0 when it is not paused)."""
        pause = self._paused.get(model)
        return time.monotonic() - pause.since if pause is not None else 0.0

    def stalled_s(self, model: str | None) -> float:
        """Seconds ``model`` has been paused in all, the current pause included: a rollout
        subtracts the growth of this figure from its elapsed time."""
        if model is None:
            return 0.0
        return self._stalled.get(model, 0.0) + self.paused_for(model)

    def pause(self, model: str, mode: PauseMode, admission: bool, token: str = "") -> int:
        """Pause ``model`` (again: the mode, admission and token are updated); with ``abort``
        the calls in flight are cancelled. Returns how many were."""
        pause = self._paused.get(model)
        if pause is None:
            pause = self._paused[model] = _Pause(mode, admission, time.monotonic())
        pause.mode, pause.admission, pause.token = mode, admission, token
        if mode == "abort":
            for task, of in list(self._calls.items()):
                if of == model and not task.done() and task not in self._aborted:
                    self._aborted.add(task)
                    task.cancel()
                    pause.aborted += 1
        return pause.aborted

    def resume(self, model: str) -> None:
        pause = self._paused.pop(model, None)
        if pause is not None:
            self._stalled[model] = self._stalled.get(model, 0.0) + time.monotonic() - pause.since

    async def run(self, model: str, call: Awaitable[T]) -> T:
        """Run one model call of ``model``, cancellable by an ``abort`` pause (PauseAborted)."""
        task: asyncio.Task[T] = asyncio.ensure_future(call)
        self._calls[task] = model
        try:
            return await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if task in self._aborted and (current is None or not current.cancelling()):
                raise PauseAborted(model) from None
            raise
        finally:
            del self._calls[task]
            self._aborted.discard(task)

    def models(self) -> list[str]:
        """The paused models."""
        return sorted(self._paused)
