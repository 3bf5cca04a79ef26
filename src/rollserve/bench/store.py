"""``rollserve bench store``: how many job lifecycles per second the job store carries.

Each client is a thread with its own store object (its own connections), as a node would be;
a lifecycle is what the scheduler asks of the store for one job where its workers are free,
in rounds of ``batch`` jobs: the round's jobs are submitted together and the node's idle init
workers claim them in one statement (perhaps another client's), each is passed on to run and
to eval, one heartbeat renews the node's leases, and each finishes. Without
``--store-url`` the bench starts a throwaway PostgreSQL server on this machine (clients and
server then share its cores) and measures that; the CPU each side spends per lifecycle says
where the ceiling is (the cores divided by their sum). On PostgreSQL, each client count is
also run by pgbench with the same statements (:mod:`rollserve.bench.pgbench`), against the
same database: ``ratio`` is how much of that the store reaches. Each run starts from a
vacuumed jobs table.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from rich.table import Table

from rollserve.bench.stats import quantile
from rollserve.errors import InvalidInputError
from rollserve.schema.bench import StoreBenchResult, StoreStep
from rollserve.settings import Settings
from rollserve.storage.base import JobRecord, JobStatus, NewJob, Stage, Store
from rollserve.storage.registry import open_store

CLIENTS = (1, 4, 16)
BATCH = 8  # jobs a round carries: a GRPO group of 8, say, taken by 8 idle workers


@dataclass
class _Client:
    store: Store
    owner: str
    text: str = ""  # the request's text (a task's problem statement)
    output: dict[str, str] = field(default_factory=lambda: {"text": ""})  # what run hands on
    claims: list[float] = field(default_factory=list)
    missed: int = 0
    done: int = 0

    def _claim(self, limit: int) -> list[JobRecord]:
        started = time.perf_counter()
        jobs = self.store.claim_many(Stage.INIT, self.owner, 60, limit)
        self.claims.append(time.perf_counter() - started)
        if not jobs:
            self.missed += 1
        return jobs

    def run(self, until: float, batch: int) -> None:
        """Rounds of ``batch`` lifecycles until the deadline. Init is claimed from the shared
        queue, so a client may carry another's jobs on: what counts is the jobs finished."""
        while time.perf_counter() < until:
            jobs = []
            for _ in range(batch):
                job_id = f"{self.owner}-{uuid.uuid4().hex[:8]}"
                jobs.append(NewJob(job_id, {"task": {"task_id": job_id, "text": self.text}}))
            self.store.submit(jobs, max_queued=10**9)
            runs = [
                self.store.pass_on(job, self.owner, Stage.RUN, 60, timing={})
                for job in self._claim(batch)
            ]
            evals = [
                self.store.pass_on(run, self.owner, Stage.EVAL, 60, output=self.output)
                for run in runs
                if run is not None
            ]
            held = [job.job_id for job in evals if job is not None]
            self.store.heartbeat(held, self.owner, 60)
            for job_id in held:
                self.store.finish(job_id, self.owner, JobStatus.COMPLETED, result={})
            self.done += len(held)


def _step(
    opener: Callable[[], Store],
    clients: int,
    seconds: float,
    server_cpu: Callable[[], float] | None,
    sizes: tuple[int, int],
    batch: int,
) -> StoreStep:
    text, output = "x" * sizes[0], {"text": "x" * sizes[1]}
    workers = [_Client(opener(), f"bench-{clients}-{i}", text, output) for i in range(clients)]
    for worker in workers:  # every connection open before the clock starts
        worker.store.results_head()
    until = time.perf_counter() + seconds
    started = time.perf_counter()
    cpu = time.process_time()
    server = server_cpu() if server_cpu else 0.0
    threads = [threading.Thread(target=w.run, args=(until, batch)) for w in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu
    server = server_cpu() - server if server_cpu else 0.0  # before the backends exit
    for worker in workers:
        worker.store.close()
    claims = [c for w in workers for c in w.claims]
    done = sum(w.done for w in workers)
    return StoreStep(
        clients=clients,
        lifecycles=done,
        seconds=round(elapsed, 3),
        lifecycles_per_s=round(done / elapsed, 1),
        claim_p50_ms=round(quantile(claims, 0.5) * 1000, 3),
        claim_p99_ms=round(quantile(claims, 0.99) * 1000, 3),
        missed_claims=sum(w.missed for w in workers),
        client_cpu_ms=round(cpu / max(done, 1) * 1000, 3),
        server_cpu_ms=round(server / max(done, 1) * 1000, 3) if server_cpu else None,
    )


def _with_baseline(
    step: StoreStep, url: str, seconds: float, sizes: tuple[int, int], batch: int
) -> StoreStep:
    """The step with pgbench's run of the same lifecycles, as many clients, on the same
    database."""
    from rollserve.bench.pgbench import run_pgbench  # psycopg: only for a PostgreSQL store

    rate = run_pgbench(url, step.clients, seconds, *sizes, batch=batch).lifecycles_per_s
    return step.model_copy(
        update={
            "pgbench_lifecycles_per_s": round(rate, 1),
            "ratio": round(step.lifecycles_per_s / rate, 3) if rate > 0 else None,
        }
    )


def bench_store(
    store_url: str | None,
    seconds: float = 5.0,
    per_node_rate: float = 25.0,
    *,
    request_bytes: int = 0,
    output_bytes: int = 0,
    batch: int = BATCH,
) -> StoreBenchResult:
    """Each client count of CLIENTS for ``seconds``, on the given store or a throwaway
    PostgreSQL server, in rounds of ``batch`` jobs; each job's request carries
    ``request_bytes`` of text and its run hands ``output_bytes`` on to evaluation."""
    if request_bytes < 0 or output_bytes < 0:
        raise InvalidInputError("request_bytes and output_bytes cannot be negative")
    if batch < 1:
        raise InvalidInputError(f"a round carries at least 1 job, not batch={batch}")
    sizes = (request_bytes, output_bytes)
    server = None
    if store_url is None:
        from rollserve.fixtures.postgres import TempPostgres

        server = TempPostgres().start()
        store_url = server.create("bench")
    try:
        settings = Settings(store_url=store_url, store_pool_size=2)
        open_store(settings).close()  # schema made once, before the clients race to it
        cpu = server.cpu_seconds if server is not None else None
        results = []
        postgres = store_url.startswith(("postgres://", "postgresql://"))
        if postgres:
            from rollserve.bench.pgbench import vacuum
        for n in CLIENTS:
            if postgres:
                vacuum(store_url)
            step = _step(lambda: open_store(settings), n, seconds, cpu, sizes, batch)
            if postgres:
                vacuum(store_url)
                step = _with_baseline(step, store_url, seconds, sizes, batch)
            results.append(step)
    finally:
        if server is not None:
            server.close()
    best = max(r.lifecycles_per_s for r in results)
    return StoreBenchResult(
        store=store_url.partition("://")[0],
        server="throwaway" if server is not None else "given",
        cpus=os.cpu_count() or 1,
        results=results,
        per_node_rate=per_node_rate,
        nodes_served=int(best // per_node_rate),
        request_bytes=request_bytes,
        output_bytes=output_bytes,
        batch=batch,
    )


def store_table(result: StoreBenchResult) -> Table:
    table = Table(title=f"job store ({result.store}, {result.server} server, {result.cpus} CPUs)")
    columns = ("clients", "lifecycles/s", "pgbench/s", "ratio", "claim p50 ms", "claim p99 ms")
    for column in (*columns, "missed claims", "client CPU ms", "server CPU ms"):
        table.add_column(column, justify="right")
    for r in result.results:
        table.add_row(
            str(r.clients),
            f"{r.lifecycles_per_s:.0f}",
            "-" if r.pgbench_lifecycles_per_s is None else f"{r.pgbench_lifecycles_per_s:.0f}",
            "-" if r.ratio is None else f"{r.ratio:.2f}",
            f"{r.claim_p50_ms:.2f}",
            f"{r.claim_p99_ms:.2f}",
            str(r.missed_claims),
            f"{r.client_cpu_ms:.2f}",
            "-" if r.server_cpu_ms is None else f"{r.server_cpu_ms:.2f}",
        )
    table.caption = (
        f"one store serves {result.nodes_served} nodes of {result.per_node_rate:.0f} rollouts/s;"
        f" rounds of {result.batch} jobs; CPU per lifecycle"
    )
    return table
