"""The LLM router: least-loaded choice, weights, caps, stickiness, failover, health checks,
waiting, draining removal, re-registration, cancellation and persisted registrations."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from rollserve.errors import (
    BackendNotFoundError,
    BackendRequestError,
    BackendUnavailableError,
    InvalidInputError,
)
from rollserve.llm.base import LLMBackend, SamplingParams
from rollserve.llm.router import Router
from rollserve.schema.backends import BackendSpec, BackendView, PauseRequest, ResumeRequest
from rollserve.settings import Settings
from rollserve.storage import SqliteJobStore
from rollserve.testing.fake_llm import FakeBehaviour, FakeLLMFactory
from tests.unit.conftest import MakeRouter, kinds


def spec(backend_id: str | None, model: str = "m", **fields: Any) -> BackendSpec:
    url = f"http://{backend_id or 'anon'}.test:8000/v1"
    return BackendSpec(id=backend_id, url=url, model=model, **fields)


async def ident(backend: LLMBackend) -> str:
    return backend.view.id


async def chat(backend: LLMBackend) -> str:
    await backend.chat([{"role": "user", "content": "hi"}], None, SamplingParams(max_tokens=4))
    return backend.view.id


def held(release: asyncio.Event) -> Callable[[LLMBackend], Awaitable[str]]:
    """A call that stays in flight until ``release`` is set."""

    async def call(backend: LLMBackend) -> str:
        await release.wait()
        return backend.view.id

    return call


async def until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():  # noqa: ASYNC110 - polls the router's state from outside
            await asyncio.sleep(0.005)


def view(router: Router, backend_id: str) -> BackendView:
    return next(v for v in router.views() if v.id == backend_id)


async def test_least_in_flight_sends_new_trajectories_to_the_idle_backend(
    make_router: MakeRouter,
) -> None:
    router = await make_router()
    await router.register(spec("a"))
    await router.register(spec("b"))
    release = asyncio.Event()
    held_calls = [
        asyncio.create_task(router.session(f"h{i}", "m").call(held(release))) for i in range(4)
    ]
    await until(lambda: sum(v.in_flight for v in router.views()) == 4)
    assert {v.id: v.in_flight for v in router.views()} == {"a": 2, "b": 2}
    release.set()
    await asyncio.gather(*held_calls)
    slow = asyncio.Event()
    first = asyncio.create_task(router.session("x", "m").call(held(slow)))
    await until(lambda: sum(v.in_flight for v in router.views()) == 1)
    busy = next(v.id for v in router.views() if v.in_flight == 1)
    # Even though the idle backend has served more, it has nothing in flight: it wins.
    for i in range(5):
        _, backend = await router.session(f"n{i}", "m").call(ident)
        assert backend.id != busy
    slow.set()
    await first


async def test_least_in_flight_favours_the_fast_backend(
    make_router: MakeRouter, factory: FakeLLMFactory
) -> None:
    factory.behaviours["fast"] = FakeBehaviour(latency_s=0.002)
    factory.behaviours["slow"] = FakeBehaviour(latency_s=0.010)
    router = await make_router()
    await router.register(spec("fast"))
    await router.register(spec("slow"))
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(300):
        queue.put_nowait(i)

    async def worker() -> None:
        while not queue.empty():
            session = router.session(f"t{queue.get_nowait()}", "m")
            for _ in range(3):
                await session.call(chat)

    await asyncio.gather(*(worker() for _ in range(24)))
    fast, slow = factory.latest("fast"), factory.latest("slow")
    assert fast.calls + slow.calls == 900
    assert fast.calls > 2 * slow.calls
    assert view(router, "fast").served == fast.calls


async def test_weights_share_the_load(make_router: MakeRouter) -> None:
    router = await make_router()
    await router.register(spec("heavy", weight=3))
    await router.register(spec("light", weight=1))
    release = asyncio.Event()
    calls = [
        asyncio.create_task(router.session(f"s{i}", "m").call(held(release))) for i in range(8)
    ]
    await until(lambda: sum(v.in_flight for v in router.views()) == 8)
    assert {v.id: v.in_flight for v in router.views()} == {"heavy": 6, "light": 2}
    release.set()
    await asyncio.gather(*calls)


async def test_max_concurrency_is_never_exceeded(
    make_router: MakeRouter, factory: FakeLLMFactory
) -> None:
    factory.default = FakeBehaviour(latency_s=0.001)
    router = await make_router()
    await router.register(spec("a", max_concurrency=2))
    await router.register(spec("b", max_concurrency=3))

    async def trajectory(i: int) -> None:
        session = router.session(f"t{i}", "m")
        for _ in range(5):
            await session.call(chat)

    await asyncio.gather(*(trajectory(i) for i in range(30)))
    a, b = factory.latest("a"), factory.latest("b")
    assert a.calls + b.calls == 150
    assert a.max_in_flight == 2
    assert b.max_in_flight == 3
    assert all(v.in_flight == 0 for v in router.views())


async def test_a_trajectory_sticks_to_its_backend(make_router: MakeRouter) -> None:
    router = await make_router()
    await router.register(spec("a"))
    session = router.session("t", "m")
    _, first = await session.call(ident)
    assert first.id == "a"
    release = asyncio.Event()
    others = [
        asyncio.create_task(router.session(f"o{i}", "m").call(held(release))) for i in range(3)
    ]
    await until(lambda: view(router, "a").in_flight == 3)
    await router.register(spec("b"))
    # A new trajectory goes to the idle backend; this one stays where its prefix is cached.
    _, fresh = await router.session("new", "m").call(ident)
    assert fresh.id == "b"
    for _ in range(3):
        _, backend = await session.call(ident)
        assert backend.id == "a"
    assert session.backend is not None
    assert session.backend.id == "a"
    release.set()
    await asyncio.gather(*others)


async def test_a_trajectory_leaves_its_backend_at_its_cap(make_router: MakeRouter) -> None:
    router = await make_router()
    await router.register(spec("a", max_concurrency=1))
    session = router.session("t", "m")
    _, first = await session.call(ident)
    assert first.id == "a"
    release = asyncio.Event()
    busy = asyncio.create_task(router.session("o", "m").call(held(release)))
    await until(lambda: view(router, "a").in_flight == 1)
    await router.register(spec("b"))
    _, moved = await session.call(ident)
    assert moved.id == "b"
    release.set()
    await busy


async def test_failover_ejects_the_failing_backend(
    make_router: MakeRouter, factory: FakeLLMFactory
) -> None:
    router = await make_router()
    await router.register(spec("a"))
    await router.register(spec("b"))
    session = router.session("t", "m")
    _, first = await session.call(chat)
    assert first.id == "a"
    dead = factory.latest("a")
    dead.failing = True
    dead.healthy = False
    result, backend = await session.call(chat)
    assert result == "b"
    assert backend.id == "b"
    a = view(router, "a")
    assert not a.healthy
    assert a.failures == 1
    assert a.last_error is not None
    assert "connection reset" in a.last_error
    assert view(router, "b").served == 1
    assert session.backend is not None
    assert session.backend.id == "b"


async def test_failover_stops_after_the_allowed_attempts(
    make_router: MakeRouter, factory: FakeLLMFactory
) -> None:
    router = await make_router(llm_failover_attempts=2, llm_wait_s=0.05)
    for name in ("a", "b", "c"):
        await router.register(spec(name))
        factory.latest(name).failing = True
    with pytest.raises(BackendUnavailableError, match="connection reset"):
        await router.session("t", "m").call(chat)
    assert sum(factory.latest(n).attempts for n in ("a", "b", "c")) == 2
    assert sorted(v.id for v in router.views() if not v.healthy) == ["a", "b"]


async def test_other_errors_propagate_without_failover(make_router: MakeRouter) -> None:
    router = await make_router()
    await router.register(spec("a"))
    await router.register(spec("b"))

    async def refused(backend: LLMBackend) -> str:
        raise BackendRequestError("prompt too long")

    with pytest.raises(BackendRequestError):
        await router.session("t", "m").call(refused)
    views = {v.id: v for v in router.views()}
    assert views["a"].healthy
    assert views["a"].failures == 1
    assert views["b"].failures == 0


async def test_health_checks_eject_and_readmit(
    make_router: MakeRouter, factory: FakeLLMFactory
) -> None:
    router = await make_router(llm_health_interval_s=0.01)
    await router.register(spec("a"))
    await router.register(spec("b"))
    factory.latest("a").healthy = False
    await until(lambda: not view(router, "a").healthy)
    assert "connection refused" in (view(router, "a").last_error or "")
    for i in range(4):
        _, backend = await router.session(f"s{i}", "m").call(ident)
        assert backend.id == "b"
    factory.latest("a").healthy = True
    await until(lambda: view(router, "a").healthy)
    _, backend = await router.session("after", "m").call(ident)
    assert backend.id == "a"  # fewest served among the equally idle


async def test_a_call_waits_while_every_backend_is_at_its_cap(make_router: MakeRouter) -> None:
    router = await make_router()
    await router.register(spec("a", max_concurrency=1))
    release = asyncio.Event()
    first = asyncio.create_task(router.session("s1", "m").call(held(release)))
    await until(lambda: view(router, "a").in_flight == 1)
    second = asyncio.create_task(router.session("s2", "m").call(ident))
    await asyncio.sleep(0.05)
    assert not second.done()
    release.set()
    assert (await first)[0] == "a"
    assert (await second)[0] == "a"


async def test_a_waiting_call_takes_a_newly_registered_backend(make_router: MakeRouter) -> None:
    router = await make_router()
    waiting = asyncio.create_task(router.session("s", "m").call(ident))
    await asyncio.sleep(0.02)
    assert not waiting.done()
    await router.register(spec("late"))
    assert (await waiting)[0] == "late"


async def test_no_backend_fails_after_the_wait(make_router: MakeRouter) -> None:
    router = await make_router(llm_wait_s=0.05)
    await router.register(spec("a", model="other"))
    with pytest.raises(BackendUnavailableError, match=r"registered for model 'm'.*other"):
        await router.session("s", "m").call(ident)


async def test_all_ejected_fails_with_the_reason(
    make_router: MakeRouter, factory: FakeLLMFactory
) -> None:
    router = await make_router(llm_wait_s=0.05, llm_health_interval_s=0.01)
    await router.register(spec("a"))
    factory.latest("a").healthy = False
    await until(lambda: not view(router, "a").healthy)
    with pytest.raises(BackendUnavailableError, match=r"1 registered, 1 ejected"):
        await router.session("s", "m").call(ident)


async def test_removal_drains_then_closes(
    make_router: MakeRouter, factory: FakeLLMFactory, store: SqliteJobStore
) -> None:
    router = await make_router()
    await router.register(spec("a"))
    session = router.session("t", "m")
    await session.call(ident)
    release = asyncio.Event()
    in_flight = asyncio.create_task(router.session("o", "m").call(held(release)))
    await until(lambda: view(router, "a").in_flight == 1)
    await router.register(spec("b"))
    await router.remove("a")
    assert [s["id"] for s in store.load_backends()] == ["b"]
    assert view(router, "a").draining
    old = factory.latest("a")
    _, moved = await session.call(ident)
    assert moved.id == "b"
    assert not old.closed
    release.set()
    assert (await in_flight)[0] == "a"  # the call in flight finished on the removed backend
    await until(lambda: old.closed)
    assert [v.id for v in router.views()] == ["b"]
    with pytest.raises(BackendNotFoundError):
        await router.remove("a")


async def test_removal_closes_after_the_drain_limit(
    make_router: MakeRouter, factory: FakeLLMFactory
) -> None:
    router = await make_router(llm_drain_s=0.05)
    await router.register(spec("a"))
    release = asyncio.Event()
    stuck = asyncio.create_task(router.session("o", "m").call(held(release)))
    await until(lambda: view(router, "a").in_flight == 1)
    await router.remove("a")
    await until(lambda: factory.latest("a").closed)
    release.set()
    await stuck


async def test_reregistration_replaces_the_backend(
    make_router: MakeRouter, factory: FakeLLMFactory, store: SqliteJobStore
) -> None:
    router = await make_router()
    await router.register(spec("a", policy_version=1))
    session = router.session("t", "m")
    release = asyncio.Event()
    old_call = asyncio.create_task(session.call(held(release)))
    await until(lambda: view(router, "a").in_flight == 1)
    old = factory.latest("a")
    registered = await router.register(spec("a", policy_version=2))
    assert registered.policy_version == 2
    new = factory.latest("a")
    assert new is not old
    _, backend = await router.session("n", "m").call(ident)
    assert backend.policy_version == 2  # served by the new registration
    assert [(v.id, v.policy_version) for v in router.views()] == [("a", 2)]
    assert store.load_backends()[0]["policy_version"] == 2
    assert not old.closed
    release.set()
    _, served_by = await old_call
    assert served_by.policy_version == 1  # the version it was sent to
    await until(lambda: old.closed)
    assert not new.closed


async def test_cancelling_a_call_frees_its_slot(make_router: MakeRouter) -> None:
    router = await make_router()
    await router.register(spec("a", max_concurrency=1))
    never = asyncio.Event()
    task = asyncio.create_task(router.session("s", "m").call(held(never)))
    await until(lambda: view(router, "a").in_flight == 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert view(router, "a").in_flight == 0
    assert view(router, "a").failures == 0
    assert (await router.session("next", "m").call(ident))[0] == "a"


async def test_registrations_survive_a_restart(
    tmp_path: Path, store: SqliteJobStore, factory: FakeLLMFactory
) -> None:
    settings = Settings(data_dir=tmp_path / "data", llm_health_interval_s=3600.0)
    first = Router(settings, store, kinds(factory))
    await first.start()
    await first.register(spec("a", max_concurrency=4, policy_version=7))
    await first.register(spec(None, model="m2"))
    await first.session("s", "m").call(ident)
    await first.stop()
    assert all(b.closed for b in factory.built)

    reopened = SqliteJobStore(tmp_path / "jobs.db")
    second = Router(settings, reopened, kinds(factory))
    try:
        await second.start()
        views = {v.model: v for v in second.views()}
        assert views["m"].id == "a"
        assert views["m"].max_concurrency == 4
        assert views["m"].policy_version == 7
        assert views["m"].served == 0  # live state is not stored
        assert views["m2"].url == "http://anon.test:8000/v1"
        result, _ = await second.session("s", "m2").call(ident)
        assert result == views["m2"].id
    finally:
        await second.stop()
        reopened.close()


async def test_register_derives_a_stable_id(make_router: MakeRouter) -> None:
    router = await make_router()
    one = await router.register(BackendSpec(url="http://h.test:8000/v1/", model="m"))
    two = await router.register(BackendSpec(url="http://h.test:8000/v1", model="m"))
    assert one.id == two.id
    assert two.url == "http://h.test:8000/v1"
    assert len(router.views()) == 1


async def test_a_failed_verification_registers_nothing(
    make_router: MakeRouter, factory: FakeLLMFactory, store: SqliteJobStore
) -> None:
    factory.behaviours["bad"] = FakeBehaviour(
        verify_error=InvalidInputError("no such model", field="model")
    )
    router = await make_router()
    with pytest.raises(InvalidInputError, match="no such model"):
        await router.register(spec("bad"))
    assert router.views() == []
    assert store.load_backends() == []
    assert factory.latest("bad").closed


async def test_tokenizer_and_mode_must_agree_per_model(
    make_router: MakeRouter, factory: FakeLLMFactory
) -> None:
    router = await make_router()
    await router.register(spec("a", kind="vllm", tokenizer="/tok/one"))
    with pytest.raises(InvalidInputError, match="tokenizer") as refused:
        await router.register(spec("b", kind="vllm", tokenizer="/tok/two"))
    assert refused.value.details["field"] == "tokenizer"
    factory.behaviours["c"] = FakeBehaviour(token_mode=False)
    with pytest.raises(InvalidInputError, match="token mode"):
        await router.register(spec("c", kind="openai", tokenizer="/tok/one"))
    await router.register(spec("d", kind="sglang", tokenizer="/tok/one"))
    await router.register(spec("e", model="chat-only", kind="openai"))
    assert router.tokenizer_for("m") == "/tok/one"
    assert router.token_mode("m")
    assert router.tokenizer_for("chat-only") is None
    assert router.token_mode("unknown") is False
    # Re-registering the only backend of a model may change its tokenizer.
    await router.register(spec("e", model="chat-only", kind="openai", tokenizer="/tok/three"))
    assert router.tokenizer_for("chat-only") == "/tok/three"


async def test_registrations_made_elsewhere_are_synced_and_races_lose_nothing(
    make_router: MakeRouter, store: SqliteJobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two routers on one store (two nodes): a registration, a new version and a removal on one
    reach the other by ``sync``; a sync whose read of the store began before a registration
    here does not drop it, and a store behind this node never lowers a version."""
    here, there = await make_router(), await make_router()
    await here.register(spec("a", policy_version=1))
    await there.sync()
    assert [(v.id, v.policy_version) for v in there.views()] == [("a", 1)]
    await here.resume("m", ResumeRequest(policy_version=2))
    await there.sync()
    assert [v.policy_version for v in there.views()] == [2]

    stale = store.load_backends()  # what a slow read began with
    gate = threading.Event()

    def slow_load() -> list[dict[str, Any]]:
        gate.wait(10)
        return stale

    monkeypatch.setattr(store, "load_backends", slow_load)
    reading = asyncio.create_task(there.sync())
    await asyncio.sleep(0.05)  # the read has begun
    monkeypatch.undo()
    await there.register(spec("b"))  # made while the sync's read is on its way
    gate.set()
    await reading
    assert sorted(v.id for v in there.views()) == ["a", "b"]

    await here.remove("a")
    await there.sync()
    assert [v.id for v in there.views() if not v.draining] == ["b"]


async def test_a_sync_read_before_a_pause_was_stored_does_not_undo_it(
    make_router: MakeRouter, store: SqliteJobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sync whose read of the store began before a pause here, and ends while the pause is
    being stored, leaves the pause in place (it read a store without it)."""
    router = await make_router()
    await router.register(spec("a"))
    read, stored = threading.Event(), threading.Event()
    load_pauses, save_pause = store.load_pauses, store.save_pause

    def slow_load() -> dict[str, dict[str, Any]]:
        before = load_pauses()
        read.wait(10)
        return before

    def slow_save(model: str, how: dict[str, Any] | None) -> None:
        stored.wait(10)
        save_pause(model, how)

    monkeypatch.setattr(store, "load_pauses", slow_load)
    monkeypatch.setattr(store, "save_pause", slow_save)
    reading = asyncio.create_task(router.sync())
    await asyncio.sleep(0.05)  # the sync has read a store without the pause
    pausing = asyncio.create_task(router.pause("m", PauseRequest(timeout_s=0)))
    await asyncio.sleep(0.05)  # paused here, its write to the store on its way
    read.set()
    await reading
    assert router.pauses.paused("m")
    stored.set()
    assert (await pausing).paused
    monkeypatch.undo()
    await router.sync()
    assert router.pauses.paused("m")


async def test_a_pause_made_on_one_node_holds_the_others(make_router: MakeRouter) -> None:
    here, there = await make_router(), await make_router()
    await here.register(spec("a", policy_version=1))
    await there.sync()
    await here.pause("m", PauseRequest(mode="wait", admission=True, timeout_s=1))
    await there.sync()
    assert there.pauses.paused("m") and there.pauses.admission_paused("m")
    await here.resume("m", ResumeRequest(policy_version=2))
    await there.sync()
    assert not there.pauses.paused("m")
    assert [v.policy_version for v in there.views()] == [2]
