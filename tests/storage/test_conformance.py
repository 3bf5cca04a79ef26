"""The job store conformance suite, run over every store (SQLite, PostgreSQL): idempotent
submits, exclusive claims under leases, the results feed, cancellation, crash recovery and
retention — on real databases."""

from __future__ import annotations

import threading

import pytest

from rollserve.errors import (
    InvalidInputError,
    JobConflictError,
    JobNotFoundError,
    LeaseLostError,
    QueueFullError,
)
from rollserve.storage import JobStatus, NewJob, Stage
from rollserve.storage.base import JobRecord, Store
from tests.storage.conftest import Clock, StoreKit


def _jobs(*ids: str, group: str | None = None, priority: int = 0) -> list[NewJob]:
    return [NewJob(i, {"task": {"task_id": i}}, group_id=group, priority=priority) for i in ids]


def test_submit_is_idempotent(store: Store) -> None:
    first = store.submit(_jobs("a", "b"), max_queued=10)
    assert [(s.job_id, s.created) for s in first] == [("a", True), ("b", True)]
    again = store.submit(_jobs("a", "a", "c"), max_queued=10)
    assert [(s.job_id, s.created) for s in again] == [("a", False), ("a", False), ("c", True)]
    assert store.counts() == {"queued": 3}


def test_same_id_with_another_request_is_a_conflict(store: Store) -> None:
    store.submit(_jobs("a"), max_queued=10)
    with pytest.raises(JobConflictError, match="'a'"):
        store.submit([NewJob("a", {"task": {"task_id": "other"}})], max_queued=10)


def test_a_full_queue_accepts_nothing(store: Store) -> None:
    store.submit(_jobs("a", "b"), max_queued=3)
    with pytest.raises(QueueFullError, match="bound of 3"):
        store.submit(_jobs("c", "d"), max_queued=3)
    assert store.get("c") is None  # all or nothing
    assert [s.created for s in store.submit(_jobs("a", "c"), max_queued=3)] == [False, True]


def test_the_queue_bound_counts_each_job_until_it_ends(store: Store, clock: Clock) -> None:
    """Submitted jobs count against the bound until they end, however they end (finished,
    cancelled queued, cancel_group, cancelled in a stage); ended jobs and their purge do not."""
    store.submit(_jobs("a", "b", "c", "d", group="g"), max_queued=5)
    store.submit(_jobs("e"), max_queued=5)
    with pytest.raises(QueueFullError, match="holds 5 unfinished"):
        store.submit(_jobs("f"), max_queued=5)
    a = store.claim(Stage.INIT, "n", 30)
    assert a is not None
    assert store.pass_on(a, "n", Stage.RUN, 30) is not None  # still unfinished
    store.requeue("a", "n", Stage.INIT)  # and again
    with pytest.raises(QueueFullError, match="holds 5 unfinished"):
        store.submit(_jobs("f"), max_queued=5)
    claimed = store.claim(Stage.INIT, "n", 30)
    assert claimed is not None and claimed.job_id == "a"
    store.finish("a", "n", JobStatus.COMPLETED)
    store.cancel("b")
    assert store.claim(Stage.INIT, "n", 30) is not None  # c
    store.cancel("c")
    store.finish("c", "n", JobStatus.CANCELLED)
    assert store.cancel_group("g") == ["d"]
    assert [s.created for s in store.submit(_jobs("f", "g", "h", "i"), max_queued=5)] == [True] * 4
    with pytest.raises(QueueFullError, match="holds 5 unfinished"):
        store.submit(_jobs("j"), max_queued=5)
    clock.now += 100
    assert store.purge(finished_before=clock.now) == 4
    with pytest.raises(QueueFullError, match="holds 5 unfinished"):
        store.submit(_jobs("j"), max_queued=5)


def test_claims_follow_priority_then_age(store: Store) -> None:
    store.submit(_jobs("old"), max_queued=10)
    store.submit(_jobs("new"), max_queued=10)
    store.submit(_jobs("urgent", priority=5), max_queued=10)
    order = [store.claim(Stage.INIT, "node-1", 30) for _ in range(4)]
    assert [j.job_id if j else None for j in order] == ["urgent", "old", "new", None]
    claimed = store.get("old")
    assert claimed is not None
    assert (claimed.status, claimed.attempts, claimed.lease_owner) == (
        JobStatus.INITIALIZING,
        1,
        "node-1",
    )


@pytest.mark.parametrize("many", [None, 7], ids=["one at a time", "seven at a time"])
def test_claims_are_exclusive_across_connections(kit: StoreKit, many: int | None) -> None:
    kit.open().submit(_jobs(*(f"j{i}" for i in range(300))), max_queued=1000)
    got: list[str] = []
    lock = threading.Lock()

    def claimed(store: Store, node: str) -> list[JobRecord]:
        if many is not None:
            return store.claim_many(Stage.INIT, node, 30, many)
        job = store.claim(Stage.INIT, node, 30)
        return [] if job is None else [job]

    def worker(node: str) -> None:
        store = stores[node]  # its own connection, as another process would have
        while jobs := claimed(store, node):
            with lock:
                got.extend(job.job_id for job in jobs)

    stores = {f"node-{n}": kit.open(own_clock=False) for n in range(4)}
    threads = [threading.Thread(target=worker, args=(node,)) for node in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == sorted(f"j{i}" for i in range(300))


def test_a_claim_of_many_takes_them_in_order_each_leased(store: Store, clock: Clock) -> None:
    store.submit(_jobs("old", "mid", "new"), max_queued=10)
    store.submit(_jobs("urgent", priority=5), max_queued=10)
    first = store.claim_many(Stage.INIT, "node-1", 30, 3)
    assert [j.job_id for j in first] == ["urgent", "old", "mid"]
    for job in first:  # each as a claim of one leaves it, and as the store holds it
        assert (job.status, job.attempts, job.lease_owner) == (JobStatus.INITIALIZING, 1, "node-1")
        assert job.lease_expires == pytest.approx(clock.now + 30)
        assert store.get(job.job_id) == job
    assert [j.job_id for j in store.claim_many(Stage.INIT, "node-2", 30, 5)] == ["new"]
    assert store.claim_many(Stage.INIT, "node-2", 30, 5) == []
    clock.now += 31  # node-1's leases ran out: taken over, as second attempts
    again = store.claim_many(Stage.INIT, "node-2", 30, 2)
    assert [(j.job_id, j.attempts) for j in again] == [("urgent", 2), ("old", 2)]
    with pytest.raises(InvalidInputError, match="limit=0"):
        store.claim_many(Stage.INIT, "node-2", 30, 0)


def test_lease_expiry_heartbeat_and_takeover(store: Store, clock: Clock) -> None:
    store.submit(_jobs("a"), max_queued=10)
    assert store.claim(Stage.INIT, "node-1", 10) is not None
    clock.now += 8
    assert store.heartbeat(["a"], "node-1", 10) == []
    clock.now += 8  # renewed: still held
    assert store.claim(Stage.INIT, "node-2", 10) is None
    clock.now += 11  # expired, but nobody took it: a late heartbeat still renews it
    assert store.heartbeat(["a"], "node-1", 10) == []
    assert store.claim(Stage.INIT, "node-2", 10) is None
    clock.now += 11  # expired: another node takes it over, as a second attempt
    taken = store.claim(Stage.INIT, "node-2", 10)
    assert taken is not None and taken.attempts == 2
    assert store.heartbeat(["a"], "node-1", 10) == ["a"]  # node-1 must stop
    with pytest.raises(LeaseLostError):
        store.advance("a", "node-1", Stage.RUN)


def test_heartbeat_renews_many_and_names_only_what_must_stop(store: Store) -> None:
    ids = [f"j{i}" for i in range(1200)]  # more than one statement's worth
    store.submit(_jobs(*ids), max_queued=10_000)
    for _ in ids:
        store.claim(Stage.INIT, "n", 30)
    store.advance("j1", "n", Stage.RUN)  # between stages: neither renewed nor stopped
    store.finish("j2", "n", JobStatus.COMPLETED)
    store.cancel("j3")
    assert store.heartbeat(ids, "n", 30) == ["j3"]
    stop = store.heartbeat(ids, "other", 30)
    assert sorted(stop) == sorted(i for i in ids if i not in ("j1", "j2"))


def test_stages_carry_output_timing_and_stay_on_the_sandbox_node(store: Store) -> None:
    store.submit(_jobs("a"), max_queued=10)
    store.claim(Stage.INIT, "node-1", 30)
    store.advance("a", "node-1", Stage.RUN, timing={"init_s": 0.5})
    assert store.claim(Stage.RUN, "node-2", 30) is None  # the sandbox is on node-1
    run = store.claim(Stage.RUN, "node-1", 30)
    assert run is not None and run.status == JobStatus.RUNNING
    store.advance("a", "node-1", Stage.EVAL, output={"patch": "diff"}, timing={"run_s": 2.0})
    evaluation = store.claim(Stage.EVAL, "node-2", 30)  # eval runs anywhere, in a fresh sandbox
    assert evaluation is not None and evaluation.stage_output == {"patch": "diff"}
    store.finish("a", "node-2", JobStatus.COMPLETED, result={"reward": 1.0}, timing={"eval_s": 1.0})
    done = store.get("a")
    assert done is not None
    assert (done.status, done.result, done.stage_output) == (
        JobStatus.COMPLETED,
        {"reward": 1.0},
        None,
    )
    assert done.timing == {"init_s": 0.5, "run_s": 2.0, "eval_s": 1.0}
    with pytest.raises(LeaseLostError):
        store.finish("a", "node-2", JobStatus.FAILED)


def test_a_stage_handed_on_to_stay_is_claimed_by_its_node_only(store: Store) -> None:
    store.submit(_jobs("a"), max_queued=10)
    store.claim(Stage.INIT, "node-1", 30)
    store.advance("a", "node-1", Stage.RUN)
    store.claim(Stage.RUN, "node-1", 30)
    store.advance("a", "node-1", Stage.EVAL, output={"layer": "/l"}, stay=True)
    assert store.claim(Stage.EVAL, "node-2", 30) is None  # the layer is on node-1
    evaluation = store.claim(Stage.EVAL, "node-1", 30)
    assert evaluation is not None and evaluation.stage_output == {"layer": "/l"}


def test_a_stage_passed_on_is_held_by_the_same_owner(store: Store, clock: Clock) -> None:
    store.submit(_jobs("a"), max_queued=10)
    claimed = store.claim(Stage.INIT, "node-1", 30)
    assert claimed is not None
    clock.now += 1
    run = store.pass_on(claimed, "node-1", Stage.RUN, 30, timing={"init_s": 0.5})
    assert run is not None
    assert (run.stage, run.status, run.lease_owner, run.node, run.attempts) == (
        Stage.RUN,
        JobStatus.RUNNING,
        "node-1",
        "node-1",
        1,  # nothing started over
    )
    assert run.lease_expires == clock.now + 30
    assert run == store.get("a")  # the record returned is the job as stored
    assert store.claim(Stage.RUN, "node-1", 30) is None  # held already: not claimed twice
    assert store.heartbeat(["a"], "node-1", 30) == []
    evaluation = store.pass_on(
        run, "node-1", Stage.EVAL, 30, output={"patch": "diff"}, timing={"run_s": 2.0}
    )
    assert evaluation is not None and evaluation.stage_output == {"patch": "diff"}
    assert evaluation.timing == {"init_s": 0.5, "run_s": 2.0}
    assert (evaluation.stage, evaluation.status, evaluation.node) == (
        Stage.EVAL,
        JobStatus.EVALUATING,
        None,
    )
    assert evaluation == store.get("a")
    assert store.claim(Stage.EVAL, "node-2", 30) is None
    with pytest.raises(LeaseLostError):
        store.pass_on(evaluation, "node-2", Stage.EVAL, 30)
    clock.now += 31  # the lease ran out: another node takes the evaluation over
    taken = store.claim(Stage.EVAL, "node-2", 30)
    assert taken is not None and (taken.job_id, taken.attempts) == ("a", 2)
    store.finish("a", "node-2", JobStatus.COMPLETED, result={"reward": 1.0})
    done = store.get("a")
    assert done is not None and done.result == {"reward": 1.0}


def test_a_cancel_during_a_stage_ends_the_job_where_it_is_passed_on(store: Store) -> None:
    store.submit(_jobs("a"), max_queued=10)
    claimed = store.claim(Stage.INIT, "n", 30)
    assert claimed is not None
    store.cancel("a")
    assert store.pass_on(claimed, "n", Stage.RUN, 30) is None
    a = store.get("a")
    assert a is not None and (a.status, a.lease_owner) == (JobStatus.CANCELLED, None)


def test_results_feed_in_completion_order(store: Store) -> None:
    store.submit(_jobs("a", "b", "c"), max_queued=10)
    for _ in range(3):
        store.claim(Stage.INIT, "n", 30)
    for job_id in ("c", "a", "b"):
        store.finish(job_id, "n", JobStatus.COMPLETED, result={"id": job_id})
    first = store.results(after=0, limit=2)
    assert [r.job_id for r in first] == ["c", "a"]
    rest = store.results(after=first[-1].done_seq or 0, limit=10)
    assert [r.job_id for r in rest] == ["b"]
    assert store.results(after=rest[-1].done_seq or 0, limit=10) == []


def test_cancel_queued_at_once_running_by_flag(store: Store) -> None:
    store.submit(_jobs("q", "r", "s", group="g"), max_queued=10)
    store.claim(Stage.INIT, "n", 30)  # q is running
    assert store.cancel("r").status == JobStatus.CANCELLED
    running = store.cancel("q")
    assert running.status == JobStatus.INITIALIZING and running.cancel_requested
    assert store.heartbeat(["q"], "n", 30) == ["q"]  # the worker learns it must stop
    store.finish("q", "n", JobStatus.CANCELLED)
    assert sorted(store.cancel_group("g")) == ["s"]
    assert [r.job_id for r in store.results(0, 10)] == ["r", "q", "s"]
    with pytest.raises(JobNotFoundError):
        store.cancel("nope")


def test_infrastructure_retry_requeues(store: Store) -> None:
    store.submit(_jobs("a"), max_queued=10)
    store.claim(Stage.INIT, "n", 30)
    store.requeue("a", "n", Stage.INIT, error={"code": "sandbox_died"})
    again = store.claim(Stage.INIT, "n", 30)
    assert again is not None
    assert (again.attempts, again.error) == (2, {"code": "sandbox_died"})


def _claimed_id(store: Store, stage: Stage) -> str | None:
    job = store.claim(stage, "dead-node", 30)
    return job.job_id if job else None


def test_recover_after_a_crash(kit: StoreKit) -> None:
    before = kit.open()
    before.submit(_jobs("init", "waiting-run", "run", "eval", "queued"), max_queued=10)
    claimed = [before.claim(Stage.INIT, "dead-node", 30) for _ in range(4)]
    assert [j.job_id for j in claimed if j] == ["init", "waiting-run", "run", "eval"]
    before.advance("eval", "dead-node", Stage.RUN)
    assert _claimed_id(before, Stage.RUN) == "eval"
    before.advance("eval", "dead-node", Stage.EVAL, output={"patch": "p"})
    assert before.claim(Stage.EVAL, "dead-node", 30) is not None
    before.advance("run", "dead-node", Stage.RUN)
    assert _claimed_id(before, Stage.RUN) == "run"
    before.advance("waiting-run", "dead-node", Stage.RUN)  # init done, waiting for a run slot

    after = kit.open()  # another process, after a SIGKILL of the first
    released = after.recover(alive=lambda node: node != "dead-node")
    assert sorted(released) == ["eval", "init", "run", "waiting-run"]
    records = {j: after.get(j) for j in ("init", "waiting-run", "run", "eval", "queued")}
    stages = {j: r.stage for j, r in records.items() if r is not None}
    assert stages == {
        "init": Stage.INIT,
        "waiting-run": Stage.INIT,
        "run": Stage.INIT,
        "eval": Stage.EVAL,
        "queued": Stage.INIT,
    }
    evaluation = after.claim(Stage.EVAL, "new-node", 30)
    assert evaluation is not None and evaluation.stage_output == {"patch": "p"}
    after.close()


def test_retention_purges_old_results(store: Store, clock: Clock) -> None:
    store.submit(_jobs("old", "new"), max_queued=10)
    store.claim(Stage.INIT, "n", 30)
    store.finish("old", "n", JobStatus.COMPLETED)
    clock.now += 100
    store.claim(Stage.INIT, "n", 30)
    store.finish("new", "n", JobStatus.COMPLETED)
    assert store.purge(finished_before=clock.now - 50) == 1
    assert store.get("old") is None and store.get("new") is not None


def test_results_feed_goes_on_after_everything_was_purged(store: Store, clock: Clock) -> None:
    store.submit(_jobs("a", "b"), max_queued=10)
    for job_id in ("a", "b"):
        store.claim(Stage.INIT, "n", 30)
        store.finish(job_id, "n", JobStatus.COMPLETED)
    assert store.results_head() == 2
    clock.now += 100
    assert store.purge(finished_before=clock.now) == 2
    assert store.results_head() == 2
    store.submit(_jobs("c"), max_queued=10)
    store.claim(Stage.INIT, "n", 30)
    store.finish("c", "n", JobStatus.COMPLETED)
    assert [r.job_id for r in store.results(after=2, limit=10)] == ["c"]
    assert store.results_head() == 3


def test_backends_are_kept(kit: StoreKit) -> None:
    first = kit.open()
    first.save_backend("b1", {"id": "b1", "url": "http://a/v1"})
    first.save_backend("b2", {"id": "b2", "url": "http://b/v1"})
    first.save_backend("b1", {"id": "b1", "url": "http://c/v1"})  # re-registration replaces
    first.close()
    second = kit.open()
    assert {b["id"]: b["url"] for b in second.load_backends()} == {
        "b1": "http://c/v1",
        "b2": "http://b/v1",
    }
    assert second.delete_backend("b2") and not second.delete_backend("b2")
    assert [b["id"] for b in second.load_backends()] == ["b1"]
    second.close()


def test_jobs_survive_reopening(kit: StoreKit) -> None:
    first = kit.open()
    first.submit(_jobs("a"), max_queued=10)
    first.close()
    second = kit.open()
    job = second.get("a")
    assert job is not None and job.request == {"task": {"task_id": "a"}}
    second.close()


def test_a_cancel_during_a_stage_ends_the_job_at_its_next_step(store: Store, clock: Clock) -> None:
    store.submit(_jobs("a", "b"), max_queued=10)
    store.claim(Stage.INIT, "n", 10)
    store.claim(Stage.INIT, "gone", 10)
    store.cancel("a")
    store.cancel("b")
    assert store.advance("a", "n", Stage.RUN) is False  # ends instead of moving on
    a = store.get("a")
    assert a is not None and a.status == JobStatus.CANCELLED
    clock.now += 11  # b's worker died holding it: recovery ends it, nobody runs it
    assert store.claim(Stage.INIT, "n", 10) is None
    assert store.recover(lambda owner: owner != "gone") == ["b"]
    b = store.get("b")
    assert b is not None and b.status == JobStatus.CANCELLED


def test_a_retry_waits_out_its_backoff_in_the_store(store: Store, clock: Clock) -> None:
    store.submit(_jobs("a", "b"), max_queued=10)
    store.claim(Stage.INIT, "n", 30)
    store.requeue("a", "n", Stage.INIT, error={"code": "sandbox_died"}, delay_s=5)
    assert store.waiting() == {"init": 2}  # still queued, as a client sees it
    taken = store.claim(Stage.INIT, "n", 30)
    assert taken is not None and taken.job_id == "b"  # a is parked, b goes ahead
    assert store.claim(Stage.INIT, "n", 30) is None
    clock.now += 5
    again = store.claim(Stage.INIT, "n", 30)
    assert again is not None and (again.job_id, again.attempts) == ("a", 2)


def test_every_stage_that_starts_over_is_an_attempt(store: Store, clock: Clock) -> None:
    """Eval retried in eval, eval taken over after its lease ran out, eval released from a
    node that is gone: each shows in attempts, as the inits do."""
    store.submit(_jobs("a"), max_queued=10)
    store.claim(Stage.INIT, "n", 10)
    store.advance("a", "n", Stage.EVAL, output={"patch": "p"})
    first = store.claim(Stage.EVAL, "n", 10)
    assert first is not None and first.attempts == 1  # moving on is not starting over
    store.requeue("a", "n", Stage.EVAL, error={"code": "sandbox_died"})
    second = store.claim(Stage.EVAL, "n", 10)
    assert second is not None and second.attempts == 2 and second.stage_output == {"patch": "p"}
    clock.now += 11
    third = store.claim(Stage.EVAL, "m", 10)  # n's lease ran out: m takes it over
    assert third is not None and third.attempts == 3
    assert store.recover(lambda owner: owner != "m") == ["a"]
    fourth = store.claim(Stage.EVAL, "k", 10)
    assert fourth is not None and fourth.attempts == 4


def test_pauses_are_shared(kit: StoreKit) -> None:
    one, other = kit.open(), kit.open()
    one.save_pause("m", {"mode": "wait", "admission": True})
    assert other.load_pauses() == {"m": {"mode": "wait", "admission": True}}
    one.save_pause("m", {"mode": "abort", "admission": False})  # changed in place
    one.save_pause("n", {"mode": "wait", "admission": False})
    assert sorted(other.load_pauses()) == ["m", "n"]
    assert other.load_pauses()["m"]["mode"] == "abort"
    other.save_pause("m", None)
    other.save_pause("gone", None)  # not paused: nothing to do
    assert list(one.load_pauses()) == ["n"]


def test_the_service_ends_only_jobs_nobody_holds(store: Store, clock: Clock) -> None:
    """finish without an owner (the service's own) ends a queued job, or one whose lease ran
    out; never one a worker holds, and a finished job stays as it ended."""
    store.submit(_jobs("held", "queued"), max_queued=10)
    store.claim(Stage.INIT, "n", 10)
    store.finish("queued", None, JobStatus.CANCELLED)
    with pytest.raises(LeaseLostError):
        store.finish("held", None, JobStatus.FAILED)
    clock.now += 11
    store.finish("held", None, JobStatus.FAILED, error={"code": "node_gone"})
    store.finish("held", None, JobStatus.COMPLETED)  # already ended: nothing changes
    ended = {r.job_id: (r.status, r.error, r.lease_owner) for r in store.results(0, 10)}
    assert ended == {
        "queued": (JobStatus.CANCELLED, None, None),
        "held": (JobStatus.FAILED, {"code": "node_gone"}, None),
    }
    with pytest.raises(JobNotFoundError):
        store.finish("nope", None, JobStatus.FAILED)


def test_a_step_on_a_job_not_held_changes_nothing(store: Store) -> None:
    store.submit(_jobs("a"), max_queued=10)
    store.claim(Stage.INIT, "n", 30)
    store.append_event("a", 1, 0, {"messages": []})
    for job_id, owner, error in (("a", "other", LeaseLostError), ("nope", "n", JobNotFoundError)):
        with pytest.raises(error):
            store.advance(job_id, owner, Stage.RUN)
        with pytest.raises(error):
            store.requeue(job_id, owner, Stage.INIT)
        with pytest.raises(error):
            store.finish(job_id, owner, JobStatus.COMPLETED, result={})
    held = store.get("a")
    assert held is not None
    assert (held.stage, held.status, held.lease_owner) == (Stage.INIT, JobStatus.INITIALIZING, "n")
    assert len(store.events("a")) == 1  # a late finish with a result takes no events away


def test_a_cancel_during_a_stage_ends_a_retry_too(store: Store) -> None:
    store.submit(_jobs("a"), max_queued=10)
    store.claim(Stage.INIT, "n", 30)
    store.cancel("a")
    store.requeue("a", "n", Stage.INIT, error={"code": "sandbox_died"})
    [ended] = store.results(0, 10)
    assert (ended.job_id, ended.status, ended.lease_owner) == ("a", JobStatus.CANCELLED, None)
    assert store.claim(Stage.INIT, "n", 30) is None
