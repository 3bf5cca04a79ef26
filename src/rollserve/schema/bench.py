"""Figures printed by ``rollserve bench``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

ShellMethod = Literal["pty", "tmux", "bash_c"]


class ShellBenchResult(BaseModel):
    """Latency of trivial commands by one method in one backend."""

    model_config = ConfigDict(extra="forbid")

    backend: str
    method: ShellMethod
    p50_ms: float
    p99_ms: float
    n: int


RoutingPolicy = Literal["router", "assignment"]


class RoutingRun(BaseModel):
    """One routing policy over one set of emulated backends."""

    model_config = ConfigDict(extra="forbid")

    policy: RoutingPolicy
    rollouts: int
    seconds: float
    rollouts_per_s: float
    calls: dict[str, int]  # model calls answered, by backend


class RoutingCase(BaseModel):
    """Both policies over the same backends and the same rollouts; ``ratio`` is the router's
    throughput over the assignment counter's."""

    model_config = ConfigDict(extra="forbid")

    name: str
    slowdown: float  # per-token time of the slow backend over the fast one's
    router: RoutingRun
    assignment: RoutingRun
    ratio: float


class RouterBenchResult(BaseModel):
    """``rollserve bench router``: the workload and its cases."""

    model_config = ConfigDict(extra="forbid")

    sessions: int  # rollouts running at once
    turns: int
    rollouts: int
    tokens_per_turn: int
    fast_ms_per_token: float
    slots: int  # calls each emulated server runs at once; the rest queue
    tool_ms: float  # time between turns (the tool runs in the sandbox)
    cases: list[RoutingCase]


class Quantiles(BaseModel):
    """Median and 99th percentile of ``n`` samples, in milliseconds."""

    model_config = ConfigDict(extra="forbid")

    p50_ms: float
    p99_ms: float
    n: int


PipelineMode = Literal["pipeline", "coupled", "sync"]


class ModeFigures(BaseModel):
    """``rollserve bench pipeline``: one way of running the same rollouts with ``slots``
    model slots. Latency runs from the start of a job's first stage to its result."""

    model_config = ConfigDict(extra="forbid")

    mode: PipelineMode
    rollouts: int
    completed: int  # ended with reward 1, as the script makes every rollout succeed
    failed: int  # failed, or completed with another reward
    seconds: float
    rollouts_per_s: float
    p50_s: float
    p99_s: float
    slot_idle_fraction: float  # of slots x seconds, the share no model call was generating
    model_calls: int
    peak_sandboxes: int  # live sandboxes at most, at any moment
    workers: dict[str, int]  # pool sizes (pipeline: init, run, eval; otherwise: workers)


class PipelineBenchResult(BaseModel):
    """``rollserve bench pipeline --json``: the three modes and the pipeline's speed-ups."""

    model_config = ConfigDict(extra="forbid")

    modes: dict[PipelineMode, ModeFigures]
    speedup_vs_coupled: float
    speedup_vs_sync: float


class OverheadBenchResult(BaseModel):
    """``rollserve bench overhead``: rollserve's own cost per turn and per job."""

    model_config = ConfigDict(extra="forbid")

    turn: Quantiles  # one agent turn: instant model call + ``true`` in the sandbox's shell
    turn_without_command: Quantiles  # the same loop with a tool call that runs nothing
    shell: Quantiles  # ``true`` in a persistent shell on its own (ShellSession.run)
    overhead_per_turn_p50_ms: float  # turn p50 minus shell p50
    job: Quantiles  # submit to completed through the scheduler, one job at a time
    job_stages_p50_ms: dict[str, float]  # init, run, eval and the rest (store, queues)
    job_turns: int  # model calls in each of those jobs


class ScaleStep(BaseModel):
    """``rollserve bench scale``: ``rollouts`` light rollouts held open at once."""

    model_config = ConfigDict(extra="forbid")

    rollouts: int
    concurrent: int  # rollouts in their run stage, sandbox and shell live, at the same time
    completed: int
    errors: int  # failed jobs, wrong rewards, failed tool calls, jobs run again
    retried: int  # jobs run more than once (a lease lost while the node was overloaded)
    seconds: float
    rollouts_per_s: float
    p50_s: float
    p99_s: float
    turn_p50_ms: float  # a turn without the model's own latency: tool call and agent loop
    turn_p99_ms: float
    close_p50_ms: float  # a probe sandbox's close, ``rollouts`` others live, the loop idle
    close_p99_ms: float
    busy_close_p50_ms: float  # the rollouts' own closes, amid the step's load
    busy_close_p99_ms: float
    peak_sandboxes: int
    processes: int  # rollserve's process tree with every sandbox and shell live
    rss_mib: float  # summed over the tree (shared pages counted in every process)
    pss_mib: float  # proportional set size: shared pages split among their users


class ScaleBenchResult(BaseModel):
    """``rollserve bench scale --json``: each step, and the largest one without errors."""

    model_config = ConfigDict(extra="forbid")

    user: str  # the user the service and its sandboxes ran as
    turns: int
    model_latency_ms: float
    nofile_limit: int
    steps: list[ScaleStep]
    max_sustained: int


class ImageStartFigures(BaseModel):
    """``rollserve bench images``: starts of a sandbox whose workspace is a repository inside
    the image (``/testbed``), from ``start()`` to the first command's result in its shell.
    ``first_start_ms`` includes converting the image into an empty cache (none for images a
    backend runs as they are); warm starts find it in the cache."""

    model_config = ConfigDict(extra="forbid")

    user: str  # the user the sandboxes ran as
    backend: str
    image_kind: str
    files: int  # files in the image's repository
    first_start_ms: float
    warm_start_p50_ms: float
    warm_start_p99_ms: float
    starts: int
    workspace: str  # how /testbed was made writable (overlay or copy)


class WorkspaceFigures(BaseModel):
    """The per-start cost of a writable ``/testbed``, alone."""

    model_config = ConfigDict(extra="forbid")

    user: str
    mode: str
    files: int
    p50_ms: float
    n: int


class LayerFigures(BaseModel):
    """A writable root (start to first command), the close that keeps its layer with
    ``written_mb`` written, and a start over that layer (to first command)."""

    model_config = ConfigDict(extra="forbid")

    user: str
    backend: str
    written_mb: int
    start_p50_ms: float
    keep_p50_ms: float
    start_over_layer_p50_ms: float
    n: int


class ImagesBenchResult(BaseModel):
    """``rollserve bench images``: per image kind and backend, and one new image wanted by
    many jobs at once (``conversions`` should be 1)."""

    model_config = ConfigDict(extra="forbid")

    results: list[ImageStartFigures]
    workspace: list[WorkspaceFigures]
    layers: list[LayerFigures] = Field(default_factory=list)
    concurrent_first_uses: int
    conversions: int
    concurrent_seconds: float


class StoreStep(BaseModel):
    """One client count of ``rollserve bench store``."""

    model_config = ConfigDict(extra="forbid")

    clients: int  # threads, each with its own connection, as that many nodes would have
    lifecycles: int
    seconds: float
    lifecycles_per_s: float
    claim_p50_ms: float
    claim_p99_ms: float
    missed_claims: int  # claims that found nothing (other clients had taken the jobs)
    client_cpu_ms: float  # CPU of the clients' process per lifecycle
    server_cpu_ms: float | None = None  # CPU of a throwaway server per lifecycle
    # pgbench running the same statements as many clients (PostgreSQL only), and the share of
    # its lifecycles/s the store reaches.
    pgbench_lifecycles_per_s: float | None = None
    ratio: float | None = None


class StoreBenchResult(BaseModel):
    """The job store's own capacity: full job lifecycles per second (submit, claim init, pass
    on to run, pass on to eval, heartbeat, finish), beside pgbench's on PostgreSQL. A client
    takes ``batch`` jobs a round: submitted together, claimed in one statement, their leases
    renewed by one heartbeat."""

    model_config = ConfigDict(extra="forbid")

    store: str  # the URL's scheme: which store was measured
    server: str  # "throwaway" (started by the bench on this machine) or "given"
    cpus: int
    results: list[StoreStep]
    per_node_rate: float  # lifecycles per second one node needs (its rollouts per second)
    nodes_served: int  # nodes at that rate one store serves, from the best step
    # The size of each job's request text and of the run output handed to evaluation.
    request_bytes: int = 0
    output_bytes: int = 0
    batch: int = 1


class NodesStep(BaseModel):
    """One configuration of ``rollserve bench nodes``."""

    model_config = ConfigDict(extra="forbid")

    store: str
    nodes: int
    rollouts: int
    completed: int
    errors: int  # rollouts that did not complete
    duplicate_runs: int  # rollouts whose episode the model saw played more than once
    retried: int  # rollouts with more than one attempt
    seconds: float
    rollouts_per_s: float
    turn_gap_p50_ms: float  # from a model answer to the rollout's next call
    turn_gap_p99_ms: float


class NodesBenchResult(BaseModel):
    """One light workload through 1, 2, 4 nodes on PostgreSQL and 1 node on SQLite."""

    model_config = ConfigDict(extra="forbid")

    rollouts: int
    turns: int
    model_ms: float
    cpus: int
    steps: list[NodesStep]


class SoakSample(BaseModel):
    """The server's resources when ``done`` rollouts had ended."""

    model_config = ConfigDict(extra="forbid")

    done: int
    seconds: float
    fds: int  # open file descriptors of the server process
    threads: int
    rss_mib: float
    processes: int  # the server's descendants (sandboxes and their shells)
    sandbox_dirs: int  # entries of the sandbox state directory


class SoakBenchResult(BaseModel):
    """``rollserve bench soak``: many short rollouts of mixed outcomes through one server,
    its resources sampled as they end; the drift is from the server idle after the warm-up
    (a fifth of the rollouts) to the server idle at the end, in percent."""

    model_config = ConfigDict(extra="forbid")

    rollouts: int
    seconds: float
    rollouts_per_s: float
    outcomes: dict[str, int]  # by kind: rewarded, unrewarded, max_turns, retried, failed, ...
    statuses: dict[str, int]  # jobs by final status
    attempts: dict[str, int]  # by kind, the most attempts one rollout of it took
    lost: int  # submitted but never in the results feed
    duplicates: int  # in the results feed more than once
    samples: list[SoakSample]  # as rollouts end, work in flight
    warm: SoakSample  # idle, after the warm-up
    end: SoakSample  # idle, at the end
    drift_pct: dict[str, float]  # fds, threads, rss_mib, processes: end against warm
    sandbox_dirs_left: int  # once every rollout has ended
    processes_left: int


class ViewerPage(BaseModel):
    """One page the viewer asks for, asked ``n`` times: its server time (``Server-Timing``)
    and round trip on this machine, in milliseconds."""

    model_config = ConfigDict(extra="forbid")

    name: str
    path: str
    total: int | None = None  # jobs matching, for a jobs page
    server_ms_p50: float
    server_ms_max: float
    roundtrip_ms_p50: float
    n: int


class ViewerBenchResult(BaseModel):
    """``rollserve bench viewer``: the web viewer's pages over a store of many jobs."""

    model_config = ConfigDict(extra="forbid")

    jobs: int
    store: str
    fill_s: float
    pages: list[ViewerPage]
    goal_ms: float


class GatewayBenchRow(BaseModel):
    """One concurrency of ``rollserve bench gateway``: per-call latency straight to the
    backend and through the gateway, in milliseconds."""

    model_config = ConfigDict(extra="forbid")

    concurrency: int
    calls: int
    direct_p50_ms: float
    direct_p99_ms: float
    gateway_p50_ms: float
    gateway_p99_ms: float
    overhead_p50_ms: float
    overhead_p99_ms: float


class GatewayBenchResult(BaseModel):
    """``rollserve bench gateway``."""

    model_config = ConfigDict(extra="forbid")

    turns: int
    generation_ms: float = Field(
        description="how long the backend takes per call, on both paths (0: at once)"
    )
    results: list[GatewayBenchRow]
    goal_overhead_p50_ms: float
