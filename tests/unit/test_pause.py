"""Pause and resume of a model around a weight update, and bounded staleness, in the router
and a rollout's model session: paused calls wait without timing out or ejecting anything,
``abort`` cancels the calls in flight and sends them again after the resume, the resume sets
the new version, and a job's bound decides where its turns may run."""

from __future__ import annotations

import asyncio

import pytest

from rollserve.errors import InvalidInputError, StaleRolloutError
from rollserve.llm.router import Router
from rollserve.llm.session import ModelSession, VersionBound
from rollserve.llm.templates import TemplateCache
from rollserve.schema.backends import BackendSpec, PauseRequest, ResumeRequest
from rollserve.schema.tokens import TurnInfo
from rollserve.testing.fake_llm import FakeLLMFactory
from tests.unit.conftest import MakeRouter
from tests.unit.test_router import chat, held, ident, spec, until, view


def session(router: Router, key: str, bound: VersionBound | None = None) -> ModelSession:
    return ModelSession(router.session(key, "m"), TemplateCache(), bound or VersionBound(), 3)


async def test_wait_pause_lets_calls_in_flight_finish_and_holds_new_ones(
    make_router: MakeRouter,
) -> None:
    router = await make_router(llm_wait_s=0.05)  # a pause is never this short-lived
    await router.register(spec("a", policy_version=0))
    release = asyncio.Event()
    in_flight = asyncio.create_task(router.session("t", "m").call(held(release)))
    await until(lambda: view(router, "a").in_flight == 1)
    pausing = asyncio.create_task(router.pause("m", PauseRequest(mode="wait")))
    await until(lambda: router.pauses.paused("m"))
    assert not pausing.done()  # the pause returns once the call in flight has finished
    release.set()
    state = await pausing
    assert state.paused and state.mode == "wait" and state.in_flight == 0
    assert (await in_flight)[1].policy_version == 0
    waiting = asyncio.create_task(router.session("n", "m").call(ident))
    await asyncio.sleep(0.3)  # six times llm_wait_s: paused, not unavailable
    assert not waiting.done()
    assert view(router, "a").healthy and view(router, "a").paused
    resumed = await router.resume("m", ResumeRequest(policy_version=1))
    assert not resumed.paused and resumed.policy_version == 1
    result, served = await waiting
    assert result == "a" and served.policy_version == 1
    assert router.pauses.stalled_s("m") >= 0.3


async def test_abort_pause_cancels_calls_in_flight_and_resends_them_after_resume(
    make_router: MakeRouter, factory: FakeLLMFactory
) -> None:
    router = await make_router()
    await router.register(spec("a", policy_version=4))
    release = asyncio.Event()
    calls = 0

    async def generation(backend: object) -> int:
        nonlocal calls
        calls += 1
        await release.wait()
        return calls

    call = asyncio.create_task(router.session("t", "m").call(generation))
    await until(lambda: calls == 1)
    state = await router.pause("m", PauseRequest(mode="abort"))
    assert state.aborted == 1 and state.in_flight == 0
    await asyncio.sleep(0.05)
    assert calls == 1  # not sent again while paused
    release.set()
    await router.resume("m", ResumeRequest(policy_version=5))
    result, served = await call
    assert result == 2 and served.policy_version == 5  # the second sending, to the new weights
    assert view(router, "a").failures == 0 and view(router, "a").healthy


async def test_a_failure_while_paused_neither_ejects_nor_fails_the_call(
    make_router: MakeRouter, factory: FakeLLMFactory
) -> None:
    router = await make_router()
    await router.register(spec("a"))
    backend = factory.latest("a")
    backend.gate = asyncio.Event()
    call = asyncio.create_task(router.session("t", "m").call(chat))
    await until(lambda: backend.in_flight == 1)
    await router.pause("m", PauseRequest(mode="wait", timeout_s=0))
    backend.failing = True  # the server refuses while its weights are swapped
    backend.gate.set()
    await asyncio.sleep(0.05)
    assert view(router, "a").healthy and not call.done()
    backend.failing = False
    await router.resume("m", ResumeRequest())
    assert (await call)[0] == "a"


async def test_resume_refuses_an_older_version_and_persists_the_new_one(
    make_router: MakeRouter, store: object
) -> None:
    router = await make_router()
    await router.register(spec("a", policy_version=3))
    with pytest.raises(InvalidInputError, match="older than version 3"):
        await router.resume("m", ResumeRequest(policy_version=2))
    await router.resume("m", ResumeRequest(policy_version=3))
    await router.resume("m", ResumeRequest(policy_version=7))
    assert [v.policy_version for v in router.views()] == [7]


async def test_admission_pause_holds_new_jobs_until_resume(make_router: MakeRouter) -> None:
    router = await make_router()
    await router.pause("m", PauseRequest(admission=True, timeout_s=0))
    admitted = asyncio.create_task(router.admitted("m"))
    other = asyncio.create_task(router.admitted("other-model"))
    await asyncio.sleep(0.05)
    assert not admitted.done() and other.done()
    await router.resume("m", ResumeRequest())
    await asyncio.wait_for(admitted, 1)


def test_policy_versions_are_integers() -> None:
    with pytest.raises(ValueError, match="non-negative integer"):
        BackendSpec(url="http://a:1/v1", model="m", policy_version="step-3")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="non-negative integer"):
        ResumeRequest(policy_version="3")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="greater than or equal to 0"):
        BackendSpec(url="http://a:1/v1", model="m", policy_version=-1)
    # Results stored when versions were free-form strings still load.
    legacy = {"backend_id": "b", "model": "m", "finish_reason": "stop"}
    assert TurnInfo.model_validate({**legacy, "policy_version": "12"}).policy_version == 12
    assert TurnInfo.model_validate({**legacy, "policy_version": "step-3"}).policy_version is None


async def test_a_bound_routes_turns_only_to_recent_enough_backends(
    make_router: MakeRouter,
) -> None:
    router = await make_router(llm_wait_s=0.1)
    await router.register(spec("old", policy_version=1))
    await router.register(spec("new", policy_version=3))
    await router.register(spec("unversioned"))
    bounded = session(router, "t", VersionBound(max_staleness=1))
    for _ in range(6):
        bounded._prepare()
        assert (await bounded._route.call(ident))[0] == "new"
    fresh = session(router, "u", VersionBound(min_policy_version=3))
    fresh._prepare()
    assert (await fresh._route.call(ident))[0] == "new"
    unbounded = [
        (await router.session(f"k{i}", "m").call(ident))[0] for i in range(6)
    ]  # without a bound every backend takes turns
    assert {"old", "unversioned"} <= set(unbounded)
    beyond = session(router, "v", VersionBound(min_policy_version=4))
    beyond._prepare()
    with pytest.raises(StaleRolloutError, match="policy version 4 or newer"):
        await beyond._route.call(ident)


async def test_a_rollout_that_falls_too_far_behind_is_stale(make_router: MakeRouter) -> None:
    router = await make_router()
    await router.register(spec("a", policy_version=0))
    rollout = session(router, "t", VersionBound(max_staleness=1))
    rollout._prepare()
    _, served = await rollout._route.call(ident)
    rollout._segment(served, 4, "stop")  # a turn generated by version 0
    await router.resume("m", ResumeRequest(policy_version=1))
    rollout.check_stale()  # one version behind: within the bound
    await router.resume("m", ResumeRequest(policy_version=2))
    with pytest.raises(StaleRolloutError) as raised:
        rollout.check_stale()
    assert raised.value.details == {
        "min_policy_version": 0,
        "max_policy_version": 0,
        "newest": 2,
        "max_staleness": 1,
    }
