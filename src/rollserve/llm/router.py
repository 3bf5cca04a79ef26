"""The LLM router: each model call goes to the least-loaded usable backend, sticky per
trajectory, with health checks, failover, draining removal and re-registration."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import secrets
import time
from collections.abc import Callable, Iterator
from typing import Any

from rollserve.errors import (
    BackendNotFoundError,
    InvalidInputError,
    RollserveError,
)
from rollserve.llm.base import LLMBackend
from rollserve.llm.health import BackendState, Signal, check_health, unavailable
from rollserve.llm.pause import Pauses
from rollserve.llm.route import RouteSession
from rollserve.registry import Registry
from rollserve.schema.backends import (
    BackendSpec,
    BackendView,
    ModelState,
    PauseRequest,
    ResumeRequest,
)
from rollserve.settings import Settings
from rollserve.storage.base import BackendStore

log = logging.getLogger(__name__)

BackendFactory = Callable[[BackendView, Settings], LLMBackend]
"""Builds the backend object of one registration (by ``BackendSpec.kind``)."""

_LIVE_FIELDS = frozenset({"healthy", "draining", "in_flight", "served", "failures", "last_error"})


class Router:
    """Registered inference backends and the choice of one for each model call."""

    def __init__(
        self, settings: Settings, store: BackendStore, kinds: Registry[BackendFactory]
    ) -> None:
        self._settings = settings
        self._store = store
        self._kinds = kinds
        self._states: dict[str, BackendState] = {}  # registered and taking calls
        self._retired: set[BackendState] = set()  # removed or replaced, draining
        self._tasks: set[asyncio.Task[None]] = set()  # drain-then-close
        self._health: asyncio.Task[None] | None = None
        self._changed = Signal()
        self._editing = 0  # registrations being changed here (their store writes in flight)
        self._edits = 0  # changes made here: a sync that read the store before one skips
        self.pauses = Pauses()
        # Called when this node's part in a pause changes (it takes one up, or its last call
        # of a paused model ends): the service reports to the fleet at once.
        self.on_pause_change: Callable[[], None] = lambda: None

    async def start(self) -> None:
        """Build the stored registrations (the health loop decides whether they answer) and
        start the health checks."""
        await self.sync()
        if self._health is None:
            self._health = asyncio.create_task(self._health_loop(), name="llm-health")

    async def sync(self) -> None:
        """Take in what other nodes of the store registered, removed or moved to a new policy
        version. Each node keeps its own health, load and pauses."""
        mark = (self._editing, self._edits)
        loaded, pauses = await asyncio.to_thread(
            lambda: (self._store.load_backends(), self._store.load_pauses())
        )
        # A change here raced the read (made, or still being stored): the next sync has it.
        if mark != (0, self._edits) or self._editing:
            return
        self._sync_pauses(pauses)
        stored = {str(spec.get("id")): spec for spec in loaded}
        for backend_id in [b for b in self._states if b not in stored]:
            self._retire(self._states.pop(backend_id))
        for backend_id, spec in stored.items():
            state = self._states.get(backend_id)
            if state is not None:
                mine = state.spec.model_dump(mode="json", exclude=set(_LIVE_FIELDS))
                if mine == spec:
                    continue
                if {**mine, "policy_version": spec.get("policy_version")} == spec:
                    if (spec.get("policy_version") or 0) < (mine.get("policy_version") or 0):
                        continue  # versions only grow: the store is behind, not this node
                    state.spec = state.spec.model_copy(
                        update={"policy_version": spec.get("policy_version")}
                    )
                    self._changed.notify()
                    continue
            try:
                view = BackendView.model_validate(spec)
                backend = self._kinds.get(view.kind)(view, self._settings)
            except (ValueError, RollserveError) as exc:
                log.warning("stored inference backend %s not loaded: %s", backend_id, exc)
                continue
            self._states[view.id] = BackendState(backend, view)
            if state is not None:
                self._retire(state)
            self._changed.notify()

    def _sync_pauses(self, stored: dict[str, dict[str, Any]]) -> None:
        """Hold or release this node's calls as the store says another node paused them."""
        changed = False
        for model, how in stored.items():
            mode, admission = how.get("mode", "wait"), bool(how.get("admission"))
            token = str(how.get("token", ""))
            if (self.pauses.mode(model), self.pauses.admission_paused(model)) != (
                mode,
                admission,
            ) or self.pauses.token(model) != token:
                self.pauses.pause(model, mode, admission, token)
                changed = True
        for model in [m for m in self.pauses.models() if m not in stored]:
            self.pauses.resume(model)
            changed = True
        if changed:
            self._changed.notify()
            self.on_pause_change()

    @contextlib.contextmanager
    def _edit(self) -> Iterator[None]:
        """A change of registrations made here: syncs keep off until it is stored."""
        self._editing += 1
        try:
            yield
        finally:
            self._editing -= 1
            self._edits += 1

    def sync_soon(self) -> None:
        """Sync in the background (a store said registrations changed)."""
        task = asyncio.create_task(self._sync_logged(), name="llm-sync")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _sync_logged(self) -> None:
        try:
            await self.sync()
        except RollserveError as exc:
            log.warning("inference backends not synced from the store: %s", exc.message)

    async def stop(self) -> None:
        """Stop the health checks and close every backend, draining ones included."""
        tasks = [*self._tasks, *([self._health] if self._health else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._health = None
        states = [*self._states.values(), *self._retired]
        self._states.clear()
        self._retired.clear()
        await asyncio.gather(*(state.close() for state in states))

    async def register(self, spec: BackendSpec) -> BackendView:
        """Verify and register a backend; an existing id is replaced (its calls in flight
        finish on the old object, which is then closed)."""
        url = spec.url.rstrip("/")
        backend_id = spec.id or hashlib.sha1(f"{url}|{spec.model}".encode()).hexdigest()[:12]
        view = BackendView(
            **{**spec.model_dump(), "id": backend_id, "url": url}, registered_at=time.time()
        )
        backend = self._kinds.get(view.kind)(view, self._settings)
        view = backend.view  # with the kind's defaults
        with self._edit():
            return await self._install(backend_id, backend, view)

    async def _install(
        self, backend_id: str, backend: LLMBackend, view: BackendView
    ) -> BackendView:
        try:
            self._check_agreement(view, backend)
            await backend.verify()
            view = backend.view  # with what the server reported
            self._check_agreement(view, backend)  # again: others may have come in meanwhile
            stored = view.model_dump(mode="json", exclude=set(_LIVE_FIELDS))
            await asyncio.to_thread(self._store.save_backend, backend_id, stored)
        except BaseException:
            await backend.aclose()
            raise
        old = self._states.get(backend_id)
        state = self._states[backend_id] = BackendState(backend, view)
        if old is not None:
            self._retire(old)
        self._changed.notify()
        return state.view()

    async def remove(self, backend_id: str) -> None:
        """Unregister a backend: it takes no new calls and is closed once its calls in
        flight are done (or after ``llm_drain_s``)."""
        with self._edit():
            state = self._states.pop(backend_id, None)
            if state is not None:
                self._retire(state)
            stored = await asyncio.to_thread(self._store.delete_backend, backend_id)
        if state is None and not stored:
            raise BackendNotFoundError(
                f"no inference backend {backend_id!r}", backend_id=backend_id
            )

    def views(self) -> list[BackendView]:
        """Every backend with its live state; removed ones while they drain."""
        draining = [s for s in self._retired if s.id not in self._states and not s.closed]
        views = [state.view() for state in [*self._states.values(), *draining]]
        return [v.model_copy(update={"paused": self.pauses.paused(v.model)}) for v in views]

    def newest_version(self, model: str | None) -> int | None:
        """The newest policy version registered for ``model`` (None: no backend has one)."""
        versions = [s.spec.policy_version for s in self._serving(model)]
        known = [v for v in versions if v is not None]
        return max(known) if known else None

    # -- pause and resume around a weight update -------------------------------------------------

    async def pause(self, model: str, request: PauseRequest) -> ModelState:
        """Pause ``model``: its new calls wait (neither timing out nor ejecting anything); with
        ``abort`` its calls in flight are cancelled and sent again after the resume. Returns
        once no call of the model is in flight here, or after ``timeout_s``. The pause is
        stored: the other nodes of the store hold the model's calls as soon as they sync."""
        token = secrets.token_hex(8)
        self.pauses.pause(model, request.mode, request.admission, token)
        self._changed.notify()
        with self._edit():
            how = {"mode": request.mode, "admission": request.admission, "token": token}
            await asyncio.to_thread(self._store.save_pause, model, how)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + request.timeout_s
        while self._in_flight(model) and (remaining := deadline - loop.time()) > 0:
            await self._changed.wait(remaining)
        return self.model_state(model)

    async def resume(self, model: str, request: ResumeRequest) -> ModelState:
        """Resume ``model``, its backends now at ``policy_version`` (when given), and wake the
        calls and jobs that wait for it."""
        version = request.policy_version
        if version is not None:
            older = [s for s in self._serving(model) if (s.spec.policy_version or 0) > version]
            if older:
                raise InvalidInputError(
                    f"policy_version {version} is older than version "
                    f"{older[0].spec.policy_version} of backend {older[0].id}: versions only grow",
                    field="policy_version",
                )
        with self._edit():
            for state in self._serving(model) if version is not None else []:
                state.spec = state.spec.model_copy(update={"policy_version": version})
                stored = state.spec.model_dump(mode="json", exclude=set(_LIVE_FIELDS))
                await asyncio.to_thread(self._store.save_backend, state.id, stored)
            await asyncio.to_thread(self._store.save_pause, model, None)
        self.pauses.resume(model)
        self._changed.notify()
        return self.model_state(model)

    def model_state(self, model: str) -> ModelState:
        """Whether ``model`` is paused, how, and what of it is in flight."""
        return ModelState(
            model=model,
            paused=self.pauses.paused(model),
            mode=self.pauses.mode(model),
            admission_paused=self.pauses.admission_paused(model),
            policy_version=self.newest_version(model),
            in_flight=self._in_flight(model),
            aborted=self.pauses.aborted(model),
            paused_s=round(self.pauses.paused_for(model), 3),
        )

    async def admitted(self, model: str | None) -> None:
        """Wait while new jobs of ``model`` are held by a pause."""
        while self.pauses.admission_paused(model):
            await self._changed.wait(60.0)

    def pause_report(self) -> dict[str, dict[str, Any]]:
        """Per model paused here: the pause's token and this node's calls of it in flight. A
        node's heartbeat carries it; the node that paused the model waits on every report."""
        return {
            model: {"token": self.pauses.token(model), "in_flight": self._in_flight(model)}
            for model in self.pauses.models()
        }

    def _in_flight(self, model: str) -> int:
        return sum(
            s.in_flight for s in [*self._states.values(), *self._retired] if s.spec.model == model
        )

    def state(self, backend_id: str) -> BackendState | None:
        """A registered backend taking calls."""
        return self._states.get(backend_id)

    async def wait_changed(self, timeout: float) -> bool:
        """Wait for the next change (a call ends, a backend comes or goes, a pause)."""
        return await self._changed.wait(timeout)

    @property
    def failover_attempts(self) -> int:
        return self._settings.llm_failover_attempts

    def session(self, key: str, model: str | None) -> RouteSession:
        """The route of one trajectory: its calls stick to one backend while it is usable."""
        return RouteSession(self, key, model)

    def token_mode(self, model: str) -> bool:
        """Whether the usable backends of ``model`` all generate from token ids."""
        states = self._serving(model)
        usable = [s for s in states if s.healthy] or states
        return bool(usable) and all(s.backend.token_mode for s in usable)

    def tokenizer_for(self, model: str) -> str | None:
        """The tokenizer directory the backends of ``model`` share (None: text mode)."""
        states = self._serving(model)
        return states[0].spec.tokenizer if states else None

    # -- choice ---------------------------------------------------------------------------------

    def _serving(self, model: str | None) -> list[BackendState]:
        return [s for s in self._states.values() if model is None or s.spec.model == model]

    def _load(self, state: BackendState) -> int:
        # Calls still draining on a replaced registration of the same server load it too.
        return state.in_flight + sum(
            r.in_flight for r in self._retired if r.spec.url == state.spec.url
        )

    def _admissible(self, state: BackendState, floor: int | None) -> bool:
        cap = state.spec.max_concurrency
        version = state.spec.policy_version
        return (
            state.healthy
            and (cap is None or self._load(state) < cap)
            and not self.pauses.paused(state.spec.model)
            and (floor is None or (version is not None and version >= floor))
        )

    def _choose(
        self, model: str | None, sticky: str | None, floor: int | None
    ) -> BackendState | None:
        current = self._states.get(sticky) if sticky is not None else None
        if current is not None and self._usable_for(current, model, floor):
            return current
        usable = [s for s in self._serving(model) if self._admissible(s, floor)]
        if not usable:
            return None
        return min(usable, key=lambda s: ((self._load(s) + 1) / s.spec.weight, s.served))

    def _usable_for(self, state: BackendState, model: str | None, floor: int | None) -> bool:
        return (model is None or state.spec.model == model) and self._admissible(state, floor)

    async def acquire(
        self, model: str | None, sticky: str | None, floor: int | None = None
    ) -> BackendState:
        """A backend for one call, counted in flight; waits up to ``llm_wait_s`` for one, and
        for as long as the model is paused (a pause never times a call out)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._settings.llm_wait_s
        while True:
            state = self._choose(model, sticky, floor)
            if state is not None:
                state.in_flight += 1
                return state
            if self.pauses.paused(model):
                await self._changed.wait(60.0)
                deadline = loop.time() + self._settings.llm_wait_s
                continue
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise unavailable(
                    self._serving(model),
                    {s.spec.model for s in self._states.values()},
                    model,
                    floor,
                    self._settings.llm_wait_s,
                )
            await self._changed.wait(remaining)

    def release(self, state: BackendState) -> None:
        """A call on ``state`` ended."""
        state.in_flight -= 1
        self._changed.notify()
        model = state.spec.model
        if self.pauses.paused(model) and not self._in_flight(model):
            self.on_pause_change()  # the node that paused it may be waiting on this one

    # -- lifecycle ------------------------------------------------------------------------------

    def _check_agreement(self, view: BackendView, backend: LLMBackend) -> None:
        """The backends of one model must share a tokenizer and a mode: a trajectory may move
        between them in the middle."""
        for other in self._serving(view.model):
            if other.id == view.id:
                continue
            if other.spec.tokenizer != view.tokenizer:
                raise InvalidInputError(
                    f"backend {other.id} serves {view.model!r} with tokenizer "
                    f"{other.spec.tokenizer!r}, not {view.tokenizer!r}",
                    field="tokenizer",
                )
            if other.backend.token_mode != backend.token_mode:
                raise InvalidInputError(
                    f"backend {other.id} serves {view.model!r} in "
                    f"{'token' if other.backend.token_mode else 'text'} mode; "
                    f"a {view.kind} backend here would not",
                    field="kind",
                )
            if backend.token_mode and other.spec.logprob_mode != view.logprob_mode:
                raise InvalidInputError(
                    f"backend {other.id} serves {view.model!r} with {other.spec.logprob_mode} "
                    f"logprobs, not {view.logprob_mode}: one trajectory must not mix them",
                    field="logprob_mode",
                )

    def _retire(self, state: BackendState) -> None:
        state.draining = True
        self._retired.add(state)
        task = asyncio.create_task(self._drain(state), name=f"llm-drain-{state.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        self._changed.notify()

    async def _drain(self, state: BackendState) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._settings.llm_drain_s
        while state.in_flight > 0 and (remaining := deadline - loop.time()) > 0:
            await self._changed.wait(remaining)
        if state.in_flight > 0:
            log.warning("closing backend %s with %d calls in flight", state.id, state.in_flight)
        await state.close()
        self._retired.discard(state)

    async def _health_loop(self) -> None:
        interval = self._settings.llm_health_interval_s
        while True:
            # A paused model's servers may stall or refuse generation: they are not checked.
            states = [s for s in self._states.values() if not self.pauses.paused(s.spec.model)]
            if await check_health(states, timeout=max(interval, 5.0)):
                self._changed.notify()
            await asyncio.sleep(interval)
            await self._sync_logged()  # a store that announces nothing (SQLite)
