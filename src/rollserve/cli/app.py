"""``rollserve``: the command line (typer)."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
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
from rollserve.bench.startup import check_backends
from rollserve.bench.store import bench_store, store_table
from rollserve.bench.viewer import bench_viewer, viewer_table
from rollserve.cli.export import export_app
from rollserve.cli.images import images_app
from rollserve.cli.learn import learn_cmd
from rollserve.cli.llm import llm_app
from rollserve.cli.processes import serve_processes
from rollserve.cli.serve import announce_when_ready, load_plugins, serve
from rollserve.cli.submit import submit
from rollserve.cli.tasks import tasks_app
from rollserve.cli.view import view_cmd
from rollserve.client import RolloutClient
from rollserve.demo.main import DemoOptions, check_table, default_demo_dir, run_demo
from rollserve.errors import RollserveError
from rollserve.pipeline.fleet import node_name
from rollserve.sandbox import SandboxManager
from rollserve.settings import Settings
from rollserve.storage.registry import open_store

app = typer.Typer(
    help="rollserve: Rollout-as-a-Service for multi-turn LLM agents.",
    no_args_is_help=True,
    add_completion=False,
)
sandbox_app = typer.Typer(help="Sandbox backends.", no_args_is_help=True)
bench_app = typer.Typer(help="Benchmarks (figures, not tests).", no_args_is_help=True)
app.add_typer(sandbox_app, name="sandbox")
app.add_typer(bench_app, name="bench")
app.add_typer(llm_app, name="llm")
app.add_typer(tasks_app, name="tasks")
app.add_typer(export_app, name="export")
app.add_typer(images_app, name="images")

DataDir = Annotated[Path | None, typer.Option("--data-dir", help="state directory")]


def _settings(data_dir: Path | None) -> Settings:
    return Settings(data_dir=data_dir) if data_dir else Settings()


async def _with_manager(settings: Settings, work):  # type: ignore[no-untyped-def]
    async with SandboxManager(settings) as manager:
        return await work(manager)


@sandbox_app.command("check")
def sandbox_check(
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
    starts: Annotated[int, typer.Option(min=1, help="starts timed per backend")] = 7,
    data_dir: DataDir = None,
) -> None:
    """Each backend: available or why not, and its start latency (median)."""
    checks = asyncio.run(
        _with_manager(_settings(data_dir), lambda m: check_backends(m, starts=starts))
    )
    if as_json:
        typer.echo(json.dumps({"backends": [c.model_dump() for c in checks]}, indent=2))
        return
    Console().print(check_table(checks))


@bench_app.command("shell")
def bench_shell_cmd(
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
    n: Annotated[int, typer.Option("--n", min=10, help="commands per method")] = 200,
    backend: Annotated[list[str] | None, typer.Option(help="only these backends")] = None,
    data_dir: DataDir = None,
) -> None:
    """Trivial-command latency: persistent PTY vs tmux polling vs a new bash -c."""
    settings = _settings(data_dir)

    async def work(manager: SandboxManager):  # type: ignore[no-untyped-def]
        names = backend or manager.backends.names()
        return await bench_shell(manager, names, n=n, tmux_n=max(10, n // 2))

    results = asyncio.run(_with_manager(settings, work))
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
    settings = _settings(data_dir)
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
) -> None:
    """The job store's capacity: job lifecycles per second with 1, 4 and 16 clients."""
    result = bench_store(
        store_url,
        seconds=seconds,
        per_node_rate=per_node,
        request_bytes=request_bytes,
        output_bytes=output_bytes,
    )
    if as_json:
        typer.echo(result.model_dump_json(indent=2))
        return
    Console().print(store_table(result))


@app.command("serve")
def serve_cmd(
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on")] = 8700,
    data_dir: DataDir = None,
    config: Annotated[Path | None, typer.Option("--config", help="TOML or YAML settings")] = None,
    plugins: Annotated[
        list[str] | None, typer.Option("--plugins", help="modules with register(plugins)")
    ] = None,
    init_workers: Annotated[int | None, typer.Option(help="init pool size")] = None,
    run_workers: Annotated[int | None, typer.Option(help="run pool size")] = None,
    eval_workers: Annotated[int | None, typer.Option(help="eval pool size")] = None,
    max_queued: Annotated[int | None, typer.Option(help="unfinished jobs accepted at most")] = None,
    store_url: Annotated[
        str | None, typer.Option(help="the job store: sqlite://PATH or postgresql://…")
    ] = None,
    node_id: Annotated[str | None, typer.Option(help="this node's name in the fleet")] = None,
    processes: Annotated[
        int, typer.Option(min=1, help="node processes sharing the address (NAME-0, NAME-1, …)")
    ] = 1,
    announce: Annotated[
        Path | None, typer.Option(help="append this node's URL to FILE once it is ready")
    ] = None,
    ssl_certfile: Annotated[
        Path | None, typer.Option(help="serve HTTPS with this certificate (PEM)")
    ] = None,
    ssl_keyfile: Annotated[Path | None, typer.Option(help="and this private key (PEM)")] = None,
    fd: Annotated[int | None, typer.Option(hidden=True, help="serve on this socket")] = None,
) -> None:
    """Serve the HTTP API and run the pipeline. One process is one node; --processes N runs
    N nodes behind one address. Settings: these flags, then the environment (ROLLSERVE_*),
    then the --config file, then the defaults."""
    settings = Settings.load(
        config,
        data_dir=data_dir,
        init_workers=init_workers,
        run_workers=run_workers,
        eval_workers=eval_workers,
        max_queued=max_queued,
        store_url=store_url,
        node_id=node_id,
        ssl_certfile=ssl_certfile,
        ssl_keyfile=ssl_keyfile,
    )
    loaded = load_plugins(plugins or [])  # a plug-in that does not load: one line, no server
    open_store(settings, loaded.stores).close()  # nor a store_url that names no usable store
    if announce is not None and fd is None:
        announce_when_ready(announce, host, port, tls=settings.ssl_certfile is not None)
    if processes == 1:
        serve(settings, host, port, loaded, fd=fd)
        return
    child_args = [f"--data-dir={settings.data_dir}"]
    child_args += [f"--config={config}"] if config else []
    child_args += [f"--plugins={module}" for module in plugins or []]
    pools = {"init": init_workers, "run": run_workers, "eval": eval_workers}
    child_args += [f"--{stage}-workers={n}" for stage, n in pools.items() if n is not None]
    child_args += [f"--max-queued={max_queued}"] if max_queued is not None else []
    child_args += [f"--store-url={store_url}"] if store_url is not None else []
    tls = {"certfile": ssl_certfile, "keyfile": ssl_keyfile}
    child_args += [f"--ssl-{part}={path}" for part, path in tls.items() if path is not None]
    name = node_name(settings)
    raise typer.Exit(serve_processes(processes, host, port, name, child_args))


Server = Annotated[str, typer.Option("--server", help="rollserve URL")]
Token = Annotated[str | None, typer.Option("--token", help="bearer token")]


app.command("view")(view_cmd)


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


@app.command("submit")
def submit_cmd(
    tasks: Annotated[Path, typer.Argument(help="JSONL file, one JobRequest per line")],
    server: Server = "http://127.0.0.1:8700",
    token: Token = None,
    wait: Annotated[bool, typer.Option("--wait", help="wait for the results")] = False,
    out: Annotated[Path | None, typer.Option("--out", help="results as JSONL")] = None,
) -> None:
    """Submit jobs to a server; with --wait, show progress and collect the results."""
    with RolloutClient(server, token=token) as client:
        incomplete = submit(client, tasks, wait=wait or out is not None, out=out, console=Console())
    raise typer.Exit(1 if incomplete else 0)


@app.command("status")
def status_cmd(server: Server = "http://127.0.0.1:8700", token: Token = None) -> None:
    """A server's stages, queues, workers and jobs."""
    with RolloutClient(server, token=token) as client:
        typer.echo(client.status().model_dump_json(indent=2))


@app.command("demo")
def demo(
    data_dir: Annotated[
        Path | None,
        typer.Option("--data-dir", help="the demo's directory (default DATA_DIR/demo)"),
    ] = None,
    samples: Annotated[int, typer.Option("--samples", min=1, help="rollouts per task")] = 2,
    model_dir: Annotated[
        Path | None,
        typer.Option("--model-dir", help="another model: a Hugging Face model directory"),
    ] = None,
    gguf: Annotated[Path | None, typer.Option("--gguf", help="another model: a .gguf file")] = None,
    fast: Annotated[
        bool, typer.Option("--fast", help="the tiny test model, two tasks, no SWE task")
    ] = False,
) -> None:
    """Run rollserve's main job end to end: serve a small model on the CPU, register it, run
    GRPO groups of shipped tasks in sandboxes, show rewards, timings and trajectories."""
    settings = Settings()
    options = DemoOptions(
        data_dir=(data_dir or default_demo_dir(settings)).resolve(),
        samples=samples,
        model_dir=model_dir,
        gguf=gguf,
        fast=fast,
    )
    raise typer.Exit(run_demo(settings, options, Console()))


def main() -> None:
    """Console-script entry: errors are printed with their code, not as a traceback."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        app()
    except RollserveError as exc:
        Console(stderr=True, soft_wrap=True).print(
            f"[red]error[/red] \\[{exc.code}] {escape(exc.message)}"
        )
        raise SystemExit(2) from exc


if __name__ == "__main__":
    main()
