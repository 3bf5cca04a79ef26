"""``rollserve llm``: serve a model on the CPU with vLLM's and SGLang's HTTP APIs, and build the
tiny test model."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

llm_app = typer.Typer(help="rollserve's local CPU inference server.", no_args_is_help=True)

# torch and transformers take seconds to import: they are imported inside the commands, so that
# the rest of the command line stays fast.


@llm_app.command("serve")
def serve_cmd(
    model: Annotated[Path, typer.Option("--model", help="model directory (or a .gguf file)")],
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on")] = 8000,
    served_model_name: Annotated[
        str | None, typer.Option("--served-model-name", help="model id in the API")
    ] = None,
    gguf_file: Annotated[
        str | None, typer.Option("--gguf-file", help="GGUF file name inside --model")
    ] = None,
    threads: Annotated[
        int | None, typer.Option("--threads", min=1, help="torch threads (default: torch's)")
    ] = None,
) -> None:
    """Serve /v1/completions, /v1/chat/completions, /v1/models and SGLang's /generate."""
    import torch
    import uvicorn

    if threads is not None:
        torch.set_num_threads(threads)

    from rollserve.llm.local.engine import LocalEngine
    from rollserve.llm.local.server import create_llm_app

    engine = LocalEngine(model, gguf_file=gguf_file, model_name=served_model_name)
    app = create_llm_app(engine, engine.model_name)
    typer.echo(
        f"serving {engine.model_name} (context {engine.max_model_len}) at http://{host}:{port}/v1"
    )
    uvicorn.run(app, host=host, port=port, log_level="warning")


@llm_app.command("build-tiny")
def build_tiny_cmd(
    directory: Annotated[Path, typer.Argument(help="where to write the model")],
    seed: Annotated[int, typer.Option(help="weight seed")] = 0,
) -> None:
    """Write the tiny test model (a 2-layer Llama and its BPE tokenizer) into DIRECTORY."""
    from rollserve.llm.local.tiny_model import build_tiny_model

    typer.echo(str(build_tiny_model(directory, seed=seed)))
