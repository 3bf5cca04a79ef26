"""``rollserve view RESULTS.jsonl``: the web viewer over a results file, without a service."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
import uvicorn
from rich.console import Console

from rollserve.errors import RollserveError
from rollserve.llm.templates import TemplateCache
from rollserve.server.ui.offline import create_offline_app


def view_cmd(
    results: Annotated[
        Path, typer.Argument(help="a results file: `rollserve submit --out` or the demo's")
    ],
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on")] = 8780,
    tokenizer: Annotated[
        Path | None,
        typer.Option(help="a tokenizer directory: the token view shows text, not ids"),
    ] = None,
) -> None:
    """Open the viewer over RESULTS (one JobView per line) at http://HOST:PORT/ui/."""
    console = Console(stderr=True)
    try:
        pieces = TemplateCache().get(str(tokenizer)).pieces if tokenizer else None
        app = create_offline_app(results, token_text=pieces)
    except RollserveError as exc:
        console.print(f"[red]rollserve view: {exc.message}", soft_wrap=True)
        raise typer.Exit(2) from None
    console.print(f"viewer of {results}: http://{host}:{port}/ui/", soft_wrap=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")
