"""``rollserve bench router``: the load-aware router against ProRL Agent's assignment counter,
on emulated inference servers of unequal speed.

Each emulated server (an in-process FakeLLMBackend) runs at most ``slots`` calls at once and
queues the rest, as a real server's batch is bounded. Both policies run the same rollouts,
``sessions`` at a time: ``turns`` model calls of varying length, with a tool step between them.
The router sends each call to the least loaded backend, sticky per rollout; the assignment
counter gives each new rollout to the backend given the fewest rollouts so far, for its whole
length, and never counts down (what ProRL Agent does).
"""

from __future__ import annotations

import asyncio
import heapq
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from rich.table import Table

from rollserve.llm.base import LLMBackend, SamplingParams, TokenCompletion
from rollserve.llm.router import BackendFactory, Router
from rollserve.registry import Registry
from rollserve.schema.backends import BackendSpec, BackendView
from rollserve.schema.bench import RouterBenchResult, RoutingCase, RoutingRun
from rollserve.settings import Settings
from rollserve.testing.fake_llm import FakeBehaviour, FakeLLMBackend, FakeLLMFactory

_MODEL = "bench-model"


@dataclass(frozen=True)
class Workload:
    """What both policies run: the rollouts, and the emulated servers' speed."""

    sessions: int = 64
    turns: int = 4
    rollouts: int = 256
    tokens_per_turn: int = 32
    fast_ms_per_token: float = 0.5
    slots: int = 8
    tool_ms: float = 5.0
    seed: int = 0

    def plan(self) -> list[list[int]]:
        """Tokens generated in each turn of each rollout (the same for both policies)."""
        rng = random.Random(self.seed)
        low, high = self.tokens_per_turn // 2, self.tokens_per_turn * 3 // 2
        return [[rng.randint(low, high) for _ in range(self.turns)] for _ in range(self.rollouts)]

    def behaviour(self, slowdown: float) -> FakeBehaviour:
        """A server ``slowdown`` times slower per token than the fast one."""
        per_token = self.fast_ms_per_token * slowdown / 1000
        return FakeBehaviour(per_token_s=per_token, slots=self.slots)


class AssignmentCounter:
    """ProRL Agent's balancer: a min-heap of ``[rollouts assigned, backend]``; a new rollout
    takes the head for its whole length, and the count is never decremented."""

    def __init__(self, backends: list[str]) -> None:
        self._heap: list[list[Any]] = [[0, i, name] for i, name in enumerate(backends)]

    def assign(self) -> str:
        """The backend of a new rollout."""
        head = self._heap[0]
        head[0] += 1
        heapq.heapreplace(self._heap, head)
        return str(head[2])


class MemoryBackendStore:
    """A BackendStore that keeps registrations in memory (nothing outlives the benchmark)."""

    def __init__(self) -> None:
        self._specs: dict[str, dict[str, Any]] = {}
        self._pauses: dict[str, dict[str, Any]] = {}

    def save_backend(self, backend_id: str, spec: dict[str, Any]) -> None:
        self._specs[backend_id] = spec

    def load_backends(self) -> list[dict[str, Any]]:
        return list(self._specs.values())

    def delete_backend(self, backend_id: str) -> bool:
        return self._specs.pop(backend_id, None) is not None

    def save_pause(self, model: str, pause: dict[str, Any] | None) -> None:
        if pause is None:
            self._pauses.pop(model, None)
        else:
            self._pauses[model] = pause

    def load_pauses(self) -> dict[str, dict[str, Any]]:
        return dict(self._pauses)


def _spec(name: str) -> BackendSpec:
    return BackendSpec(id=name, kind="vllm", url=f"http://{name}.bench/v1", model=_MODEL)


def _turn(tokens: int) -> Callable[[LLMBackend], Awaitable[TokenCompletion]]:
    async def call(backend: LLMBackend) -> TokenCompletion:
        return await backend.complete_tokens([1, 2, 3], SamplingParams(max_tokens=tokens))

    return call


async def _drive(
    workload: Workload, rollout: Callable[[int], Awaitable[None]]
) -> tuple[float, float]:
    """Run every rollout, ``sessions`` at a time; returns (seconds, rollouts per second)."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for index in range(workload.rollouts):
        queue.put_nowait(index)

    async def worker() -> None:
        while not queue.empty():
            await rollout(queue.get_nowait())

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(workload.sessions)))
    seconds = time.perf_counter() - start
    return round(seconds, 3), round(workload.rollouts / seconds, 2)


async def _with_router(
    workload: Workload, servers: dict[str, FakeBehaviour], plan: list[list[int]]
) -> RoutingRun:
    factory = FakeLLMFactory(behaviours=servers)
    kinds: Registry[BackendFactory] = Registry("inference backend kind")
    kinds.register("vllm", factory)
    router = Router(Settings(llm_health_interval_s=3600.0), MemoryBackendStore(), kinds)
    await router.start()
    try:
        for name in servers:
            await router.register(_spec(name))

        async def rollout(index: int) -> None:
            session = router.session(f"rollout-{index}", _MODEL)
            for tokens in plan[index]:
                await session.call(_turn(tokens))
                await asyncio.sleep(workload.tool_ms / 1000)

        seconds, rate = await _drive(workload, rollout)
    finally:
        await router.stop()
    calls = {name: factory.latest(name).calls for name in servers}
    return RoutingRun(
        policy="router",
        rollouts=workload.rollouts,
        seconds=seconds,
        rollouts_per_s=rate,
        calls=calls,
    )


async def _with_assignment(
    workload: Workload, servers: dict[str, FakeBehaviour], plan: list[list[int]]
) -> RoutingRun:
    backends = {
        name: FakeLLMBackend(
            BackendView(**_spec(name).model_dump(), registered_at=time.time()), behaviour
        )
        for name, behaviour in servers.items()
    }
    counter = AssignmentCounter(list(servers))

    async def rollout(index: int) -> None:
        backend = backends[counter.assign()]
        for tokens in plan[index]:
            await _turn(tokens)(backend)
            await asyncio.sleep(workload.tool_ms / 1000)

    seconds, rate = await _drive(workload, rollout)
    calls = {name: backend.calls for name, backend in backends.items()}
    return RoutingRun(
        policy="assignment",
        rollouts=workload.rollouts,
        seconds=seconds,
        rollouts_per_s=rate,
        calls=calls,
    )


async def _case(workload: Workload, name: str, slowdown: float) -> RoutingCase:
    if slowdown == 1:
        servers = {"a": workload.behaviour(1), "b": workload.behaviour(1)}
    else:
        servers = {"fast": workload.behaviour(1), "slow": workload.behaviour(slowdown)}
    plan = workload.plan()
    assignment = await _with_assignment(workload, servers, plan)
    router = await _with_router(workload, servers, plan)
    return RoutingCase(
        name=name,
        slowdown=slowdown,
        router=router,
        assignment=assignment,
        ratio=round(router.rollouts_per_s / assignment.rollouts_per_s, 2),
    )


async def bench_router(workload: Workload, slowdown: float = 5.0) -> RouterBenchResult:
    """Both policies on skewed backends (one ``slowdown`` times slower) and on equal ones."""
    cases = [
        await _case(workload, f"skewed {slowdown:g}x", slowdown),
        await _case(workload, "equal", 1.0),
    ]
    return RouterBenchResult(
        sessions=workload.sessions,
        turns=workload.turns,
        rollouts=workload.rollouts,
        tokens_per_turn=workload.tokens_per_turn,
        fast_ms_per_token=workload.fast_ms_per_token,
        slots=workload.slots,
        tool_ms=workload.tool_ms,
        cases=cases,
    )


def router_table(result: RouterBenchResult) -> Table:
    """The figures as a table: each case, both policies, and the router's speed-up."""
    table = Table(
        "backends",
        "policy",
        "rollouts",
        "seconds",
        "rollouts/s",
        "calls by backend",
        "speed-up",
        caption=(
            f"{result.sessions} rollouts at a time, {result.turns} turns, "
            f"~{result.tokens_per_turn} tokens per turn at {result.fast_ms_per_token:g} ms/token "
            f"(fast), {result.slots} slots per server, {result.tool_ms:g} ms per tool step; "
            "speed-up: router over assignment counting"
        ),
    )
    for case in result.cases:
        for run in (case.router, case.assignment):
            calls = ", ".join(f"{name} {n}" for name, n in run.calls.items())
            ratio = f"{case.ratio:.2f}x" if run is case.router else ""
            table.add_row(
                case.name if run is case.router else "",
                run.policy,
                str(run.rollouts),
                f"{run.seconds:.2f}",
                f"{run.rollouts_per_s:.1f}",
                calls,
                ratio,
            )
    return table
