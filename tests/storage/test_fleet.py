"""What several nodes on one store rely on, over every store: node rows kept alive by the
heartbeat, a dead node's jobs recovered by expiry (not by PID), a clean leave handing jobs back
at once, and a results feed that concurrent finishers never make a reader skip."""

from __future__ import annotations

import threading

from rollserve.storage import JobStatus, NewJob, Stage
from tests.storage.conftest import StoreKit


def _jobs(*ids: str) -> list[NewJob]:
    return [NewJob(i, {"task": {"task_id": i}}) for i in ids]


def test_nodes_are_alive_while_they_beat(kit: StoreKit) -> None:
    store = kit.open()
    store.heartbeat([], "a@h1:1:1", 10, node=("h1", {"workers": {"run": [1, 4]}}))
    kit.clock.now += 5
    store.heartbeat([], "b@h2:1:1", 10, node=("h2", {}))
    assert [(n.node_id, n.alive) for n in store.nodes()] == [("h1", True), ("h2", True)]
    assert store.nodes()[0].info == {"workers": {"run": [1, 4]}}
    kit.clock.now += 7  # h1 stopped beating 12 s ago
    assert [(n.node_id, n.alive) for n in store.nodes()] == [("h1", False), ("h2", True)]


def test_a_silent_node_loses_its_jobs_by_expiry_on_any_host(kit: StoreKit) -> None:
    """The dead node runs on another machine: its PID means nothing here, so only the expiry
    of its node row and leases frees its jobs — including one made and waiting for its run pool
    (no lease of its own), which no other node may claim."""
    store = kit.open()
    store.submit(_jobs("init", "waiting-run", "eval"), max_queued=10)
    dead, live = "dead@far:7:7", "live@here:8:8"
    for _ in range(3):
        store.claim(Stage.INIT, dead, 10)
    store.advance("waiting-run", dead, Stage.RUN)
    store.advance("eval", dead, Stage.EVAL, output={"patch": "p"})
    store.claim(Stage.EVAL, dead, 10)
    store.heartbeat(["init", "eval"], dead, 10, node=("far", {}))
    other_host = lambda owner: True  # noqa: E731  (no PID to look at)
    kit.clock.now += 5
    store.heartbeat([], live, 10, node=("here", {}))
    assert store.recover(other_host) == []  # within its lease: nothing moves
    assert store.claim(Stage.RUN, live, 10) is None  # the sandbox is on the dead node
    kit.clock.now += 6
    store.heartbeat([], live, 10, node=("here", {}))
    assert sorted(store.recover(other_host)) == ["eval", "init", "waiting-run"]
    stages = {j: (r.stage, r.node) for j in ("init", "waiting-run", "eval") if (r := store.get(j))}
    assert stages == {
        "init": (Stage.INIT, None),
        "waiting-run": (Stage.INIT, None),
        "eval": (Stage.EVAL, None),
    }
    taken = store.claim(Stage.EVAL, live, 10)
    assert taken is not None and taken.stage_output == {"patch": "p"}


def test_a_node_that_leaves_hands_back_its_jobs_at_once(kit: StoreKit) -> None:
    store = kit.open()
    store.submit(_jobs("init", "waiting-run", "eval", "cancelled"), max_queued=10)
    node = "n@h:1:1"
    for _ in range(4):
        store.claim(Stage.INIT, node, 30)
    store.heartbeat([], node, 30, node=("h", {}))
    store.advance("waiting-run", node, Stage.RUN)
    store.advance("eval", node, Stage.EVAL, output={})
    store.claim(Stage.EVAL, node, 30)
    store.cancel("cancelled")
    assert sorted(store.leave(node)) == ["cancelled", "eval", "init", "waiting-run"]
    assert store.nodes() == []
    statuses = {
        j: r.status for j in ("init", "waiting-run", "eval", "cancelled") if (r := store.get(j))
    }
    assert statuses == {
        "init": JobStatus.QUEUED,
        "waiting-run": JobStatus.QUEUED,
        "eval": JobStatus.EVALUATING,
        "cancelled": JobStatus.CANCELLED,
    }
    assert store.claim(Stage.INIT, "other@h:2:2", 30) is not None  # no wait for an expiry


def test_the_feed_never_lets_a_reader_skip_a_result(kit: StoreKit) -> None:
    """Four writers finish 400 jobs while a reader follows the feed from its cursor: it sees
    each job once, in cursor order, none passed over by a later one committed first."""
    kit.open().submit(_jobs(*(f"j{i}" for i in range(400))), max_queued=1000)
    writers = [kit.open(own_clock=False) for _ in range(4)]
    reader = kit.open(own_clock=False)
    seen: list[str] = []
    done = threading.Event()

    def write(store_index: int) -> None:
        store = writers[store_index]
        owner = f"w{store_index}"
        while (job := store.claim(Stage.INIT, owner, 30)) is not None:
            store.finish(job.job_id, owner, JobStatus.COMPLETED, result={})

    def read() -> None:
        cursor = 0
        while True:
            finished = done.is_set()
            page = reader.results(after=cursor, limit=50)
            seen.extend(r.job_id for r in page)
            if page:
                assert [r.done_seq for r in page] == sorted(r.done_seq or 0 for r in page)
                cursor = page[-1].done_seq or cursor
            elif finished:
                return

    threads = [threading.Thread(target=write, args=(i,)) for i in range(4)]
    follower = threading.Thread(target=read)
    follower.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    follower.join()
    assert sorted(seen) == sorted(f"j{i}" for i in range(400))
    assert len(seen) == len(set(seen))
