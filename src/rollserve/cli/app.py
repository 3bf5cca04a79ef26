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

from rollserve.bench.startup import check_backends
from rollserve.cli.bench import bench_app
from rollserve.cli.export import export_app
from rollserve.cli.images import images_app
from rollserve.cli.llm import llm_app
from rollserve.cli.options import DataDir, settings_for, with_manager
from rollserve.cli.processes import serve_processes
from rollserve.cli.serve import announce_when_ready, load_plugins, serve
from rollserve.cli.submit import submit
from rollserve.cli.tasks import tasks_app
from rollserve.cli.view import view_cmd
from rollserve.client import RolloutClient
from rollserve.demo.main import DemoOptions, check_table, default_demo_dir, run_demo
from rollserve.errors import RollserveError
from rollserve.pipeline.fleet import node_name
from rollserve.settings import Settings
from rollserve.storage.registry import open_store

app = typer.Typer(
    help="rollserve: Rollout-as-a-Service for multi-turn LLM agents.",
    no_args_is_help=True,
    add_completion=False,
)
sandbox_app = typer.Typer(help="Sandbox backends.", no_args_is_help=True)
app.add_typer(sandbox_app, name="sandbox")
app.add_typer(bench_app, name="bench")
app.add_typer(llm_app, name="llm")
app.add_typer(tasks_app, name="tasks")
app.add_typer(export_app, name="export")
app.add_typer(images_app, name="images")


@sandbox_app.command("check")
def sandbox_check(
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
    starts: Annotated[int, typer.Option(min=1, help="starts timed per backend")] = 7,
    data_dir: DataDir = None,
) -> None:
    """Each backend: available or why not, and its start latency (median)."""
    checks = asyncio.run(
        with_manager(settings_for(data_dir), lambda m: check_backends(m, starts=starts))
    )
    if as_json:
        typer.echo(json.dumps({"backends": [c.model_dump() for c in checks]}, indent=2))
        return
    Console().print(check_table(checks))


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
