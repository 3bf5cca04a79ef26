"""The three-stage pipeline on real sandboxes: decoupled pools, cancellation at every stage,
per-stage timeouts, retries of infrastructure failures, idempotent submits."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rollserve.errors import InvalidInputError, UnknownNameError
from rollserve.schema.jobs import JobRequest, RolloutResult
from rollserve.storage import JobStatus, NewJob, Stage
from tests.pipeline.conftest import Pipeline, echo_request, until_true


def _no_sandboxes_left(pipe: Pipeline) -> None:
    state_dir: Path = pipe.sandboxes.settings.state_dir
    assert list(state_dir.iterdir()) == [] if state_dir.exists() else True
    assert pipe.sandboxes.live == {}


async def _until_no_sandboxes_left(pipe: Pipeline) -> None:
    """A sandbox closes just after its job ends: wait for it, then check nothing is left."""
    await until_true(lambda: not pipe.sandboxes.live, "every sandbox closed")
    _no_sandboxes_left(pipe)


def _running(pipe: Pipeline, command: str) -> bool:
    """Whether a process named ``command`` runs in one of the pipeline's sandboxes."""
    for sandbox in list(pipe.sandboxes.live.values()):
        for process in sandbox.host_processes():
            with contextlib.suppress(OSError):
                if Path(f"/proc/{process.pid}/comm").read_text().strip() == command:
                    return True
    return False


async def test_a_job_goes_through_all_stages(pipeline_factory: Callable[..., Any]) -> None:
    async with pipeline_factory() as pipe:
        [job_id] = pipe.submit(echo_request("hello"))
        [record] = await pipe.wait([job_id])
        assert record.status == JobStatus.COMPLETED and record.attempts == 1
        result = RolloutResult.model_validate(record.result)
        assert (result.reward, result.exit_reason, result.turns) == (1.0, "submitted", 1)
        assert set(record.timing) == {"queued_s", "init_s", "run_s", "eval_s"}
        _no_sandboxes_left(pipe)


async def test_a_slow_evaluation_never_holds_the_run_stage(
    pipeline_factory: Callable[..., Any],
) -> None:
    async with pipeline_factory(eval_workers=1, run_workers=4) as pipe:
        ids = pipe.submit(*(echo_request(f"p{i}", eval_delay_s=1.0) for i in range(6)))
        runs_done_at = None
        done_when_runs_done = None
        end = time.monotonic() + 60
        while time.monotonic() < end:
            records = [pipe.store.get(j) for j in ids]
            stages = [r.stage for r in records if r is not None]
            if runs_done_at is None and all(s in (Stage.EVAL, Stage.DONE) for s in stages):
                runs_done_at = time.monotonic()
                done_when_runs_done = stages.count(Stage.DONE)
            if all(s == Stage.DONE for s in stages):
                break
            await asyncio.sleep(0.02)
        finished_at = time.monotonic()
        assert runs_done_at is not None and done_when_runs_done is not None
        # Every run finished while most evaluations still waited for the one eval worker.
        assert done_when_runs_done <= 2
        assert finished_at - runs_done_at > 3.0
        records = await pipe.wait(ids)
        assert all(r.status == JobStatus.COMPLETED for r in records)
        _no_sandboxes_left(pipe)


async def _cancel(pipe: Pipeline, job_id: str) -> None:
    pipe.store.cancel(job_id)
    await pipe.scheduler.cancel(job_id)


@pytest.mark.parametrize(
    ("stage_status", "request_fields", "at_work"),
    [
        (JobStatus.INITIALIZING, {"init_delay_s": 30}, lambda p: p.echo.prepared.get("c")),
        (JobStatus.RUNNING, {"commands": ["sleep 30"]}, lambda p: _running(p, "sleep")),
        (JobStatus.EVALUATING, {"eval_delay_s": 30}, lambda p: p.echo.evaluating.get("c")),
    ],
)
async def test_cancellation_frees_the_sandbox_at_every_stage(
    pipeline_factory: Callable[..., Any],
    stage_status: JobStatus,
    request_fields: dict[str, Any],
    at_work: Callable[[Pipeline], bool],
) -> None:
    async with pipeline_factory() as pipe:
        [job_id] = pipe.submit(echo_request("c", **request_fields))
        await pipe.until(job_id, lambda r: r.status == stage_status)
        await until_true(lambda: bool(at_work(pipe)), f"the {stage_status} stage at work")
        started = time.monotonic()
        await _cancel(pipe, job_id)
        [record] = await pipe.wait([job_id], timeout=10)
        assert record.status == JobStatus.CANCELLED
        assert time.monotonic() - started < 5
        await _until_no_sandboxes_left(pipe)


async def test_cancelling_a_queued_job_and_a_group(pipeline_factory: Callable[..., Any]) -> None:
    async with pipeline_factory(init_workers=1, run_workers=1) as pipe:
        busy = echo_request("busy", commands=["sleep 30"])
        group = [echo_request(f"g{i}").model_copy(update={"group_id": "grp"}) for i in range(3)]
        [busy_id, *group_ids] = pipe.submit(busy, *group)
        await pipe.until(busy_id, lambda r: r.status == JobStatus.RUNNING)
        touched = pipe.store.cancel_group("grp")
        for job_id in touched:
            await pipe.scheduler.cancel(job_id)
        records = await pipe.wait(group_ids, timeout=10)
        assert all(r.status == JobStatus.CANCELLED for r in records)
        await _cancel(pipe, busy_id)
        await pipe.wait([busy_id], timeout=10)
        await _until_no_sandboxes_left(pipe)


async def test_run_timeout_keeps_the_partial_episode_and_evaluates_it(
    pipeline_factory: Callable[..., Any],
) -> None:
    async with pipeline_factory() as pipe:
        request = JobRequest.model_validate(
            {
                **echo_request("t", commands=["echo started", "sleep 30"]).model_dump(),
                "timeouts": {"run_s": 1.5},
            }
        )
        [job_id] = pipe.submit(request)
        [record] = await pipe.wait([job_id])
        result = RolloutResult.model_validate(record.result)
        assert record.status == JobStatus.COMPLETED
        assert (result.exit_reason, result.reward, result.turns) == ("timeout", 0.0, 1)
        assert result.messages[1].content == "started\n"
        assert result.evaluation == {"matched": False}


async def test_an_evaluation_that_hangs_scores_zero_with_the_reason(
    pipeline_factory: Callable[..., Any],
) -> None:
    async with pipeline_factory() as pipe:
        request = JobRequest.model_validate(
            {**echo_request("e", eval_delay_s=30).model_dump(), "timeouts": {"eval_s": 1.0}}
        )
        [job_id] = pipe.submit(request)
        [record] = await pipe.wait([job_id])
        result = RolloutResult.model_validate(record.result)
        assert record.status == JobStatus.COMPLETED and result.reward == 0.0
        assert "exceeded" in result.evaluation["error"]
        _no_sandboxes_left(pipe)


async def test_infrastructure_failures_are_retried_then_succeed(
    pipeline_factory: Callable[..., Any],
) -> None:
    async with pipeline_factory() as pipe:
        [job_id] = pipe.submit(echo_request("r", fail_init=2))
        [record] = await pipe.wait([job_id])
        assert record.status == JobStatus.COMPLETED and record.attempts == 3
        assert RolloutResult.model_validate(record.result).reward == 1.0


async def test_a_sandbox_killed_mid_run_is_retried_in_a_new_one(
    pipeline_factory: Callable[..., Any],
) -> None:
    async with pipeline_factory() as pipe:
        [job_id] = pipe.submit(echo_request("k", commands=["sleep 2", "printf k > answer.txt"]))
        await pipe.until(job_id, lambda r: r.status == JobStatus.RUNNING)
        await until_true(lambda: _running(pipe, "sleep"), "the agent's command running")
        [sandbox] = pipe.sandboxes.live.values()
        for process in sandbox.host_processes():  # as an OOM killer or an operator would
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGKILL)
        [record] = await pipe.wait([job_id])
        assert record.status == JobStatus.COMPLETED and record.attempts == 2
        assert RolloutResult.model_validate(record.result).reward == 1.0
        await _until_no_sandboxes_left(pipe)


async def test_persistent_infrastructure_failure_fails_the_job(
    pipeline_factory: Callable[..., Any],
) -> None:
    async with pipeline_factory(max_attempts=2) as pipe:
        request = JobRequest.model_validate(
            {**echo_request("f", init_delay_s=30).model_dump(), "timeouts": {"init_s": 0.5}}
        )
        [job_id] = pipe.submit(request)
        [record] = await pipe.wait([job_id])
        assert record.status == JobStatus.FAILED and record.attempts == 2
        assert record.result is None  # never a reward of 0
        assert record.error is not None and record.error["code"] == "infrastructure"
        _no_sandboxes_left(pipe)


async def test_the_same_job_id_runs_once(pipeline_factory: Callable[..., Any]) -> None:
    async with pipeline_factory() as pipe:
        request = echo_request("once").model_copy(update={"job_id": "fixed"})
        assert pipe.submit(request) == ["fixed"]
        assert pipe.submit(request) == ["fixed"]
        await pipe.wait(["fixed"])
        assert pipe.submit(request) == ["fixed"]
        again = pipe.store.get("fixed")
        assert again is not None and again.stage == Stage.DONE  # not queued again
        # The repeat would have been claimed before a job submitted after it.
        later = pipe.submit(echo_request("later").model_copy(update={"job_id": "later"}))
        await pipe.wait(later)
        assert pipe.echo.evaluations == 2
        record = pipe.store.get("fixed")
        assert record is not None and record.attempts == 1


async def test_bad_requests_are_refused_before_queueing(
    pipeline_factory: Callable[..., Any],
) -> None:
    async with pipeline_factory() as pipe:
        with pytest.raises(UnknownNameError, match="known: code, echo, harbor, lookup, math, swe"):
            pipe.submit(JobRequest.model_validate({"task": {"task_id": "x", "kind": "nope"}}))
        with pytest.raises(InvalidInputError, match="'commands'"):
            pipe.submit(
                JobRequest.model_validate(
                    {"task": {"task_id": "x", "kind": "echo"}, "agent": {"name": "script"}}
                )
            )
        with pytest.raises(UnknownNameError, match="sandbox backend"):
            pipe.submit(
                JobRequest.model_validate(
                    {
                        "task": {"task_id": "x", "kind": "echo", "sandbox": {"backend": "docker"}},
                        "agent": {"name": "submit", "submission": "x"},
                    }
                )
            )
        assert pipe.store.counts() == {}


async def test_submit_agent_evaluates_a_given_submission(
    pipeline_factory: Callable[..., Any],
) -> None:
    async with pipeline_factory() as pipe:
        ids = pipe.submit(
            *(
                JobRequest.model_validate(
                    {
                        "task": {"task_id": f"s{answer}", "kind": "echo", "prompt": "42"},
                        "agent": {"name": "submit", "submission": answer},
                    }
                )
                for answer in ("42", "41")
            )
        )
        records = await pipe.wait(ids)
        rewards = [RolloutResult.model_validate(r.result).reward for r in records]
        assert rewards == [1.0, 0.0]


async def test_a_cancel_made_through_the_store_alone_stops_the_work(
    pipeline_factory: Callable[..., Any],
) -> None:
    # As when another node sharing the store takes the cancel: the heartbeat learns of it.
    async with pipeline_factory() as pipe:
        [job_id] = pipe.submit(echo_request("slow", commands=["sleep 60"]))
        await pipe.until(job_id, lambda r: r.status == JobStatus.RUNNING)
        pipe.store.cancel(job_id)
        [record] = await pipe.wait([job_id], timeout=20)
        assert record.status == JobStatus.CANCELLED
        # A job cancelled while it waited between init and run ends in the store at once; its
        # node learns of it at its next heartbeat (a third of the lease) and closes the sandbox.
        end = time.monotonic() + 10
        while pipe.sandboxes.live:
            assert time.monotonic() < end, "the cancelled job's sandbox was kept"
            await asyncio.sleep(0.05)
        _no_sandboxes_left(pipe)


async def test_a_job_cancelled_elsewhere_while_it_waits_for_the_run_pool_frees_its_sandbox(
    pipeline_factory: Callable[..., Any],
) -> None:
    # Made by init and waiting for the one run worker, the job holds no lease: no heartbeat
    # stops it, yet the sandbox made for it must go once another node cancels it.
    async with pipeline_factory(init_workers=2, run_workers=1) as pipe:
        ids = pipe.submit(
            echo_request("busy", commands=["sleep 60"]),
            echo_request("waiting", commands=["sleep 60"]),
        )
        for job_id in ids:
            await pipe.until(job_id, lambda r: r.status == JobStatus.RUNNING)
        records = [pipe.store.get(job_id) for job_id in ids]
        [waiting] = [r.job_id for r in records if r is not None and r.lease_owner is None]
        assert len(pipe.sandboxes.live) == 2
        pipe.store.cancel(waiting)
        end = time.monotonic() + 10
        while len(pipe.sandboxes.live) != 1:
            assert time.monotonic() < end, "the cancelled job's sandbox was kept"
            await asyncio.sleep(0.05)
        [running] = [job_id for job_id in ids if job_id != waiting]
        pipe.store.cancel(running)
        await pipe.wait([running], timeout=20)
        end = time.monotonic() + 10
        while pipe.sandboxes.live:
            assert time.monotonic() < end, "the running job's sandbox was kept"
            await asyncio.sleep(0.05)


async def test_init_runs_ahead_of_the_run_pool_by_the_init_pool_at_most(
    pipeline_factory: Callable[..., Any],
) -> None:
    async with pipeline_factory(init_workers=2, run_workers=1, eval_workers=1) as pipe:
        ids = pipe.submit(
            *(
                echo_request(f"p{i}", commands=["sleep 0.3", f"printf %s p{i} > answer.txt"])
                for i in range(8)
            )
        )
        peak = 0
        end = time.monotonic() + 120
        while time.monotonic() < end:
            peak = max(peak, len(pipe.sandboxes.live))
            records = [pipe.store.get(j) for j in ids]
            if all(r is not None and r.status.terminal for r in records):
                break
            await asyncio.sleep(0.01)
        records = await pipe.wait(ids)
        assert all(r.status == JobStatus.COMPLETED and r.attempts == 1 for r in records)
        # One running, at most two made ahead of it (or being made), one evaluating.
        assert 2 <= peak <= 4
        _no_sandboxes_left(pipe)


async def test_a_stop_drops_the_kept_layers_of_jobs_that_ended(
    pipeline_factory: Callable[..., Any],
) -> None:
    """A stop that lands between a job's end and the drop of its kept layer (a worker
    cancelled there) leaves no layer: the stop drops what no evaluation waits for."""
    async with pipeline_factory() as pipe:
        [job_id] = pipe.submit(echo_request("ended"))
        [record] = await pipe.wait([job_id])
        assert record.status == JobStatus.COMPLETED
        layers = pipe.scheduler.runner.layers
        left = await layers.prepare(job_id)  # what such a stop left behind
        (left / "etc").mkdir(parents=True)
        (left / "etc" / "motd").write_text("written by the run\n")
    assert list(layers.root.iterdir()) == []


async def test_a_free_worker_of_the_next_stage_takes_the_job_in_the_same_write(
    pipeline_factory: Callable[..., Any],
) -> None:
    async with pipeline_factory(init_workers=2, run_workers=1, eval_workers=1) as pipe:
        steps: list[tuple[str, str, Stage]] = []
        for name in ("advance", "pass_on"):

            def spied(job: Any, owner: str, stage: Stage, *a: Any, _n: str = name, **k: Any) -> Any:
                steps.append((_n, job if isinstance(job, str) else job.job_id, stage))
                return getattr(type(pipe.store), _n)(pipe.store, job, owner, stage, *a, **k)

            setattr(pipe.store, name, spied)
        [first] = pipe.submit(echo_request("a").model_copy(update={"job_id": "a"}))
        await pipe.wait([first])
        assert steps == [("pass_on", "a", Stage.RUN), ("pass_on", "a", Stage.EVAL)]
        steps.clear()
        # Two sandboxes made at once, one run worker: the job whose sandbox is ready second
        # waits in the queue while the other runs.
        ids = pipe.submit(*(echo_request(p, commands=["sleep 3"]) for p in ("b", "c")))
        records = await pipe.wait(ids)
        assert all(r.status == JobStatus.COMPLETED and r.attempts == 1 for r in records)
        into_run = sorted(name for name, _, stage in steps if stage == Stage.RUN)
        assert into_run == ["advance", "pass_on"]
        _no_sandboxes_left(pipe)


async def test_idle_workers_do_not_all_poll_the_store(
    pipeline_factory: Callable[..., Any],
) -> None:
    """One claimer per stage looks for work, and claims for every idle worker of its stage at
    once: a batch submitted together is taken in one claim."""
    async with pipeline_factory(init_workers=20, run_workers=40, eval_workers=20) as pipe:
        claims: list[tuple[Stage, int, int]] = []  # stage, limit, jobs claimed
        claim_many = pipe.store.claim_many

        def counted(stage: Stage, owner: str, lease_s: float, limit: int) -> Any:
            jobs = claim_many(stage, owner, lease_s, limit)
            claims.append((stage, limit, len(jobs)))
            return jobs

        pipe.store.claim_many = counted  # type: ignore[method-assign]
        began = time.monotonic()
        await until_true(lambda: len(claims) >= 3 * 4, "four looks per stage")
        # One claimer per stage looks every half second: 80 idle workers would make 80 looks.
        looks = (time.monotonic() - began) / 0.5 + 2
        assert len(claims) <= 3 * looks
        assert {(stage, limit) for stage, limit, _ in claims} == {
            (Stage.INIT, 20),
            (Stage.RUN, 40),
            (Stage.EVAL, 20),
        }
        ids = pipe.submit(*(echo_request(f"p{i}") for i in range(10)))
        records = await pipe.wait(ids)
        assert all(r.status == JobStatus.COMPLETED and r.attempts == 1 for r in records)
        # The ten submitted together were claimed together.
        assert [got for stage, _, got in claims if stage == Stage.INIT and got] == [10]


async def test_an_evaluation_failure_is_retried_in_eval(
    pipeline_factory: Callable[..., Any],
) -> None:
    """The run's output is kept: the episode is not played again for an evaluation retry."""
    async with pipeline_factory(retry_backoff_s=0) as pipe:
        [job_id] = pipe.submit(echo_request("e", fail_eval=1))
        [record] = await pipe.wait([job_id])
        assert record.status == JobStatus.COMPLETED and record.attempts == 2
        assert pipe.echo.prepared == {"e": 1}  # one init, one run (by task id)
        _no_sandboxes_left(pipe)


async def test_a_plugin_bug_costs_attempts_then_fails_the_job(
    pipeline_factory: Callable[..., Any],
) -> None:
    async with pipeline_factory(max_attempts=2, retry_backoff_s=0) as pipe:
        [job_id] = pipe.submit(echo_request("b", crash_init=5))
        [record] = await pipe.wait([job_id])
        assert record.status == JobStatus.FAILED and record.attempts == 2
        assert record.error is not None and "RuntimeError: injected plug-in bug 2" in str(
            record.error["message"]
        )
        _no_sandboxes_left(pipe)


async def test_a_refused_request_fails_at_once(pipeline_factory: Callable[..., Any]) -> None:
    async with pipeline_factory(max_attempts=3, retry_backoff_s=0) as pipe:
        [job_id] = pipe.submit(echo_request("r", refuse_init=True))
        [record] = await pipe.wait([job_id])
        assert record.status == JobStatus.FAILED and record.attempts == 1
        assert record.error is not None and record.error["code"] == "backend_request_refused"


async def test_a_stored_request_that_no_longer_validates_fails(
    pipeline_factory: Callable[..., Any],
) -> None:
    async with pipeline_factory() as pipe:
        pipe.store.submit([NewJob("old", {"task": {"kind": "echo"}, "agent": 7})], max_queued=10)
        pipe.scheduler.wake()
        [record] = await pipe.wait(["old"])
        assert record.status == JobStatus.FAILED and record.attempts == 1
        assert record.error is not None and record.error["code"] == "invalid_input"


async def test_a_backoff_holds_no_worker(pipeline_factory: Callable[..., Any]) -> None:
    """The retry waits in the store: the only init worker takes the next job meanwhile."""
    async with pipeline_factory(init_workers=1, retry_backoff_s=600) as pipe:
        [parked] = pipe.submit(echo_request("p", fail_init=1))
        await pipe.until(parked, lambda r: r.attempts == 1 and r.lease_owner is None)
        [other] = pipe.submit(echo_request("o"))
        [record] = await pipe.wait([other])
        assert record.status == JobStatus.COMPLETED
        waiting = pipe.store.get(parked)
        assert waiting is not None and waiting.status == JobStatus.QUEUED
        assert waiting.not_before is not None and waiting.not_before > time.time() + 500
        await _cancel(pipe, parked)
