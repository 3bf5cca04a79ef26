"""``rollserve images``: the image cache (list what is there, convert ahead of time, prune)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from rollserve.images import CachedImage, ImageStore
from rollserve.settings import Settings

images_app = typer.Typer(help="The image cache.", no_args_is_help=True)
AsJson = Annotated[bool, typer.Option("--json", help="print JSON")]


def _view(image: CachedImage) -> dict[str, object]:
    return {
        "digest": image.digest,
        "refs": image.refs,
        "files": image.files,
        "size_bytes": image.size_bytes,
        "workdir": image.workdir,
        "env": image.env,
        "created": image.created,
        "last_used": image.last_used,
        "convert_s": image.convert_s,
        "path": str(image.rootfs),
    }


def _ago(when: float) -> str:
    seconds = max(0.0, time.time() - when)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit} ago"
    return f"{seconds:.0f}s ago"


@images_app.command("list")
def list_cmd(as_json: AsJson = False) -> None:
    """The converted images, most recently used first."""
    settings = Settings()
    images = ImageStore(settings).cache.all()
    if as_json:
        typer.echo(json.dumps({"images": [_view(i) for i in images]}, indent=2))
        return
    table = Table("digest", "refs", "files", "size", "last used")
    for image in images:
        table.add_row(
            image.digest[:19],
            "\n".join(image.refs),
            str(image.files),
            f"{image.size_bytes / 2**20:.0f} MiB",
            _ago(image.last_used),
        )
    console = Console()
    console.print(table)
    total = sum(i.size_bytes for i in images)
    console.print(
        f"{len(images)} images, {total / 2**30:.2f} GiB of {settings.image_cache_max_gb:g} GiB "
        f"in {settings.image_cache}"
    )


@images_app.command("pull")
def pull_cmd(
    refs: Annotated[list[str], typer.Argument(help="image references to convert now")],
) -> None:
    """Convert images into the cache ahead of their first use (oci-archive:FILE,
    docker-archive:FILE, oci:DIR, a .sif file, docker://REF)."""
    store = ImageStore(Settings())
    for ref in refs:
        started = time.monotonic()
        image = asyncio.run(store.pull(ref))
        typer.echo(
            f"{ref}: {image.digest} ({image.files} files, {image.size_bytes / 2**20:.0f} MiB) "
            f"in {time.monotonic() - started:.1f}s"
        )


@images_app.command("prune")
def prune_cmd(
    max_gb: Annotated[
        float | None,
        typer.Option("--max-gb", min=0, help="shrink to this size (default: the cache's bound)"),
    ] = None,
    everything: Annotated[
        bool, typer.Option("--all", help="remove every image not in use right now")
    ] = False,
) -> None:
    """Remove least recently used images (never one a sandbox is running) and leftovers of
    interrupted conversions."""
    store = ImageStore(Settings())
    store.cache.clean_tmp()
    bound = 0 if everything else (None if max_gb is None else int(max_gb * 2**30))
    removed = store.cache.evict(max_bytes=bound)
    for digest in removed:
        typer.echo(f"removed {digest}")
    left = store.cache.all()
    total = sum(i.size_bytes for i in left)
    typer.echo(f"{len(removed)} removed; {len(left)} left ({total / 2**30:.2f} GiB)")
