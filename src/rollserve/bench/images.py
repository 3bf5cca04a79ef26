"""``rollserve bench images``: how fast a sandbox starts from a SWE-style image (a repository of
``files`` files at /testbed inside it) — first start, with the conversion into an empty cache,
and warm starts from the cache — per image kind and backend; the cost of making /testbed
writable; and one new image wanted by many jobs at once."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from rich.table import Table

from rollserve.bench.startup import time_start
from rollserve.bench.stats import quantile
from rollserve.errors import SandboxStartError
from rollserve.images.base import RunnableImage
from rollserve.sandbox import SandboxInstance, SandboxManager, spec_for
from rollserve.sandbox.state import unmount_under
from rollserve.sandbox.workspace import image_directory, lay_out
from rollserve.schema.bench import ImagesBenchResult, ImageStartFigures, WorkspaceFigures
from rollserve.settings import Settings
from rollserve.testing.oci import LayerSpec, build_image

_GIT = ["git", "-c", "user.name=bench", "-c", "user.email=bench@rollserve", "-c", "gc.auto=0"]
KINDS = ("oci-archive", "docker-archive", "oci", "dir", "sif")


def make_repository(path: Path, files: int) -> None:
    """A git repository of ``files`` small Python files, 100 per directory, one commit."""
    for i in range(files):
        folder = path / f"pkg{i // 100:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"mod{i % 100:03d}.py").write_text(f"VALUE = {i}\n\ndef f():\n    return VALUE\n")
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    subprocess.run([*_GIT, "-C", str(path), "add", "-A"], check=True)
    subprocess.run([*_GIT, "-C", str(path), "commit", "-qm", "repository"], check=True)


def make_images(work: Path, base: Path, files: int, apptainer: bool) -> dict[str, str]:
    """The same image as every kind the bench measures: reference by kind."""
    repo = work / "testbed"
    make_repository(repo, files)
    layers = [LayerSpec(base), LayerSpec(repo, prefix="/testbed", gzip=True)]
    config = {"env": {"BENCH": "1"}, "workdir": "/testbed"}
    refs = {
        "oci-archive": build_image(work / "image.tar", layers, **config),  # type: ignore[arg-type]
        "docker-archive": build_image(
            work / "docker.tar",
            layers,
            fmt="docker-archive",
            **config,  # type: ignore[arg-type]
        ),
        "oci": build_image(work / "layout", layers, fmt="oci", **config),  # type: ignore[arg-type]
    }
    rootfs = work / "rootfs"
    # cp -a, not shutil.copytree: the root filesystem holds device nodes (/dev/zero …).
    subprocess.run(["cp", "-a", "--reflink=auto", str(base), str(rootfs)], check=True)
    subprocess.run(["cp", "-a", f"{repo}/.", str(rootfs / "testbed")], check=True)
    refs["dir"] = str(rootfs)
    if apptainer:
        sif = work / "image.sif"
        subprocess.run(
            ["apptainer", "--silent", "build", str(sif), str(rootfs)],
            check=True,
            capture_output=True,
        )
        refs["sif"] = str(sif)
    return refs


async def _start(manager: SandboxManager, backend: str, image: str) -> tuple[float, str]:
    """One start with the workspace at /testbed, and how it was made writable."""
    mode: list[str] = []

    async def how(sandbox: SandboxInstance) -> None:
        mounts = await asyncio.to_thread(Path("/proc/self/mountinfo").read_text)
        overlay = any(line.split()[4] == str(sandbox.workspace) for line in mounts.splitlines())
        mode.append("overlay" if overlay else "copy")

    spec = spec_for(backend, image=image, workspace="/testbed")
    elapsed = await time_start(manager, backend, spec, how)
    return elapsed, mode[0]


async def _kind_figures(
    settings: Settings, backend: str, kind: str, ref: str, files: int, starts: int, cache: Path
) -> ImageStartFigures:
    fresh = settings.model_copy(update={"image_cache_dir": cache})
    async with SandboxManager(fresh) as manager:
        first, mode = await _start(manager, backend, ref)
        samples = [(await _start(manager, backend, ref))[0] for _ in range(starts)]
    return ImageStartFigures(
        backend=backend,
        image_kind=kind,
        files=files,
        first_start_ms=round(first, 1),
        warm_start_p50_ms=round(quantile(samples, 0.5), 1),
        warm_start_p99_ms=round(quantile(samples, 0.99), 1),
        starts=starts,
        workspace=mode,
    )


async def _workspace_figures(
    image: RunnableImage, work: Path, files: int, n: int
) -> list[WorkspaceFigures]:
    source = image_directory(image, "/testbed")
    figures = []
    for mode in ("overlay", "copy"):
        samples = []
        for i in range(n):
            target = work / f"ws-{mode}-{i}"
            (target / "workspace").mkdir(parents=True)
            (target / "scratch").mkdir()
            started = time.perf_counter()
            try:
                await lay_out(source, target / "workspace", target / "scratch", mode)
            except SandboxStartError:
                break  # no overlay here (not root): only the copy is measured
            samples.append((time.perf_counter() - started) * 1000)
            unmount_under(target)
            shutil.rmtree(target)
        if samples:
            figures.append(
                WorkspaceFigures(
                    mode=mode, files=files, p50_ms=round(quantile(samples, 0.5), 1), n=n
                )
            )
    return figures


async def bench_images(
    settings: Settings,
    backends: list[str],
    *,
    files: int = 5000,
    starts: int = 10,
    concurrent: int = 50,
    kinds: tuple[str, ...] = KINDS,
) -> ImagesBenchResult:
    """The figures; every cache the bench makes is removed at the end."""
    base = settings.image_dir / "base"
    with tempfile.TemporaryDirectory(prefix="bench-images-", dir=settings.data_dir) as tmp:
        work = Path(tmp)
        async with SandboxManager(settings) as probe:
            usable = [b for b in backends if probe.availability(b).available]
        refs = await asyncio.to_thread(make_images, work, base, files, "apptainer" in usable)
        results = []
        for kind in kinds:
            for backend in usable:
                if kind in refs:
                    cache = work / f"cache-{kind}-{backend}"
                    results.append(
                        await _kind_figures(
                            settings, backend, kind, refs[kind], files, starts, cache
                        )
                    )
        shared = settings.model_copy(update={"image_cache_dir": work / "cache-concurrent"})
        async with SandboxManager(shared) as manager:
            backend = usable[0]
            started = time.perf_counter()
            boxes = await asyncio.gather(
                *(
                    manager.start(
                        spec_for(backend, image=refs["oci-archive"], workspace="/testbed")
                    )
                    for _ in range(concurrent)
                )
            )
            seconds = time.perf_counter() - started
            conversions = manager.images.conversions
            image = await manager.images.runnable(refs["oci-archive"], backend)
            workspace = await _workspace_figures(image, work, files, starts)
            manager.images.release(image)
            for box in boxes:
                with contextlib.suppress(OSError):
                    await manager.close(box)
    return ImagesBenchResult(
        results=results,
        workspace=workspace,
        concurrent_first_uses=concurrent,
        conversions=conversions,
        concurrent_seconds=round(seconds, 2),
    )


def images_table(result: ImagesBenchResult) -> Table:
    """The figures as a table."""
    table = Table("backend", "image kind", "files", "first start ms", "warm p50 ms", "workspace")
    for r in result.results:
        table.add_row(
            r.backend,
            r.image_kind,
            str(r.files),
            f"{r.first_start_ms:.0f}",
            f"{r.warm_start_p50_ms:.1f}",
            r.workspace,
        )
    return table
