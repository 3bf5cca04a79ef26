"""Prometheus metrics, read from the service at scrape time (no global registry)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector


class _ServiceCollector(Collector):
    def __init__(self, status: dict[str, Any]) -> None:
        self.status = status

    def collect(self):  # type: ignore[no-untyped-def]
        status = self.status
        depth = GaugeMetricFamily(
            "rollserve_stage_queue_depth", "jobs waiting for a worker", labels=["stage"]
        )
        active = GaugeMetricFamily(
            "rollserve_stage_active_workers", "workers busy", labels=["stage"]
        )
        size = GaugeMetricFamily("rollserve_stage_workers", "worker pool size", labels=["stage"])
        for stage, figures in status["stages"].items():
            depth.add_metric([stage], figures["queued"])
            active.add_metric([stage], figures["active"])
            size.add_metric([stage], figures["workers"])
        jobs = GaugeMetricFamily("rollserve_jobs", "jobs by status", labels=["status"])
        for name, count in status["jobs"].items():
            jobs.add_metric([name], count)
        sandboxes = GaugeMetricFamily("rollserve_live_sandboxes", "sandboxes open on this node")
        sandboxes.add_metric([], status["live_sandboxes"])
        paused = GaugeMetricFamily(
            "rollserve_model_paused_seconds", "how long a paused model has been", labels=["model"]
        )
        for state in status["paused_models"]:
            paused.add_metric([state["model"]], state["paused_s"])
        yield from (depth, active, size, jobs, sandboxes, paused)


def render_metrics(status: dict[str, Any]) -> tuple[bytes, str]:
    """The metrics page of a node's status (``RolloutService.status``) and its content type."""
    registry = CollectorRegistry()
    registry.register(_ServiceCollector(status))
    return generate_latest(registry), CONTENT_TYPE_LATEST
