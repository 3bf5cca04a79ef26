"""Prometheus metrics, read from the service at scrape time (no global registry). Every series
carries the ``node`` label (``settings.node_id``); queue depths and job counts are the whole
store's, the same on every node of a fleet (aggregate them with ``max``, not ``sum``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from rollserve.schema.status import NodeStatus


class _ServiceCollector(Collector):
    def __init__(self, status: NodeStatus) -> None:
        self.status = status

    def collect(self):  # type: ignore[no-untyped-def]
        status = self.status
        node = status.node_id

        def gauge(name: str, text: str, *labels: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, text, labels=["node", *labels])

        depth = gauge("rollserve_stage_queue_depth", "jobs waiting for a worker (store)", "stage")
        active = gauge("rollserve_stage_active_workers", "workers busy on this node", "stage")
        size = gauge("rollserve_stage_workers", "worker pool size on this node", "stage")
        for stage, load in status.stages.items():
            depth.add_metric([node, stage], load.queued)
            active.add_metric([node, stage], load.active)
            size.add_metric([node, stage], load.workers)
        jobs = gauge("rollserve_jobs", "jobs by status (store)", "status")
        for name, count in status.jobs.items():
            jobs.add_metric([node, name], count)
        sandboxes = gauge("rollserve_live_sandboxes", "sandboxes open on this node")
        sandboxes.add_metric([node], status.live_sandboxes)
        nodes = gauge("rollserve_fleet_nodes", "nodes of the store whose heartbeat is current")
        nodes.add_metric([node], sum(1 for n in status.nodes if n.alive))
        paused = gauge(
            "rollserve_model_paused_seconds", "how long a paused model has been", "model"
        )
        for state in status.paused_models:
            paused.add_metric([node, state.model], state.paused_s)
        stages = HistogramMetricFamily(
            "rollserve_stage_seconds",
            "time a stage took on this node (init, run, eval)",
            labels=["node", "stage"],
        )
        for stage, histogram in status.figures.stage_seconds.items():
            stages.add_metric([node, stage], histogram.buckets, histogram.sum)
        ended = CounterMetricFamily(
            "rollserve_jobs_ended",
            "jobs this node ended, by status and the episode's exit reason",
            labels=["node", "status", "exit_reason"],
        )
        for row in status.figures.jobs_ended:
            ended.add_metric([node, row.status, row.exit_reason], row.count)
        yield from (depth, active, size, jobs, sandboxes, nodes, paused, stages, ended)


def render_metrics(status: NodeStatus) -> tuple[bytes, str]:
    """The metrics page of a node's status (``RolloutService.status``) and its content type."""
    registry = CollectorRegistry()
    registry.register(_ServiceCollector(status))
    return generate_latest(registry), CONTENT_TYPE_LATEST
