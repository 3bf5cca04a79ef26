"""GRPO batches from rollserve results: group-normalised advantages, dynamic sampling (a group
whose rewards are all equal teaches nothing: it is dropped, and what is left of it on the server
is cancelled) and per-token data for a policy-gradient loss. Standard library, pydantic and
``rollserve.schema`` only: a trainer installs only the client."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from rollserve.errors import InvalidInputError
from rollserve.schema.jobs import JobView, RolloutResult


class GrpoConfig(BaseModel):
    """How groups are decided and scored."""

    model_config = ConfigDict(extra="forbid")

    group_size: int | None = Field(
        None, ge=1, description="completed samples that decide a group (None: all there are)"
    )
    scale_by_std: bool = Field(True, description="divide by the group's std (False: Dr. GRPO)")
    eps: float = Field(1e-6, ge=0, description="added to the std before dividing")
    drop_uniform: bool = Field(True, description="dynamic sampling: drop all-equal groups")
    cancel_surplus: bool = Field(
        False, description="also cancel a kept group's samples still running once it is decided"
    )


class GrpoSample(BaseModel):
    """One trajectory with its advantage, per token where the model generated it."""

    job_id: str
    group_id: str
    reward: float
    advantage: float
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float]
    token_advantages: list[float] = Field(description="the advantage where the mask is 1, else 0")
    policy_versions: list[int | None] = Field(description="the policy version of each turn")


class GrpoGroup(BaseModel):
    """The samples of one task (one ``group_id``) and their reward statistics."""

    group_id: str
    rewards: list[float]
    mean: float
    std: float
    kept: bool
    samples: list[GrpoSample]


class GrpoBatch(BaseModel):
    """Kept groups, ready for a loss, and the ids of the groups dropped as uniform."""

    groups: list[GrpoGroup]
    dropped: list[str] = Field(default_factory=list)

    @property
    def samples(self) -> list[GrpoSample]:
        return [s for g in self.groups for s in g.samples]

    def columns(self) -> dict[str, list[Any]]:
        """One list per field, one entry per sample: what a trainer turns into tensors."""
        samples = self.samples
        names = ["job_id", "group_id", "reward", "advantage", "prompt_ids", "response_ids"]
        names += ["response_mask", "response_logprobs", "token_advantages"]
        return {name: [getattr(s, name) for s in samples] for name in names}


def group_advantages(
    rewards: Sequence[float],
    *,
    scale_by_std: bool = True,
    eps: float = 1e-6,
    population: bool = False,
) -> list[float]:
    """``(r - mean) / (std + eps)`` over one group (std: the sample standard deviation, as TRL
    and veRL compute it; 0 for a single sample; the population's with ``population``, as TRL's
    asynchronous worker does), or ``r - mean`` without ``scale_by_std``."""
    mean, std = group_stats(rewards, population=population)
    if not scale_by_std:
        return [r - mean for r in rewards]
    if std + eps == 0:  # all equal, and eps 0: nothing to scale
        return [0.0 for _ in rewards]
    return [(r - mean) / (std + eps) for r in rewards]


def group_stats(rewards: Sequence[float], *, population: bool = False) -> tuple[float, float]:
    """The mean and standard deviation of a group's rewards (sample std unless
    ``population``)."""
    if not rewards:
        return 0.0, 0.0
    mean = sum(rewards) / len(rewards)
    if len(rewards) < 2:
        return mean, 0.0
    spread = sum((r - mean) ** 2 for r in rewards)
    return mean, math.sqrt(spread / (len(rewards) if population else len(rewards) - 1))


def _group_id(job: JobView) -> str:
    return job.group_id or job.job_id  # a job submitted without a group is a group of one


def make_group(group_id: str, jobs: Sequence[JobView], config: GrpoConfig) -> GrpoGroup:
    """Score one group of completed token-mode jobs; ``kept`` is False when dynamic sampling
    drops it (all rewards equal)."""
    rewards = [_result(job).reward for job in jobs]
    mean, std = group_stats(rewards)
    kept = not (config.drop_uniform and all(r == rewards[0] for r in rewards))
    advantages = group_advantages(rewards, scale_by_std=config.scale_by_std, eps=config.eps)
    samples = []
    for job, reward, advantage in zip(jobs, rewards, advantages, strict=True):
        tokens = _result(job).tokens
        if tokens is None:
            raise InvalidInputError(
                f"job {job.job_id} has no tokens: GRPO needs token mode (a vllm or sglang "
                "backend registered with a tokenizer)",
                job_id=job.job_id,
            )
        samples.append(
            GrpoSample(
                job_id=job.job_id,
                group_id=group_id,
                reward=reward,
                advantage=advantage,
                prompt_ids=tokens.prompt_ids,
                response_ids=tokens.response_ids,
                response_mask=tokens.response_mask,
                response_logprobs=tokens.response_logprobs,
                token_advantages=[advantage if m else 0.0 for m in tokens.response_mask],
                policy_versions=[t.policy_version for t in tokens.turns],
            )
        )
    return GrpoGroup(
        group_id=group_id, rewards=rewards, mean=mean, std=std, kept=kept, samples=samples
    )


def _result(job: JobView) -> RolloutResult:
    if job.result is None:
        raise InvalidInputError(f"job {job.job_id} has no result ({job.status})", job_id=job.job_id)
    return job.result


def build_batch(jobs: Iterable[JobView], config: GrpoConfig | None = None) -> GrpoBatch:
    """A batch over finished jobs, grouped by ``group_id`` (in order of first appearance);
    jobs that did not complete are left out. With ``group_size``, a group uses its first
    ``group_size`` completed samples."""
    config = config or GrpoConfig()
    grouped: dict[str, list[JobView]] = {}
    for job in jobs:
        if job.status == "completed" and job.result is not None:
            grouped.setdefault(_group_id(job), []).append(job)
    groups = [make_group(g, js[: config.group_size], config) for g, js in grouped.items()]
    return GrpoBatch(
        groups=[g for g in groups if g.kept], dropped=[g.group_id for g in groups if not g.kept]
    )


class GroupCollector:
    """Collects samples as they finish, one by one, and decides a group as soon as
    ``group_size`` of its samples have completed; later samples of a decided group are
    ignored. Jobs that failed or were cancelled are counted in ``lost``."""

    def __init__(self, config: GrpoConfig) -> None:
        if config.group_size is None:
            raise InvalidInputError("collecting groups needs group_size", field="group_size")
        self.config = config
        self.size = config.group_size
        self._open: dict[str, list[JobView]] = {}
        self._decided: set[str] = set()
        self.lost: dict[str, list[str]] = {}

    def add(self, job: JobView) -> GrpoGroup | None:
        """The group ``job`` decides, if it decides one."""
        group_id = _group_id(job)
        if group_id in self._decided:
            return None
        if job.status != "completed" or job.result is None:
            self.lost.setdefault(group_id, []).append(job.job_id)
            return None
        samples = self._open.setdefault(group_id, [])
        samples.append(job)
        if len(samples) < self.size:
            return None
        del self._open[group_id]
        self._decided.add(group_id)
        return make_group(group_id, samples, self.config)

    def pending(self) -> dict[str, int]:
        """Completed samples so far of each undecided group."""
        return {group_id: len(samples) for group_id, samples in self._open.items()}


class ResultSource(Protocol):
    """What the streaming helper needs of a ``RolloutClient``."""

    def iter_results(self, after: int = 0) -> Iterator[JobView]: ...

    def cancel_group(self, group_id: str) -> list[str]: ...


class AsyncResultSource(Protocol):
    """What the streaming helper needs of an ``AsyncRolloutClient``."""

    def iter_results(self, after: int = 0) -> AsyncIterator[JobView]: ...

    async def cancel_group(self, group_id: str) -> list[str]: ...


class _Assembler:
    """Kept groups until a batch is full, and the dropped ones since the last batch."""

    def __init__(self, groups_per_batch: int, config: GrpoConfig) -> None:
        if groups_per_batch < 1:
            raise InvalidInputError("groups_per_batch must be at least 1", field="groups_per_batch")
        self.collector = GroupCollector(config)
        self.groups_per_batch = groups_per_batch
        self.kept: list[GrpoGroup] = []
        self.dropped: list[str] = []

    def take(self, job: JobView, groups: set[str] | None) -> tuple[GrpoGroup | None, bool]:
        """The group ``job`` decided (if any), and whether what is left of it is cancelled."""
        if groups is not None and _group_id(job) not in groups:
            return None, False
        group = self.collector.add(job)
        if group is None:
            return None, False
        if group.kept:
            self.kept.append(group)
        else:
            self.dropped.append(group.group_id)
        return group, not group.kept or self.collector.config.cancel_surplus

    def ready(self) -> GrpoBatch | None:
        if len(self.kept) < self.groups_per_batch:
            return None
        batch = GrpoBatch(groups=self.kept, dropped=self.dropped)
        self.kept, self.dropped = [], []
        return batch


def stream_batches(
    client: ResultSource,
    groups_per_batch: int,
    config: GrpoConfig,
    *,
    after: int = 0,
    groups: Iterable[str] | None = None,
) -> Iterator[GrpoBatch]:
    """Batches of ``groups_per_batch`` kept groups, from the results feed (from cursor
    ``after``) as samples finish; only ``groups`` when given. Dropped groups are cancelled on
    the server at once. Runs until the caller stops iterating."""
    assembler = _Assembler(groups_per_batch, config)
    wanted = set(groups) if groups is not None else None
    for job in client.iter_results(after):
        group, cancel = assembler.take(job, wanted)
        if group is not None and cancel:
            client.cancel_group(group.group_id)
        batch = assembler.ready()
        if batch is not None:
            yield batch


async def astream_batches(
    client: AsyncResultSource,
    groups_per_batch: int,
    config: GrpoConfig,
    *,
    after: int = 0,
    groups: Iterable[str] | None = None,
) -> AsyncIterator[GrpoBatch]:
    """``stream_batches`` for asyncio trainers."""
    assembler = _Assembler(groups_per_batch, config)
    wanted = set(groups) if groups is not None else None
    async for job in client.iter_results(after):
        group, cancel = assembler.take(job, wanted)
        if group is not None and cancel:
            await client.cancel_group(group.group_id)
        batch = assembler.ready()
        if batch is not None:
            yield batch
