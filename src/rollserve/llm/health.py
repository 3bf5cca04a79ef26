"""A routed backend's live state, the wake-up signal of the router, and backend health checks."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from rollserve.errors import BackendUnavailableError, RollserveError, StaleRolloutError
from rollserve.llm.base import LLMBackend
from rollserve.schema.backends import BackendView

log = logging.getLogger(__name__)


@dataclass(eq=False)
class BackendState:
    """One backend object as the router sees it: its registration and its live counters."""

    backend: LLMBackend
    spec: BackendView
    healthy: bool = True
    draining: bool = False
    in_flight: int = 0
    served: int = 0
    failures: int = 0
    last_error: str | None = None
    closed: bool = False

    @property
    def id(self) -> str:
        """The backend id."""
        return self.spec.id

    def view(self) -> BackendView:
        """The registration with the live state filled in."""
        return self.spec.model_copy(
            update={
                "healthy": self.healthy,
                "draining": self.draining,
                "in_flight": self.in_flight,
                "served": self.served,
                "failures": self.failures,
                "last_error": self.last_error,
            }
        )

    def eject(self, reason: str) -> None:
        """Take the backend out of rotation until a health check passes again."""
        if self.healthy:
            log.warning("inference backend %s ejected: %s", self.id, reason)
        self.healthy = False
        self.last_error = reason

    async def close(self) -> None:
        """Close the backend once; a failure to close is logged, not raised."""
        if self.closed:
            return
        self.closed = True
        try:
            await self.backend.aclose()
        except Exception:  # a close that fails must not stop the others
            log.warning("closing inference backend %s failed", self.id, exc_info=True)


class Signal:
    """Wakes every waiter at once when something changes (a call ends, a backend comes in).
    ``notify`` is synchronous, so that it is safe in ``finally`` blocks of cancelled tasks."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def notify(self) -> None:
        """Wake everyone waiting now."""
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self, timeout: float) -> bool:
        """Wait for the next ``notify``, at most ``timeout`` seconds; False on timeout."""
        event = self._event
        try:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for can leave a waiter hung
            async with asyncio.timeout(timeout):
                await event.wait()
        except TimeoutError:
            return False
        return True


async def check_health(states: list[BackendState], timeout: float) -> bool:
    """Check every backend at once: a failure (or no answer within ``timeout``) ejects it, a
    success re-admits it. True if some backend was re-admitted."""
    results = await asyncio.gather(*(_check(state, timeout) for state in states))
    return any(results)


async def _check(state: BackendState, timeout: float) -> bool:
    try:
        async with asyncio.timeout(timeout):
            await state.backend.check()
    except TimeoutError:
        state.eject(f"health check: no answer within {timeout:g}s")
        return False
    except Exception as exc:  # whatever a check raises, the backend is not usable
        state.eject(f"health check: {exc}")
        return False
    if state.healthy:
        return False
    log.info("inference backend %s re-admitted", state.id)
    state.healthy = True
    return True


def unavailable(
    states: list[BackendState],
    registered: set[str],
    model: str | None,
    floor: int | None,
    waited_s: float,
) -> RollserveError:
    """Why no backend of ``model`` (``states``: those serving it) took a call in ``waited_s``:
    none new enough for the version ``floor`` (stale), none registered, or ejected and full."""
    what = f"model {model!r}" if model is not None else "any model"
    versions = [s.spec.policy_version for s in states if s.spec.policy_version is not None]
    newest = max(versions) if versions else None
    below = [s for s in states if (s.spec.policy_version or -1) < (floor or 0)]
    if floor is not None and states and len(below) == len(states):
        return StaleRolloutError(
            f"no backend of {what} has policy version {floor} or newer (newest: "
            f"{newest}) after waiting {waited_s:g}s",
            floor=floor,
            newest=newest,
        )
    if not states:
        known = ", ".join(sorted(registered)) or "none"
        return BackendUnavailableError(
            f"no inference backend is registered for {what} (registered models: {known})",
            model=model,
            backends=0,
        )
    ejected = [s for s in states if not s.healthy]
    full = len(states) - len(ejected)
    why = []
    if ejected:
        why.append(f"{len(ejected)} ejected (last error: {ejected[-1].last_error})")
    if full:
        why.append(f"{full} at max_concurrency")
    return BackendUnavailableError(
        f"no usable inference backend for {what} after waiting "
        f"{waited_s:g}s: {len(states)} registered, {', '.join(why)}",
        model=model,
        backends=len(states),
        ejected=len(ejected),
        full=full,
    )
