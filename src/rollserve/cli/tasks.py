"""``rollserve tasks``: build task sets (``prepare-swe``: SWE tasks from release sources)."""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from rollserve.settings import Settings
from rollserve.tasks.harbor_import import import_dirs
from rollserve.tasks.swe.prepare import TaskReport, prepare_specs
from rollserve.tasks.swebench.rows import DEFAULT_IMAGE_TEMPLATE, import_rows
from rollserve.validation import (
    PatchCheck,
    TaskCheck,
    read_tasks,
    validate_tasks,
    write_report,
)

tasks_app = typer.Typer(help="Task sets.", no_args_is_help=True)
import_app = typer.Typer(help="Tasks from other formats.", no_args_is_help=True)
tasks_app.add_typer(import_app, name="import")


def report_table(reports: list[TaskReport]) -> Table:
    """One row per task: valid or not, the stage it reached, the time taken, why."""
    table = Table("task", "valid", "stage", "seconds", "reason")
    for report in reports:
        table.add_row(
            report.task_id,
            "[green]yes[/green]" if report.valid else "[red]no[/red]",
            report.stage,
            f"{report.seconds:.1f}",
            (report.reason or "")[:300],
        )
    return table


@tasks_app.command("prepare-swe")
def prepare_swe_cmd(
    specs: Annotated[Path, typer.Argument(help="JSONL file, one SWE task spec per line")],
    out: Annotated[Path, typer.Option("--out", help="where the tasks are built")],
    only: Annotated[
        list[str] | None, typer.Option("--only", help="only this task id (repeatable)")
    ] = None,
    jobs: Annotated[int, typer.Option("--jobs", min=1, help="tasks prepared at a time")] = 4,
    data_dir: Annotated[
        Path | None, typer.Option("--data-dir", help="state directory (sandboxes)")
    ] = None,
) -> None:
    """Fetch each task's source, make its repository and environment, and validate it in
    sandboxes; writes OUT/tasks.jsonl (ready to submit) and OUT/report.json. Exit code 0 iff
    every task is valid."""
    settings = Settings(data_dir=data_dir) if data_dir else Settings()
    reports = asyncio.run(prepare_specs(specs, out, settings, only=only or None, jobs=jobs))
    console = Console()
    console.print(report_table(reports))
    valid = sum(r.valid for r in reports)
    console.print(f"{valid}/{len(reports)} valid; tasks in {out / 'tasks.jsonl'}")
    raise typer.Exit(0 if valid == len(reports) else 1)


@import_app.command("swebench")
def import_swebench_cmd(
    rows: Annotated[Path, typer.Argument(help="SWE-bench-format rows (.jsonl, .json, .parquet)")],
    out: Annotated[Path, typer.Option("--out", help="where tasks.jsonl and report.json go")],
    image_template: Annotated[
        str,
        typer.Option(
            "--image-template",
            help="image of a row without an 'image' column; placeholders {instance_id}, "
            "{swebench_image} (SWE-bench's sweb.eval.x86_64.* name), {repo}, {version}",
        ),
    ] = DEFAULT_IMAGE_TEMPLATE,
    pytest_fallback: Annotated[
        bool,
        typer.Option(
            "--pytest-fallback",
            help="grade classic rows of repositories (or versions) that rollserve's table of "
            "the harness's specifications does not know with rollserve's own pytest run of "
            "their test ids, instead of reporting them unusable",
        ),
    ] = False,
) -> None:
    """Write swebench tasks from SWE-bench-format rows (SWE-bench, SWE-Gym, SWE-smith …); exit
    code 0 iff every row became a task."""
    reports = import_rows(rows, out, image_template, pytest_fallback=pytest_fallback)
    console = Console()
    bad = [r for r in reports if not r.valid]
    if bad:
        table = Table("row", "instance", "reason")
        for report in bad:
            table.add_row(str(report.row), report.task_id or "?", report.reason or "")
        console.print(table)
    good = len(reports) - len(bad)
    console.print(f"{good}/{len(reports)} rows became tasks; tasks in {out / 'tasks.jsonl'}")
    raise typer.Exit(0 if not bad else 1)


@import_app.command("harbor")
def import_harbor_cmd(
    dirs: Annotated[
        list[Path],
        typer.Argument(help="Harbor task directories (task.toml …), or directories of them"),
    ],
    out: Annotated[Path, typer.Option("--out", help="where tasks.jsonl and report.json go")],
    image_template: Annotated[
        str | None,
        typer.Option(
            "--image-template",
            help="each task's image, instead of task.toml's docker_image; placeholders {name} "
            "(task.toml's [task] name, else the directory's) and {dir} (the directory's name)",
        ),
    ] = None,
) -> None:
    """Write harbor tasks from Harbor task directories (terminal-bench 2, SkyRL …); exit code
    0 iff every directory became a task."""
    reports = import_dirs(dirs, out, image_template)
    console = Console()
    bad = [r for r in reports if not r.valid]
    if bad:
        table = Table("directory", "reason")
        for report in bad:
            table.add_row(report.dir, report.reason or "")
        console.print(table)
    for report in reports:
        for note in report.notes:
            console.print(f"{report.task_id or report.dir}: {note}")
    good = len(reports) - len(bad)
    console.print(f"{good}/{len(reports)} directories became tasks; tasks in {out / 'tasks.jsonl'}")
    raise typer.Exit(0 if not bad else 1)


@tasks_app.command("validate")
def validate_cmd(
    tasks: Annotated[Path, typer.Argument(help="a task directory (DIR/tasks.jsonl) or JSONL file")],
    gold: Annotated[
        bool, typer.Option("--gold", help="only the gold runs (skip the empty-run check)")
    ] = False,
    workers: Annotated[
        int, typer.Option("--workers", min=1, help="tasks set up and evaluated at a time")
    ] = 4,
    data_dir: Annotated[
        Path | None, typer.Option("--data-dir", help="state directory (job store, sandboxes)")
    ] = None,
) -> None:
    """Run every task's gold run (its gold patch; a Harbor task's solution/solve.sh: expect
    reward 1) and an empty run (expect 0) through the pipeline; writes validation.json beside
    the tasks; exit code 0 iff every task is valid."""
    started = time.time()
    listed = read_tasks(tasks)
    with tempfile.TemporaryDirectory(prefix="rollserve-validate-") as scratch:
        settings = Settings.load(
            data_dir=data_dir or Path(scratch),
            init_workers=workers,
            run_workers=workers,
            eval_workers=workers,
        )
        console = Console()
        console.print(f"validating {len(listed)} tasks ({workers} at a time per stage)")

        def done(check: TaskCheck) -> None:
            mark = "[green]valid[/green]" if check.valid else "[red]invalid[/red]"
            console.print(f"{mark} {check.task_id}" + (f": {check.reason}" if check.reason else ""))

        checks = asyncio.run(validate_tasks(listed, settings, gold_only=gold, on_done=done))
    report = (tasks if tasks.is_dir() else tasks.parent) / "validation.json"
    write_report(report, checks, started)
    table = Table("task", "valid", "gold", "empty", "reason")
    for check in checks:
        table.add_row(
            check.task_id,
            "[green]yes[/green]" if check.valid else "[red]no[/red]",
            _reward(check.gold),
            _reward(check.empty),
            (check.reason or "")[:300],
        )
    console.print(table)
    valid = sum(c.valid for c in checks)
    console.print(f"{valid}/{len(checks)} valid; report in {report}")
    raise typer.Exit(0 if valid == len(checks) else 1)


def _reward(check: PatchCheck | None) -> str:
    if check is None:
        return "-"
    return f"{check.reward:g}" if check.reward is not None else check.status
