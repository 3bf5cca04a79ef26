"""Browsing jobs, run over every store: the filters, order and pages of ``GET /v1/jobs`` and
the events a running episode appends."""

from __future__ import annotations

from typing import Any

import pytest

from rollserve.schema.api import JobQuery
from rollserve.storage import JobStatus, NewJob, Stage
from rollserve.storage.base import Store
from tests.storage.conftest import Clock


def _submit(store: Store, clock: Clock, job_id: str, kind: str, **extra: Any) -> None:
    request = {"task": {"task_id": f"t-{job_id}", "kind": kind}, "model": "m", **extra}
    store.submit([NewJob(job_id, request, group_id=extra.get("group"))], max_queued=100)
    clock.now += 1


def _end(store: Store, job_id: str, status: JobStatus, **fields: Any) -> None:
    claimed = store.claim(Stage.INIT, "n", 30)
    assert claimed is not None and claimed.job_id == job_id
    store.finish(job_id, "n", status, **fields)


def _result(reward: float, reason: str, version: int | None) -> dict[str, Any]:
    return {"reward": reward, "exit_reason": reason, "max_policy_version": version, "turns": 3}


@pytest.fixture
def jobs(store: Store, clock: Clock) -> Store:
    """a (math, 1.0, v2), b (math, 0.0, v1, group g), c (code, failed), d (code, queued)."""
    for job_id, kind in (("a", "math"), ("b", "math"), ("c", "code"), ("d", "code")):
        _submit(store, clock, job_id, kind, **({"group": "g"} if job_id == "b" else {}))
    _end(store, "a", JobStatus.COMPLETED, result=_result(1.0, "submitted", 2))
    _end(store, "b", JobStatus.COMPLETED, result=_result(0.0, "max_turns", 1))
    error = {"code": "sandbox_died", "message": "gone"}
    _end(store, "c", JobStatus.FAILED, error=error)
    return store


def _ids(store: Store, **query: Any) -> list[str]:
    return [j.job_id for j in store.list_jobs(JobQuery.model_validate(query)).jobs]


def test_every_filter_narrows_the_page(jobs: Store) -> None:
    assert _ids(jobs) == ["d", "c", "b", "a"]  # newest first
    assert _ids(jobs, status=["completed"]) == ["b", "a"]
    assert _ids(jobs, status=["failed", "queued"]) == ["d", "c"]
    assert _ids(jobs, kind="code") == ["d", "c"]
    assert _ids(jobs, group_id="g") == ["b"]
    assert _ids(jobs, exit_reason=["max_turns"]) == ["b"]
    assert _ids(jobs, reward_min=0.5) == ["a"]
    assert _ids(jobs, reward_max=0.5) == ["b"]
    assert _ids(jobs, policy_version_min=2) == ["a"]
    assert _ids(jobs, policy_version_max=1) == ["b"]
    assert _ids(jobs, created_after=1001, created_before=1003) == ["c", "b"]
    assert _ids(jobs, kind="math", reward_min=0.5, status=["completed"]) == ["a"]


def test_rows_carry_what_the_table_shows(jobs: Store) -> None:
    rows = {j.job_id: j for j in jobs.list_jobs(JobQuery()).jobs}
    a, c, d = rows["a"], rows["c"], rows["d"]
    assert (a.kind, a.task_id, a.model, a.reward, a.exit_reason) == (
        "math",
        "t-a",
        "m",
        1.0,
        "submitted",
    )
    assert (a.policy_version, a.turns, a.status, a.error_code) == (2, 3, "completed", None)
    assert a.finished is not None and a.created == 1000
    assert (c.status, c.error_code, c.reward) == ("failed", "sandbox_died", None)
    assert (d.status, d.finished, d.reward) == ("queued", None, None)


def test_sorting_puts_jobs_without_a_value_last(jobs: Store) -> None:
    assert _ids(jobs, sort="reward") == ["a", "b", "d", "c"]
    assert _ids(jobs, sort="reward", order="asc") == ["b", "a", "c", "d"]
    assert _ids(jobs, sort="policy_version", order="asc")[:2] == ["b", "a"]
    assert _ids(jobs, sort="created", order="asc") == ["a", "b", "c", "d"]


def test_pages_split_the_matches_and_count_them_all(jobs: Store) -> None:
    first = jobs.list_jobs(JobQuery(limit=3))
    second = jobs.list_jobs(JobQuery(limit=3, offset=3))
    assert (first.total, second.total) == (4, 4)
    assert [j.job_id for j in first.jobs + second.jobs] == ["d", "c", "b", "a"]
    assert jobs.list_jobs(JobQuery(kind="nothing")).total == 0


def test_events_come_back_in_order_and_go_with_the_job(store: Store, clock: Clock) -> None:
    _submit(store, clock, "e", "math")
    store.append_event("e", 1, 0, {"messages": [{"role": "system", "content": "s"}]})
    store.append_event("e", 1, 1, {"messages": [{"role": "assistant", "content": "x"}]})
    store.append_event("e", 2, 0, {"messages": []})
    found = store.events("e")
    assert [(e.attempt, e.turn) for e in found] == [(1, 0), (1, 1), (2, 0)]
    assert found[1].data == {"messages": [{"role": "assistant", "content": "x"}]}
    assert found[0].seq < found[1].seq < found[2].seq
    assert store.events("other") == []
    _end(store, "e", JobStatus.FAILED, error={"code": "sandbox_died", "message": "gone"})
    assert len(store.events("e")) == 3  # a failed job's turns are all it has to show
    clock.now += 100
    assert store.purge(clock.now) == 1
    assert store.events("e") == []


def test_a_result_replaces_the_events_of_its_turns(store: Store, clock: Clock) -> None:
    _submit(store, clock, "r", "math")
    store.append_event("r", 1, 0, {"messages": []})
    _end(store, "r", JobStatus.COMPLETED, result=_result(1.0, "submitted", None))
    assert store.events("r") == []
    _submit(store, clock, "c", "math")  # ended with no result by a cancel: kept
    store.append_event("c", 1, 0, {"messages": []})
    store.cancel("c")
    assert len(store.events("c")) == 1
