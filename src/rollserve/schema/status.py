"""``GET /v1/status``: one node's view of itself and of its fleet, which ``/metrics`` renders."""

from __future__ import annotations

import warnings
from typing import Any

from pydantic import ConfigDict, Field

from rollserve.schema.backends import BackendView, ModelState
from rollserve.schema.wire import WireModel


class FleetNode(WireModel):
    """A node sharing the store, as its last heartbeat left it; what the node reports of
    itself (its workers, its load) rides along."""

    model_config = ConfigDict(extra="allow")

    node_id: str
    owner: str = Field(description="the lease owner its jobs are held by")
    alive: bool
    started: float = Field(description="unix seconds")
    seen: float = Field(description="its last heartbeat, unix seconds (the store's clock)")


class StageLoad(WireModel):
    """One stage's pool on this node, and the jobs waiting for it in the store."""

    queued: int
    active: int
    workers: int


class HistogramView(WireModel):
    """Prometheus' cumulative buckets: (upper bound, observations at or under it)."""

    buckets: list[tuple[str, int]]
    sum: float


class EndedCount(WireModel):
    """Jobs this node ended with one status and one episode exit reason."""

    status: str
    exit_reason: str
    count: int


class PipelineFigures(WireModel):
    """What this node's stages did since it started."""

    stage_seconds: dict[str, HistogramView]
    throughput: dict[str, list[tuple[int, int]]] = Field(
        description="per stage, (bucket start in unix seconds, completions), oldest first"
    )
    throughput_bucket_s: int
    jobs_ended: list[EndedCount]


class NodeStatus(WireModel):
    """One node: its pools and sandboxes, the store's jobs, its backends and paused models."""

    node: str = Field(description="this node's lease owner")
    node_id: str
    nodes: list[FleetNode] = Field(description="the fleet sharing the store")
    uptime_s: float
    not_ready: str | None = Field(description="why the node takes no work now, if it does not")
    stages: dict[str, StageLoad]
    jobs: dict[str, int] = Field(description="the store's jobs by status")
    results_cursor: int = Field(description="the results feed's newest position")
    live_sandboxes: int
    figures: PipelineFigures
    backends: list[BackendView]
    paused_models: list[ModelState]

    def __getitem__(self, key: str) -> Any:
        """The status as the JSON object it was before it was typed: deprecated."""
        warnings.warn(
            f"status()[{key!r}] is deprecated: use status().{key}", DeprecationWarning, stacklevel=2
        )
        return self.model_dump(mode="json")[key]
