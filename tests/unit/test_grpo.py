"""GRPO batches over hand-made results: advantages, dynamic sampling with cancellation of
what is left of a dropped group, per-token data, and batches streamed from the results feed."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Iterator

import pytest

from rollserve.client.grpo import (
    GroupCollector,
    GrpoConfig,
    astream_batches,
    build_batch,
    group_advantages,
    stream_batches,
)
from rollserve.errors import InvalidInputError
from rollserve.schema.jobs import JobView, RolloutResult
from rollserve.schema.tokens import Tokens, TurnInfo


def job(
    job_id: str,
    group: str | None,
    reward: float,
    *,
    status: str = "completed",
    mask: tuple[int, ...] = (1, 1, 0, 0, 1),
    tokens: bool = True,
) -> JobView:
    """A finished job whose response is ``len(mask)`` ids: generated (1) and observed (0)."""
    n = len(mask)
    trajectory = Tokens(
        prompt_ids=[1, 2, 3],
        response_ids=list(range(10, 10 + n)),
        response_mask=list(mask),
        response_logprobs=[-0.5 if m else 0.0 for m in mask],
        turns=[
            TurnInfo(backend_id="b", model="m", policy_version=0, finish_reason="stop"),
            TurnInfo(backend_id="b", model="m", policy_version=1, finish_reason="stop"),
        ],
    )
    result = RolloutResult(
        reward=reward, exit_reason="submitted", tokens=trajectory if tokens else None
    )
    done = status == "completed"
    return JobView(job_id=job_id, group_id=group, status=status, result=result if done else None)


def test_advantages_are_group_normalised() -> None:
    rewards = [1.0, 0.0, 0.0, 1.0]
    std = math.sqrt(sum((r - 0.5) ** 2 for r in rewards) / 3)  # sample std, as TRL/veRL
    expected = [0.5 / std, -0.5 / std, -0.5 / std, 0.5 / std]
    assert group_advantages(rewards, eps=0.0) == pytest.approx(expected)
    assert group_advantages(rewards, scale_by_std=False) == [0.5, -0.5, -0.5, 0.5]
    assert group_advantages([2.0, 2.0], eps=1e-6) == [0.0, 0.0]
    assert group_advantages([2.0, 2.0], eps=0.0) == [0.0, 0.0]
    assert group_advantages([3.0]) == [0.0]  # a single sample has no spread
    assert group_advantages([]) == []


def test_batch_groups_drops_uniform_groups_and_broadcasts_advantages() -> None:
    jobs = [
        job("a0", "a", 1.0),
        job("b0", "b", 0.5),
        job("a1", "a", 0.0),
        job("b1", "b", 0.5),  # all equal: dropped by dynamic sampling
        job("a2", "a", 0.0, status="failed"),  # not completed: left out
    ]
    batch = build_batch(jobs, GrpoConfig(eps=0.0))
    assert batch.dropped == ["b"]
    assert [g.group_id for g in batch.groups] == ["a"]
    group = batch.groups[0]
    assert group.rewards == [1.0, 0.0]
    assert group.mean == 0.5
    assert group.std == pytest.approx(math.sqrt(0.5))
    first, second = group.samples
    assert first.advantage == pytest.approx(0.5 / math.sqrt(0.5))
    assert second.advantage == pytest.approx(-first.advantage)
    # Per token: the advantage where the model generated, 0 on observation tokens.
    assert first.token_advantages == [first.advantage, first.advantage, 0.0, 0.0, first.advantage]
    assert first.prompt_ids == [1, 2, 3]
    assert first.response_ids == [10, 11, 12, 13, 14]
    assert first.response_mask == [1, 1, 0, 0, 1]
    assert first.response_logprobs == [-0.5, -0.5, 0.0, 0.0, -0.5]
    assert first.policy_versions == [0, 1]
    columns = batch.columns()
    assert columns["job_id"] == ["a0", "a1"]
    assert columns["reward"] == [1.0, 0.0]
    assert len(columns["token_advantages"]) == 2


def test_batch_keeps_uniform_groups_without_dynamic_sampling() -> None:
    jobs = [job("b0", "b", 1.0), job("b1", "b", 1.0), job("solo", None, 1.0)]
    batch = build_batch(jobs, GrpoConfig(drop_uniform=False, scale_by_std=False))
    assert [g.group_id for g in batch.groups] == ["b", "solo"]  # no group_id: a group of one
    assert [s.advantage for s in batch.samples] == [0.0, 0.0, 0.0]
    assert batch.dropped == []


def test_group_size_takes_the_first_samples() -> None:
    jobs = [job("a0", "a", 1.0), job("a1", "a", 0.0), job("a2", "a", 1.0)]
    batch = build_batch(jobs, GrpoConfig(group_size=2))
    assert [s.job_id for s in batch.samples] == ["a0", "a1"]


def test_text_mode_results_are_refused() -> None:
    with pytest.raises(InvalidInputError, match="token mode"):
        build_batch([job("a0", "a", 1.0, tokens=False), job("a1", "a", 0.0, tokens=False)])


def test_collector_decides_a_group_once_and_counts_lost_samples() -> None:
    collector = GroupCollector(GrpoConfig(group_size=2))
    assert collector.add(job("a0", "a", 1.0)) is None
    assert collector.add(job("a1", "a", 1.0, status="failed")) is None
    assert collector.lost == {"a": ["a1"]}
    assert collector.pending() == {"a": 1}
    group = collector.add(job("a2", "a", 0.0))
    assert group is not None and group.kept
    assert collector.add(job("a3", "a", 1.0)) is None  # a late sample of a decided group
    assert collector.pending() == {}
    with pytest.raises(InvalidInputError, match="group_size"):
        GroupCollector(GrpoConfig())


class FakeFeed:
    """The results feed and group cancellation of a ``RolloutClient``, in memory."""

    def __init__(self, jobs: list[JobView]) -> None:
        self.jobs = jobs
        self.read: list[str] = []
        self.cancelled: list[str] = []

    def iter_results(self, after: int = 0) -> Iterator[JobView]:
        for done in self.jobs[after:]:
            self.read.append(done.job_id)
            yield done

    def cancel_group(self, group_id: str) -> list[str]:
        self.cancelled.append(group_id)
        return []


class AsyncFakeFeed(FakeFeed):
    async def aiter(self, after: int = 0) -> AsyncIterator[JobView]:
        for done in super().iter_results(after):
            await asyncio.sleep(0)
            yield done

    def iter_results(self, after: int = 0) -> AsyncIterator[JobView]:  # type: ignore[override]
        return self.aiter(after)

    async def cancel_group(self, group_id: str) -> list[str]:  # type: ignore[override]
        self.cancelled.append(group_id)
        return []


FEED = [
    job("u0", "u", 1.0),
    job("k0", "k", 1.0),
    job("u1", "u", 1.0),  # u decided uniform: dropped and cancelled at once
    job("k1", "k", 0.0),  # k decided: kept
    job("x0", "x", 1.0),  # not asked for
    job("m0", "m", 0.0),
    job("m1", "m", 0.5),  # m kept: a batch of two groups is ready
    job("u2", "u", 0.0),  # a late sample of the dropped group: ignored
    job("n0", "n", 1.0),
]


def test_stream_yields_batches_of_kept_groups_and_cancels_dropped_ones() -> None:
    feed = FakeFeed(FEED)
    config = GrpoConfig(group_size=2)
    stream = stream_batches(feed, 2, config, groups=["u", "k", "m", "n"])
    batch = next(stream)
    assert [g.group_id for g in batch.groups] == ["k", "m"]
    assert batch.dropped == ["u"]
    assert feed.cancelled == ["u"]
    assert feed.read[-1] == "m1"  # yielded as soon as the batch was full
    assert list(stream) == []  # the feed ends with n undecided
    assert feed.cancelled == ["u"]


def test_stream_can_cancel_the_surplus_of_kept_groups() -> None:
    feed = FakeFeed(FEED)
    config = GrpoConfig(group_size=2, cancel_surplus=True)
    next(stream_batches(feed, 2, config))
    assert feed.cancelled == ["u", "k", "m"]


async def test_async_stream() -> None:
    feed = AsyncFakeFeed(FEED)
    batches = [b async for b in astream_batches(feed, 1, GrpoConfig(group_size=2))]
    assert [[g.group_id for g in b.groups] for b in batches] == [["k"], ["m"]]
    assert batches[0].dropped == ["u"]
    assert feed.cancelled == ["u"]


def test_stream_needs_a_positive_batch() -> None:
    with pytest.raises(InvalidInputError, match="groups_per_batch"):
        next(stream_batches(FakeFeed([]), 0, GrpoConfig(group_size=2)))
