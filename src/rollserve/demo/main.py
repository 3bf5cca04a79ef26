"""``rollserve demo``: rollserve's main job end to end on this machine, explained step by step.
A small model served on the CPU (SmolLM2-135M-Instruct, or the tiny test model with ``--fast``)
is registered as a token-mode backend of a rollserve service; GRPO groups of shipped tasks (math,
HumanEval, stdin/stdout, SWE) run through the pipeline in bwrap sandboxes; the rewards, timings,
throughput and token-exact trajectories come out. Ctrl-C stops everything cleanly."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from rollserve.demo.checks import Requirements, check_requirements
from rollserve.demo.run import DemoRun
from rollserve.errors import InvalidInputError
from rollserve.schema.sandbox import BackendCheck
from rollserve.settings import Settings


@dataclass(frozen=True)
class DemoOptions:
    """The demo's command-line options."""

    data_dir: Path
    samples: int = 2
    model_dir: Path | None = None
    gguf: Path | None = None
    fast: bool = False


def default_demo_dir(settings: Settings) -> Path:
    """``DATA_DIR/demo`` (``~/.local/share/rollserve/demo`` by default)."""
    return settings.data_dir / "demo"


def check_table(checks: list[BackendCheck], title: str | None = None) -> Table:
    """``rollserve sandbox check`` as a table."""
    table = Table("backend", "available", "start p50 (ms)", "note", title=title)
    for c in checks:
        start = f"{c.start_p50_ms:.1f}" if c.start_p50_ms is not None else "-"
        unenforced = "; ".join(f"{k} not enforced: {why}" for k, why in c.unenforced.items())
        workspace = f"/testbed: {c.workspace} ({c.workspace_note})" if c.workspace else ""
        note = "; ".join(n for n in (c.reason, workspace, unenforced) if n)
        table.add_row(c.name, "yes" if c.available else "no", start, note)
    return table


def run_demo(settings: Settings, options: DemoOptions, console: Console) -> int:
    """Run the demo; its exit code: 0 when every rollout completed, 1 when some did not,
    128 + N when signal N (Ctrl-C: SIGINT) stopped it."""
    # The service keeps its job store and sandbox state in a directory of its own.
    service = settings.model_copy(
        update={"data_dir": options.data_dir / "service", "init_workers": 4, "run_workers": 3}
    )
    return asyncio.run(_main(service, options, console))


async def _main(settings: Settings, options: DemoOptions, console: Console) -> int:
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    assert main is not None
    caught: list[int] = []

    def stop(signum: int) -> None:
        if caught:
            console.print("[yellow]already stopping; cleaning up takes a few seconds[/yellow]")
            return
        caught.append(signum)
        name = signal.Signals(signum).name
        console.print(f"\n[yellow]{name}: stopping — cancelling jobs, closing everything[/yellow]")
        main.cancel()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop, signum)
    try:
        requirements = await _check(settings, options, console)
        demo = DemoRun(settings, options.data_dir, options.samples, requirements, console)
        return await demo.run()
    except asyncio.CancelledError:
        if not caught:
            raise
        console.print("[yellow]stopped: no job, sandbox or model server is left running[/yellow]")
        return 128 + caught[0]
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(RuntimeError):  # the loop may already be closing
                loop.remove_signal_handler(signum)


async def _check(settings: Settings, options: DemoOptions, console: Console) -> Requirements:
    if options.fast:
        mode = "fast variant (the tiny test model)"
    elif options.gguf or options.model_dir:
        mode = str(options.gguf or options.model_dir)
    else:
        mode = "SmolLM2-135M-Instruct"
    console.rule(f"[bold]rollserve demo[/bold] — {mode}")
    console.print(
        "rollserve runs rollouts for RL training: a trainer serves its policy through an "
        "inference server and sends tasks; rollserve starts a sandbox per rollout, runs the "
        "agent's tool loop against the model, scores the outcome and returns token-exact "
        f"trajectories. Everything below runs on this machine, under {options.data_dir}.\n"
    )
    console.print("[bold]1. What the demo needs[/bold]")
    with console.status("probing the sandbox backend"):
        requirements = await asyncio.to_thread(
            check_requirements,
            settings,
            options.data_dir,
            options.model_dir,
            options.gguf,
            options.fast,
        )
    console.print(requirements.table())
    if not requirements.met:
        missing = [c.what for c in requirements.checks if not c.ok]
        raise InvalidInputError(
            f"the demo cannot run without: {', '.join(missing)} (how to get each is shown above)",
            missing=missing,
        )
    return requirements
