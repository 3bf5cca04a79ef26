"""What this node has done since it started: how long each stage took (a histogram per
stage) and how the jobs it ended ended (status and exit reason), for ``/metrics``."""

from __future__ import annotations

import bisect
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from rollserve.schema.status import EndedCount, HistogramView, PipelineFigures

# Seconds: a sandbox starts in milliseconds, an episode lasts minutes, a test suite up to 30.
BUCKETS = (0.05, 0.25, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 1800.0, 3600.0)
RATE_BUCKET_S = 10  # the fleet view's throughput: stage completions per 10 s …
RATE_BUCKETS = 60  # … over the last 10 minutes


@dataclass
class Histogram:
    """Counts per bucket (not cumulative), the total, and how many."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(BUCKETS) + 1))
    total: float = 0.0

    def add(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(BUCKETS, seconds)] += 1
        self.total += seconds

    def cumulative(self) -> list[tuple[str, int]]:
        """Prometheus' buckets: (upper bound, observations at or under it)."""
        bounds = [*(str(b) for b in BUCKETS), "+Inf"]
        running, out = 0, []
        for bound, count in zip(bounds, self.counts, strict=True):
            running += count
            out.append((bound, running))
        return out


@dataclass
class Figures:
    """This node's stage durations and job endings."""

    stages: dict[str, Histogram] = field(default_factory=dict)
    ended: Counter[tuple[str, str]] = field(default_factory=Counter)
    clock: Callable[[], float] = time.time
    recent: dict[str, Counter[int]] = field(default_factory=dict)  # stage: bucket → count

    def stage_done(self, stage: str, seconds: float) -> None:
        self.stages.setdefault(stage, Histogram()).add(seconds)
        counts = self.recent.setdefault(stage, Counter())
        now = int(self.clock() // RATE_BUCKET_S)
        counts[now] += 1
        for old in [b for b in counts if b <= now - RATE_BUCKETS]:
            del counts[old]

    def throughput(self) -> dict[str, list[tuple[int, int]]]:
        """Per stage, (bucket start in unix seconds, completions) over the last minutes, oldest
        first, empty buckets included."""
        now = int(self.clock() // RATE_BUCKET_S)
        window = range(now - RATE_BUCKETS + 1, now + 1)
        return {
            stage: [(b * RATE_BUCKET_S, counts.get(b, 0)) for b in window]
            for stage, counts in self.recent.items()
        }

    def job_ended(self, status: str, exit_reason: str | None = None) -> None:
        self.ended[(status, exit_reason or "")] += 1

    def view(self) -> PipelineFigures:
        """The figures of ``/v1/status`` (which ``/metrics`` renders)."""
        return PipelineFigures(
            stage_seconds={
                stage: HistogramView(buckets=h.cumulative(), sum=round(h.total, 6))
                for stage, h in self.stages.items()
            },
            throughput=self.throughput(),
            throughput_bucket_s=RATE_BUCKET_S,
            jobs_ended=[
                EndedCount(status=status, exit_reason=reason, count=count)
                for (status, reason), count in sorted(self.ended.items())
            ],
        )
