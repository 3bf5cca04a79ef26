"""Quantiles of benchmark samples (nearest rank, as ``bench shell`` computes them), and who
took them."""

from __future__ import annotations

import os
import pwd
import statistics

from rollserve.schema.bench import Quantiles


def quantile(samples: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``samples`` by nearest rank; the median is interpolated;
    0.0 when there are none."""
    if not samples:
        return 0.0
    ordered = sorted(samples)
    if q == 0.5:
        return statistics.median(ordered)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def quantiles_ms(samples_s: list[float]) -> Quantiles:
    """p50 and p99 of samples in seconds, reported in milliseconds."""
    return Quantiles(
        p50_ms=round(quantile(samples_s, 0.5) * 1000, 3),
        p99_ms=round(quantile(samples_s, 0.99) * 1000, 3),
        n=len(samples_s),
    )


def running_user() -> str:
    """The name of the user this process runs as (benchmarks report whose figures they are)."""
    return pwd.getpwuid(os.geteuid()).pw_name
