"""``rollserve bench images``: how fast a sandbox starts from a SWE-style image (a repository of
``files`` files at /testbed inside it) — first start, with the conversion into an empty cache,
and warm starts from the cache — per image kind and backend; the cost of making /testbed
writable; and one new image wanted by many jobs at once. Run as root with ``user``, the same
images are measured again by that ordinary user (a child ``rollserve bench images`` run as it,
in cgroups delegated to it), each row saying whose it is."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.table import Table

from rollserve.bench.layers import layer_figures
from rollserve.bench.startup import time_start
from rollserve.bench.stats import quantile, running_user
from rollserve.errors import InvalidInputError, SandboxStartError
from rollserve.fixtures.oci import LayerSpec, build_image, build_layer
from rollserve.fixtures.users import User, as_user_argv, delegation, ensure_user, undelegate
from rollserve.images.base import RunnableImage
from rollserve.sandbox import SandboxInstance, SandboxManager, spec_for
from rollserve.sandbox.state import unmount_under
from rollserve.sandbox.workspace import image_directory, lay_out
from rollserve.schema.bench import ImagesBenchResult, ImageStartFigures, WorkspaceFigures
from rollserve.settings import Settings
from rollserve.trees import remove_tree

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
    built = work / "layers"  # each layer written once, for the three kinds of image
    built.mkdir()
    layers = [
        build_layer(LayerSpec(base), built),
        build_layer(LayerSpec(repo, prefix="/testbed", gzip=True), built),
    ]
    env, workdir = {"BENCH": "1"}, "/testbed"
    refs = {
        "oci-archive": build_image(work / "image.tar", layers, env=env, workdir=workdir),
        "docker-archive": build_image(
            work / "docker.tar", layers, env=env, workdir=workdir, fmt="docker-archive"
        ),
        "oci": build_image(work / "layout", layers, env=env, workdir=workdir, fmt="oci"),
    }
    shutil.rmtree(built)
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
        mode.append(sandbox.workspace_mode)

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
        user=running_user(),
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
                layout = await lay_out(source, target / "workspace", target / "scratch", mode)
            except SandboxStartError:
                break  # no overlay here: only the copy is measured
            samples.append((time.perf_counter() - started) * 1000)
            if layout.holder is not None:
                await layout.holder.close()
            await asyncio.to_thread(unmount_under, target)
            await asyncio.to_thread(remove_tree, target)
        if samples:
            figures.append(
                WorkspaceFigures(
                    user=running_user(),
                    mode=mode,
                    files=files,
                    p50_ms=round(quantile(samples, 0.5), 1),
                    n=n,
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
    images: dict[str, str] | None = None,
    user: str | None = None,
) -> ImagesBenchResult:
    """The figures; every cache and image the bench makes is removed at the end. ``images``
    (reference by kind) are measured instead of images built here; ``user`` (root only)
    measures them again as that ordinary user."""
    if user is not None and os.geteuid() != 0:
        raise InvalidInputError("only root can run the bench as another user", user=user)
    async with SandboxManager(settings) as probe:
        usable = [b for b in backends if probe.availability(b).available]
    if not usable:
        raise InvalidInputError(f"none of the backends {backends} is available here")
    # The images live where another user can read them (a temporary directory in /tmp).
    with tempfile.TemporaryDirectory(prefix="bench-images-") as built:
        if images is None:
            images = await asyncio.to_thread(
                _shared_images, Path(built), settings.image_dir / "base", files, usable
            )
        if "oci-archive" not in images:
            raise InvalidInputError("the bench needs an oci-archive image", images=images)
        with tempfile.TemporaryDirectory(prefix="bench-images-", dir=settings.data_dir) as tmp:
            result = await _figures(
                settings, usable, images, Path(tmp), files, starts, concurrent, kinds
            )
        if user is not None:
            other = await asyncio.to_thread(
                _as_user,
                ensure_user(user),
                images,
                Path(built),
                [
                    f"--files={files}",
                    f"--starts={starts}",
                    f"--concurrent={concurrent}",
                    *(f"--backend={b}" for b in usable),
                    *(f"--kind={k}" for k in kinds),
                ],
            )
            result.results += other.results
            result.workspace += other.workspace
            result.layers += other.layers
    return result


def _shared_images(work: Path, base: Path, files: int, usable: list[str]) -> dict[str, str]:
    """The images, readable by every user (the ``dir`` image keeps its modes: an ordinary
    user gets a copy of its own)."""
    work.chmod(0o755)
    images = make_images(work, base, files, "apptainer" in usable)
    for entry in work.iterdir():
        if str(entry) != images["dir"]:
            subprocess.run(["chmod", "-R", "a+rX", str(entry)], check=True)
    return images


async def _figures(
    settings: Settings,
    usable: list[str],
    refs: dict[str, str],
    work: Path,
    files: int,
    starts: int,
    concurrent: int,
    kinds: tuple[str, ...],
) -> ImagesBenchResult:
    results = []
    for kind in kinds:
        for backend in usable:
            if kind in refs:
                cache = work / f"cache-{kind}-{backend}"
                results.append(
                    await _kind_figures(settings, backend, kind, refs[kind], files, starts, cache)
                )
    layers = [
        await layer_figures(
            settings.model_copy(update={"image_cache_dir": work / f"cache-layers-{backend}"}),
            backend,
            refs["oci-archive"],
            work,
            starts,
        )
        for backend in usable
    ]
    shared = settings.model_copy(update={"image_cache_dir": work / "cache-concurrent"})
    async with SandboxManager(shared) as manager:
        backend = usable[0]
        started = time.perf_counter()
        boxes = await asyncio.gather(
            *(
                manager.start(spec_for(backend, image=refs["oci-archive"], workspace="/testbed"))
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
        layers=layers,
        concurrent_first_uses=concurrent,
        conversions=conversions,
        concurrent_seconds=round(seconds, 2),
    )


def _as_user(
    user: User, refs: dict[str, str], built: Path, options: list[str]
) -> ImagesBenchResult:
    """The same bench over the same images, run as ``user`` in a data directory of its own
    (with its own copy of the ``dir`` image: an ordinary user overlays only its own trees)."""
    data = built / f"data-{user.uid}"
    data.mkdir()
    os.chown(data, user.uid, user.gid)
    refs = dict(refs)
    if "dir" in refs:
        own = built / f"rootfs-{user.uid}"
        subprocess.run(["cp", "-a", "--reflink=auto", refs["dir"], str(own)], check=True)
        subprocess.run(["chown", "-R", f"{user.uid}:{user.gid}", str(own)], check=True)
        refs["dir"] = str(own)
    argv = [
        sys.executable,
        "-c",
        "from rollserve.cli.entry import main; main()",
        "bench",
        "images",
        "--json",
        f"--data-dir={data}",
        *options,
        *(f"--image={kind}={ref}" for kind, ref in refs.items()),
    ]
    cgroups = delegation(user)
    try:
        proc = subprocess.run(
            as_user_argv(user, argv, delegate=cgroups),
            capture_output=True,
            text=True,
            check=False,
        )
    finally:
        undelegate(cgroups)
    if proc.returncode != 0:
        raise SandboxStartError(
            f"the bench as user {user.name} exited {proc.returncode}: {proc.stderr[-2000:]}"
        )
    return ImagesBenchResult.model_validate_json(proc.stdout)


def images_table(result: ImagesBenchResult) -> Table:
    """The figures as a table."""
    table = Table(
        "user", "backend", "image kind", "files", "first start ms", "warm p50 ms", "workspace"
    )
    for r in result.results:
        table.add_row(
            r.user,
            r.backend,
            r.image_kind,
            str(r.files),
            f"{r.first_start_ms:.0f}",
            f"{r.warm_start_p50_ms:.1f}",
            r.workspace,
        )
    return table
