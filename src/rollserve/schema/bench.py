"""Figures printed by ``rollserve bench``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

ShellMethod = Literal["pty", "tmux", "bash_c"]


class ShellBenchResult(BaseModel):
    """Latency of trivial commands by one method in one backend."""

    model_config = ConfigDict(extra="forbid")

    backend: str
    method: ShellMethod
    p50_ms: float
    p99_ms: float
    n: int


RoutingPolicy = Literal["router", "assignment"]


class RoutingRun(BaseModel):
    """One routing policy over one set of emulated backends."""

    model_config = ConfigDict(extra="forbid")

    policy: RoutingPolicy
    rollouts: int
    seconds: float
    rollouts_per_s: float
    calls: dict[str, int]  # model calls answered, by backend


class RoutingCase(BaseModel):
    """Both policies over the same backends and the same rollouts; ``ratio`` is the router's
    throughput over the assignment counter's."""

    model_config = ConfigDict(extra="forbid")

    name: str
    slowdown: float  # per-token time of the slow backend over the fast one's
    router: RoutingRun
    assignment: RoutingRun
    ratio: float


class RouterBenchResult(BaseModel):
    """``rollserve bench router``: the workload and its cases."""

    model_config = ConfigDict(extra="forbid")

    sessions: int  # rollouts running at once
    turns: int
    rollouts: int
    tokens_per_turn: int
    fast_ms_per_token: float
    slots: int  # calls each emulated server runs at once; the rest queue
    tool_ms: float  # time between turns (the tool runs in the sandbox)
    cases: list[RoutingCase]
