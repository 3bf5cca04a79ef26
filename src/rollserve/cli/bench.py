"""``rollserve bench``: the benchmarks (figures, not tests); BENCHMARKS.md records them."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from rollserve.bench.gateway import bench_gateway, gateway_table
from rollserve.bench.images import KINDS, bench_images, images_table
from rollserve.bench.nodes import bench_nodes, nodes_table
from rollserve.bench.overhead import OverheadWorkload, bench_overhead, overhead_table
from rollserve.bench.pipeline import PipelineWorkload, bench_pipeline, pipeline_table
from rollserve.bench.router import Workload, bench_router, router_table
from rollserve.bench.scale import ScaleWorkload, bench_scale, scale_table
from rollserve.bench.shell import bench_shell
from rollserve.bench.soak import bench_soak, soak_table
from rollserve.bench.store import BATCH, bench_store, store_table
from rollserve.bench.viewer import bench_viewer, viewer_table
from rollserve.cli.learn import learn_cmd
from rollserve.cli.options import DataDir, settings_for, with_manager
from rollserve.sandbox import SandboxManager

bench_app = typer.Typer(help="Benchmarks (figures, not tests).", no_args_is_help=True)


@bench_app.command("shell")
def bench_shell_cmd(
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
    n: Annotated[int, typer.Option("--n", min=10, help="commands per method")] = 200,
    backend: Annotated[list[str] | None, typer.Option(help="only these backends")] = None,
    data_dir: DataDir = None,
) -> None:
    """Trivial-command latency: persistent PTY vs tmux polling vs a new bash -c."""
    settings = settings_for(data_dir)

    async def work(manager: SandboxManager):  # type: ignore[no-untyped-def]
        names = backend or manager.backends.names()
        return await bench_shell(manager, names, n=n, tmux_n=max(10, n // 2))

    results = asyncio.run(with_manager(settings, work))
    if as_json:
        typer.echo(json.dumps({"results": [r.model_dump() for r in results]}, indent=2))
        return
    table = Table("backend", "method", "p50 ms", "p99 ms", "n", "p50 vs pty")
    pty = {r.backend: r.p50_ms for r in results if r.method == "pty"}
    for r in results:
        ratio = r.p50_ms / pty[r.backend] if pty.get(r.backend) else float("nan")
        table.add_row(
            r.backend, r.method, f"{r.p50_ms:.3f}", f"{r.p99_ms:.3f}", str(r.n), f"{ratio:.1f}x"
        )
    Console().print(table)


@bench_app.command("images")
def bench_images_cmd(
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
    files: Annotated[int, typer.Option("--files", min=1, help="files in /testbed")] = 5000,
    starts: Annotated[int, typer.Option("--starts", min=3, help="warm starts per case")] = 10,
    concurrent: Annotated[
        int, typer.Option("--concurrent", min=2, help="sandboxes wanting one new image")
    ] = 50,
    backend: Annotated[list[str] | None, typer.Option(help="only these backends")] = None,
    kind: Annotated[list[str] | None, typer.Option(help=f"only these of {KINDS}")] = None,
    user: Annotated[
        str | None,
        typer.Option(help="as root: measure the same images again as this ordinary user"),
    ] = None,
    image: Annotated[
        list[str] | None,
        typer.Option(help="KIND=REF: measure this image for KIND instead of building one"),
    ] = None,
    data_dir: DataDir = None,
) -> None:
    """SWE-image starts: first (converted) and warm, per image kind and backend; the cost of a
    writable /testbed; one new image wanted by many sandboxes at once; each row says whose
    (``--user``: root's, then the user's, in the same run)."""
    settings = settings_for(data_dir)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    images = None
    if image:
        pairs = [i.partition("=") for i in image]
        bad = [i for i, (k, eq, ref) in zip(image, pairs, strict=True) if k not in KINDS or not ref]
        if bad:
            raise typer.BadParameter(
                f"{bad}: not KIND=REF with KIND one of {KINDS}", param_hint="--image"
            )
        images = {k: ref for k, _, ref in pairs}
    result = asyncio.run(
        bench_images(
            settings,
            backend or ["bwrap", "apptainer"],
            files=files,
            starts=starts,
            concurrent=concurrent,
            kinds=tuple(kind or KINDS),
            images=images,
            user=user,
        )
    )
    if as_json:
        typer.echo(result.model_dump_json(indent=2))
        return
    console = Console()
    console.print(images_table(result))
    for w in result.workspace:
        console.print(f"writable /testbed by {w.mode}: {w.p50_ms:.1f} ms p50 ({w.files} files)")
    for lf in result.layers:
        console.print(
            f"writable root on {lf.backend} ({lf.user}): start {lf.start_p50_ms:.1f} ms, keep "
            f"its layer ({lf.written_mb} MB) {lf.keep_p50_ms:.1f} ms, start over it "
            f"{lf.start_over_layer_p50_ms:.1f} ms (p50)"
        )
    console.print(
        f"{result.concurrent_first_uses} concurrent first uses: {result.conversions} "
        f"conversion(s) in {result.concurrent_seconds:.1f}s"
    )


@bench_app.command("router")
def bench_router_cmd(
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
    sessions: Annotated[int, typer.Option("--sessions", min=1, help="rollouts at a time")] = 64,
    turns: Annotated[int, typer.Option("--turns", min=1, help="model calls per rollout")] = 4,
    rollouts: Annotated[
        int | None, typer.Option("--rollouts", min=1, help="rollouts in all (4 x sessions)")
    ] = None,
    slowdown: Annotated[
        float, typer.Option("--slowdown", min=1.0, help="the slow server's time per token, x")
    ] = 5.0,
) -> None:
    """Load-aware routing vs ProRL Agent's assignment counter, on emulated servers."""
    workload = Workload(sessions=sessions, turns=turns, rollouts=rollouts or 4 * sessions)
    result = asyncio.run(bench_router(workload, slowdown=slowdown))
    if as_json:
        typer.echo(result.model_dump_json(indent=2))
        return
    Console().print(router_table(result))


@bench_app.command("pipeline")
def bench_pipeline_cmd(
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
    rollouts: Annotated[int, typer.Option("--rollouts", min=1, help="rollouts in all")] = 128,
    slots: Annotated[int, typer.Option("--slots", min=1, help="model slots (all modes)")] = 8,
    turns: Annotated[int, typer.Option("--turns", min=1, help="model calls per rollout")] = 6,
    model_ms: Annotated[float, typer.Option("--model-ms", min=0.0, help="per model call")] = 150,
    init_ms: Annotated[float, typer.Option("--init-ms", min=0.0, help="setup, median")] = 150,
    eval_ms: Annotated[float, typer.Option("--eval-ms", min=0.0, help="evaluation, median")] = 400,
    eval_sigma: Annotated[float, typer.Option("--eval-sigma", min=0.0, help="lognormal")] = 1.0,
    init_workers: Annotated[int | None, typer.Option(min=1, help="default slots/2")] = None,
    eval_workers: Annotated[int | None, typer.Option(min=1, help="default 2 x slots")] = None,
    seed: Annotated[int, typer.Option("--seed")] = 0,
) -> None:
    """Pipelined stages vs rollouts holding their model slot (coupled, batch-synchronous)."""
    workload = PipelineWorkload(
        rollouts=rollouts,
        slots=slots,
        turns=turns,
        model_ms=model_ms,
        init_ms=init_ms,
        eval_ms=eval_ms,
        eval_sigma=eval_sigma,
        init_workers=init_workers,
        eval_workers=eval_workers,
        seed=seed,
    )
    result = asyncio.run(bench_pipeline(workload))
    if as_json:
        typer.echo(result.model_dump_json(indent=2))
        return
    Console().print(pipeline_table(result, workload))


@bench_app.command("overhead")
def bench_overhead_cmd(
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
    turns: Annotated[int, typer.Option("--turns", min=4, help="model calls per rollout")] = 100,
    rollouts: Annotated[int, typer.Option("--rollouts", min=1, help="rollouts timed")] = 5,
    jobs: Annotated[int, typer.Option("--jobs", min=1, help="jobs timed, one at a time")] = 40,
) -> None:
    """rollserve's own cost per agent turn and per job, with an instant model."""
    workload = OverheadWorkload(turns=turns, rollouts=rollouts, shell_n=100 * rollouts, jobs=jobs)
    result = asyncio.run(bench_overhead(workload))
    if as_json:
        typer.echo(result.model_dump_json(indent=2))
        return
    Console().print(overhead_table(result))


@bench_app.command("scale")
def bench_scale_cmd(
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
    max_rollouts: Annotated[int, typer.Option("--max", min=1, help="the last step")] = 800,
    turns: Annotated[int, typer.Option("--turns", min=2, help="model calls per rollout")] = 4,
    model_ms: Annotated[float, typer.Option("--model-ms", min=0.0, help="per model call")] = 500,
) -> None:
    """Concurrent light rollouts, stepped up to --max: errors, latency, memory."""
    workload = ScaleWorkload(max_rollouts=max_rollouts, turns=turns, model_ms=model_ms)
    result = asyncio.run(bench_scale(workload))
    if as_json:
        typer.echo(result.model_dump_json(indent=2))
        return
    Console().print(scale_table(result))


@bench_app.command("nodes")
def bench_nodes_cmd(
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
    rollouts: Annotated[int, typer.Option("--rollouts", min=1, help="per configuration")] = 200,
    turns: Annotated[int, typer.Option("--turns", min=2, help="model calls per rollout")] = 4,
    model_ms: Annotated[float, typer.Option("--model-ms", min=0.0, help="per model call")] = 500,
    store_url: Annotated[
        str | None, typer.Option("--store-url", help="default: a throwaway PostgreSQL here")
    ] = None,
) -> None:
    """One light workload through 1, 2 and 4 nodes on PostgreSQL, and 1 node on SQLite."""
    result = bench_nodes(rollouts, turns, model_ms, store_url)
    if as_json:
        typer.echo(result.model_dump_json(indent=2))
        return
    Console().print(nodes_table(result))


bench_app.command("learn")(learn_cmd)


@bench_app.command("soak")
def bench_soak_cmd(
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
    rollouts: Annotated[int, typer.Option("--rollouts", min=12, help="rollouts in all")] = 5000,
    in_flight: Annotated[int, typer.Option("--in-flight", min=1, help="at once")] = 48,
) -> None:
    """Short rollouts of mixed outcomes through one server: fds, threads, memory, sandboxes."""
    result = bench_soak(rollouts, in_flight)
    if as_json:
        typer.echo(result.model_dump_json(indent=2))
        return
    Console().print(soak_table(result))


@bench_app.command("gateway")
def bench_gateway_cmd(
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
    turns: Annotated[int, typer.Option("--turns", min=1, help="calls per agent")] = 4,
    concurrency: Annotated[
        list[int] | None, typer.Option("--concurrency", min=1, help="agents at once")
    ] = None,
    generation_ms: Annotated[
        float,
        typer.Option("--generation-ms", min=0, help="the backend's time per call (0: flat out)"),
    ] = 1000.0,
) -> None:
    """The gateway's overhead per model call against calling the backend directly."""
    result = bench_gateway(tuple(concurrency or (1, 100, 500)), turns, generation_ms=generation_ms)
    if as_json:
        typer.echo(result.model_dump_json(indent=2))
        return
    Console().print(gateway_table(result))


@bench_app.command("store")
def bench_store_cmd(
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
    store_url: Annotated[
        str | None, typer.Option("--store-url", help="default: a throwaway PostgreSQL here")
    ] = None,
    seconds: Annotated[float, typer.Option("--seconds", min=0.5, help="per client count")] = 5.0,
    per_node: Annotated[
        float, typer.Option("--per-node", min=0.1, help="rollouts/s one node finishes")
    ] = 25.0,
    request_bytes: Annotated[
        int, typer.Option("--request-bytes", min=0, help="text in each job's request")
    ] = 0,
    output_bytes: Annotated[
        int, typer.Option("--output-bytes", min=0, help="text in each run's output")
    ] = 0,
    batch: Annotated[
        int, typer.Option("--batch", min=1, help="jobs a client submits and claims together")
    ] = BATCH,
) -> None:
    """The job store's capacity: job lifecycles per second with 1, 4 and 16 clients."""
    result = bench_store(
        store_url,
        seconds=seconds,
        per_node_rate=per_node,
        request_bytes=request_bytes,
        output_bytes=output_bytes,
        batch=batch,
    )
    if as_json:
        typer.echo(result.model_dump_json(indent=2))
        return
    Console().print(store_table(result))


@bench_app.command("viewer")
def bench_viewer_cmd(
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
    jobs: Annotated[int, typer.Option("--jobs", min=1, help="jobs in the store")] = 100_000,
    repeats: Annotated[int, typer.Option("--repeats", min=1, help="asks per page")] = 20,
) -> None:
    """The web viewer's pages (jobs table filtered, sorted, paged; a group; a trajectory)
    over a store of many jobs: the server's time per page."""
    result = bench_viewer(jobs, repeats=repeats)
    if as_json:
        typer.echo(result.model_dump_json(indent=2))
        return
    Console().print(viewer_table(result))
