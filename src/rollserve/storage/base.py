"""The job store Protocol: durable jobs that workers claim stage by stage under a lease.

Every job moves through the stages ``init → run → eval → done``. A worker *claims* the next
job waiting for its stage and holds a *lease* on it, renewed by heartbeats; it then *advances*
the job to the next stage, *finishes* it, or *requeues* it after an infrastructure failure. A
lease that is not renewed expires and the job becomes claimable again, so that a dead worker —
or a dead node sharing the store — loses no job. Nothing in the store assumes it is the only
process using it: SQLite serialises writers, and PostgreSQL claims with
``SELECT … FOR UPDATE SKIP LOCKED``.

A *node* (one ``rollserve serve`` process) announces itself with the same heartbeat that
renews its leases; a node that stops beating is gone once its row expires, and any node's
``recover`` then hands its jobs — leased, or made and waiting for its run pool — to the others.
Time is the store's own (the database's clock on PostgreSQL), never a node's.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from rollserve.schema.api import JobQuery, JobsPage
from rollserve.schema.jobs import JobErrorInfo, JobRequest, JobStatus, RolloutResult
from rollserve.schema.run import RunOutput
from rollserve.storage.browse import JobEvent

__all__ = [
    "NODES_KEPT_S",
    "STAGE_STATUS",
    "BackendStore",
    "JobEvent",
    "JobRecord",
    "JobStatus",
    "JobStore",
    "NewJob",
    "NodeRecord",
    "Stage",
    "Store",
    "StoreEvent",
    "Submitted",
]


class Stage(enum.StrEnum):
    """Where a job is in the pipeline."""

    INIT = "init"
    RUN = "run"
    EVAL = "eval"
    DONE = "done"


class StoreEvent(enum.StrEnum):
    """What a store tells every node's :meth:`JobStore.subscribe` of, once a change commits."""

    INIT = "init"  # work for the init pool
    RUN = "run"  # work for the run pool
    EVAL = "eval"  # work for the eval pool
    DONE = "done"  # a job ended
    CANCEL = "cancel"  # a cancel came in for a job some node holds
    BACKENDS = "backends"  # the inference backends or their pauses changed
    ANY = "*"  # events may have been missed: look at everything


NODES_KEPT_S = 3600.0  # a dead node stays in the fleet's list this long, then recover drops it

# The status of a job waiting for, or held in, each stage.
STAGE_STATUS = {
    Stage.INIT: JobStatus.INITIALIZING,
    Stage.RUN: JobStatus.RUNNING,
    Stage.EVAL: JobStatus.EVALUATING,
}


@dataclass(frozen=True)
class NewJob:
    """A job as submitted: its id and the request, kept as the JSON the client sent."""

    job_id: str
    request: dict[str, Any]
    group_id: str | None = None
    priority: int = 0


@dataclass
class JobRecord:
    """One job as stored."""

    job_id: str
    group_id: str | None
    request: dict[str, Any]
    priority: int
    stage: Stage
    status: JobStatus
    attempts: int
    created: float
    updated: float
    lease_owner: str | None = None
    lease_expires: float | None = None
    node: str | None = None  # the run stage stays on the node whose init made the sandbox
    cancel_requested: bool = False
    stage_output: dict[str, Any] | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    timing: dict[str, float] = field(default_factory=dict)
    finished: float | None = None
    done_seq: int | None = None
    not_before: float | None = None  # a retry's backoff: not claimable before this time

    def job_request(self) -> JobRequest:
        """The request, as the client's model."""
        return JobRequest.model_validate(self.request)

    def rollout_result(self) -> RolloutResult | None:
        """The result of a completed job."""
        return RolloutResult.model_validate(self.result) if self.result else None

    def error_info(self) -> JobErrorInfo | None:
        """Why a job failed."""
        return JobErrorInfo.model_validate(self.error) if self.error else None

    def run_output(self) -> RunOutput | None:
        """What the run stage handed to evaluation, while the job is on its way there."""
        return RunOutput.from_json(self.stage_output) if self.stage_output else None


@dataclass(frozen=True)
class Submitted:
    """What a submit did with one job."""

    job_id: str
    status: JobStatus
    created: bool  # False: the id was known and the earlier job stands (idempotent submit)


@dataclass(frozen=True)
class NodeRecord:
    """One node of the fleet as its last heartbeat left it."""

    owner: str  # the lease owner: unique to one run of one process
    node_id: str  # the node's stable name (settings.node_id, default the host name)
    info: dict[str, Any]  # what the node reports: workers, load
    started: float
    seen: float
    alive: bool  # its heartbeat has not expired (by the store's clock)


class JobStore(Protocol):
    """Durable jobs with claim / lease / heartbeat semantics (see the module docstring)."""

    def submit(self, jobs: list[NewJob], *, max_queued: int) -> list[Submitted]:
        """Store new jobs, all or none; an already known ``job_id`` with the same request is
        returned as it is. Raises QueueFullError when the queue would exceed ``max_queued``
        and JobConflictError when a known id comes with another request."""
        ...

    def get(self, job_id: str) -> JobRecord | None: ...

    def claim(self, stage: Stage, owner: str, lease_s: float) -> JobRecord | None:
        """The next job waiting for ``stage`` (highest priority, then oldest), now leased to
        ``owner``; None when there is none. ``attempts`` counts every run of a stage that
        starts over: each init, and any stage taken over from an expired lease, released
        from a node that is gone, or requeued after a failure."""
        ...

    def claim_many(self, stage: Stage, owner: str, lease_s: float, limit: int) -> list[JobRecord]:
        """Up to ``limit`` jobs waiting for ``stage``, in :meth:`claim`'s order, each leased to
        ``owner`` as :meth:`claim` leases one, in one step: what a node's idle workers of a
        stage take together. Raises InvalidInputError for a ``limit`` below 1."""
        ...

    def heartbeat(
        self,
        job_ids: list[str],
        owner: str,
        lease_s: float,
        *,
        node: tuple[str, dict[str, Any]] | None = None,
    ) -> list[str]:
        """Renew ``owner``'s leases on ``job_ids`` — a lease that ran out is renewed too while
        nobody else took the job — and return the ids whose work must stop: another owner
        holds the job now, a cancel was requested (the worker then calls ``finish``), or the
        job already ended cancelled. Any other job between stages or done is neither renewed
        nor returned. ``node`` (its stable name and what it reports) keeps the owner's node row
        alive for ``lease_s`` as well."""
        ...

    def nodes(self) -> list[NodeRecord]:
        """The nodes that beat recently (dead ones stay listed for a while), oldest first."""
        ...

    def leave(self, owner: str) -> list[str]:
        """A node stops cleanly: every job it holds or keeps waiting for its run pool goes
        back to the queue at once (a job in eval stays in eval), and its row goes."""
        ...

    def subscribe(self, on_event: Callable[[StoreEvent], None]) -> Callable[[], None]:
        """Call ``on_event`` (from another thread) when any node changes a job: ``init`` or
        ``eval`` (work for that stage), ``done``, ``cancel``; ``*`` when events may have been
        missed. A store that cannot tell (SQLite) never calls it; nodes then poll. Returns
        the function that stops the subscription."""
        ...

    def advance(
        self,
        job_id: str,
        owner: str,
        stage: Stage,
        *,
        output: dict[str, Any] | None = None,
        timing: dict[str, float] | None = None,
        stay: bool = False,
    ) -> bool:
        """Hand the job to ``stage``, unleased; ``output`` is kept for the next stage. A job
        handed to ``run`` is claimable only by the same owner (its sandbox is there), and so is
        one handed on with ``stay`` (what the next stage needs is on that node: a kept layer).
        False: a cancel came during the stage, and the job is now cancelled instead."""
        ...

    def pass_on(
        self,
        job: JobRecord,
        owner: str,
        stage: Stage,
        lease_s: float,
        *,
        output: dict[str, Any] | None = None,
        timing: dict[str, float] | None = None,
        stay: bool = False,
    ) -> JobRecord | None:
        """:meth:`advance` and :meth:`claim` of the same job by the same owner in one step,
        for a node with a worker of ``stage`` free: the job is in ``stage``, leased to
        ``owner`` for ``lease_s`` (no attempt added: nothing starts over). ``job`` is the
        record its owner holds (from its claim or an earlier pass_on); the record returned is
        that job as passed on, without its request and output read back from the store.
        None: a cancel came during the stage, and the job is now cancelled instead."""
        ...

    def finish(
        self,
        job_id: str,
        owner: str | None,
        status: JobStatus,
        *,
        result: dict[str, Any] | None = None,
        error: dict[str, Any] | None = None,
        timing: dict[str, float] | None = None,
    ) -> None:
        """End the job (completed, failed or cancelled) and give it its place in the results
        feed. ``owner`` None ends an unleased job (a cancel of a queued job)."""
        ...

    def requeue(
        self,
        job_id: str,
        owner: str,
        stage: Stage,
        *,
        error: dict[str, Any] | None = None,
        delay_s: float = 0.0,
    ) -> None:
        """Give the job back, unleased, to wait for ``stage`` again (a retry), claimable once
        ``delay_s`` has passed: a backoff that holds neither a worker nor a lease."""
        ...

    def cancel(self, job_id: str) -> JobRecord:
        """Cancel a job: an unleased one ends at once; a leased one is flagged, and its
        worker ends it. A finished job is returned unchanged."""
        ...

    def cancel_group(self, group_id: str) -> list[str]:
        """Cancel what is left of a group; returns the ids it touched."""
        ...

    def results(self, after: int, limit: int) -> list[JobRecord]:
        """Finished jobs in completion order, after the cursor ``after`` (a done_seq)."""
        ...

    def recover(self, alive: Callable[[str], bool]) -> list[str]:
        """Release the jobs of owners that are gone — ``alive(owner)`` says no (a process of
        this host that died), or the owner's node row and the job's lease have both expired
        — and end those of them a client cancelled. Their sandboxes are gone too, so a job
        in ``init`` or ``run`` goes back to ``init``; ``eval`` stays. Returns the job ids
        released."""
        ...

    def purge(self, finished_before: float) -> int:
        """Forget finished jobs older than the retention; returns how many."""
        ...

    def waiting(self) -> dict[str, int]:
        """Jobs waiting for a worker, by stage (the queue depths)."""
        ...

    def counts(self) -> dict[str, int]:
        """Jobs by status."""
        ...

    def results_head(self) -> int:
        """The cursor of the latest finished job (0 before any): where a reader of the results
        feed starts to see only what finishes from now on."""
        ...

    def list_jobs(self, query: JobQuery) -> JobsPage:
        """A page of the jobs that match ``query``'s filters, in its order, with how many
        match in all; rows carry no trajectory."""
        ...

    def append_event(self, job_id: str, attempt: int, turn: int, data: dict[str, Any]) -> None:
        """Keep one event of a running episode (its turn ``turn`` of attempt ``attempt``).
        They go when the job ends with a result (which holds the whole trajectory), or when a
        job that ended without one is purged."""
        ...

    def events(self, job_id: str) -> list[JobEvent]:
        """The job's events, every attempt's, in the order they came."""
        ...

    def close(self) -> None: ...


class BackendStore(Protocol):
    """Registered inference backends, kept across restarts (and shared by the nodes of one
    store): a trainer registers its servers once, not once per rollserve process."""

    def save_backend(self, backend_id: str, spec: dict[str, Any]) -> None:
        """Insert or replace a backend's registration."""
        ...

    def load_backends(self) -> list[dict[str, Any]]:
        """Every registration, oldest first."""
        ...

    def delete_backend(self, backend_id: str) -> bool:
        """Forget a backend; False if it was not registered."""
        ...

    def save_pause(self, model: str, pause: dict[str, Any] | None) -> None:
        """Record that ``model`` is paused (how: mode, admission), or with None that it is
        not: every node of the store holds its calls alike."""
        ...

    def load_pauses(self) -> dict[str, dict[str, Any]]:
        """The paused models and how each is paused."""
        ...


class Store(JobStore, BackendStore, Protocol):
    """A job store that also keeps the inference backends: what a node runs on."""
