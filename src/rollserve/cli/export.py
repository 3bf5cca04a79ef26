"""``rollserve export``: finished results (``rollserve submit --out``) in a trainer's format."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rollserve.client.parquet import read_results, write_verl_parquet

export_app = typer.Typer(help="Export results for trainers.", no_args_is_help=True)


@export_app.command("verl")
def verl_cmd(
    results: Annotated[
        Path, typer.Argument(help="JSONL file, one finished job a line (submit --out)")
    ],
    out: Annotated[Path, typer.Option("--out", help="the Parquet file to write")],
) -> None:
    """Write veRL agent-loop rows as Parquet.

    Columns: uid (the group), prompt_ids, response_ids, response_mask, response_logprobs,
    reward_score, num_turns … Jobs that did not complete in token mode are left out."""
    export = write_verl_parquet(read_results(results), out)
    typer.echo(f"wrote {export.rows} rows to {export.path}")
    for job_id, reason in export.skipped.items():
        typer.echo(f"skipped {job_id}: {reason}", err=True)
