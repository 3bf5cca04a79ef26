"""The real rows shipped in examples/swebench (SWE-bench Verified rows of pylint, in SWE-bench
5.x columns, and of django and sympy, in the classic columns; a SWE-Gym row of dask) in
instance images the tests build themselves: each project's sdist at /testbed, its environment
laid out as conda's, packed as an OCI archive; imported with ``tasks import swebench`` once per
session."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rollserve.fixtures import oci, python_layer, swebench_image
from rollserve.fixtures.swebench_image import build_instance_image, load_recipe
from rollserve.node import build_node, default_plugins
from rollserve.schema.jobs import JobRequest, Task
from rollserve.settings import Settings
from rollserve.storage import JobRecord
from rollserve.tasks.swebench.rows import import_rows
from tests.cli.test_cli import ROLLSERVE
from tests.images.conftest import require_base_rootfs

EXAMPLES = Path(__file__).parents[2] / "examples" / "swebench"
IMAGES = Path(__file__).parents[2] / ".cache" / "swebench-images"  # shared: see _instance_images
_BUILDERS = (swebench_image.__file__, python_layer.__file__, oci.__file__)
ROWS = EXAMPLES / "rows.jsonl"
INSTANCE = "pylint-dev__pylint-4551"
CLASSIC = f"{INSTANCE}-classic"  # the same row without the harness's columns
SWE_GYM = "dask__dask-9378"  # a SWE-Gym row: graded by the table's entry from SWE-Gym's harness
DJANGO = "django__django-10973"  # classic rows of the two repositories pytest cannot grade
SYMPY = "sympy__sympy-20916"
ROW_IDS = (INSTANCE, CLASSIC, SWE_GYM, DJANGO, SYMPY)


@dataclass
class Instance:
    row: dict[str, Any]
    image: str  # oci-archive:… of the instance image
    tasks_dir: Path  # tasks.jsonl: the row as imported, and its classic twin
    cache: Path  # one image cache for the session: the image is converted once

    def task(self, task_id: str = INSTANCE) -> Task:
        for line in (self.tasks_dir / "tasks.jsonl").read_text().splitlines():
            task = Task.model_validate_json(line)
            if task.task_id == task_id:
                return task
        raise KeyError(task_id)

    def settings(self, tmp: Path, **changes: Any) -> Settings:
        return Settings(data_dir=tmp / "data", image_cache_dir=self.cache, **changes)


def _build(rows: list[dict[str, Any]], base_rootfs: Path, out: Path) -> Path:
    work = out / "build"
    (work / "base").mkdir(parents=True)
    base_layer = oci.build_layer(oci.LayerSpec(base_rootfs), work / "base")  # one for every image
    for each in rows:
        name = each["instance_id"]
        build_instance_image(
            each,
            out / f"{name}.tar",
            base_rootfs=base_rootfs,
            work=work / name,
            recipe=load_recipe(EXAMPLES / "recipes.json", name),
            base_layer=base_layer,
        )
    shutil.rmtree(work, ignore_errors=True)
    return out


def _instance_images(rows: list[dict[str, Any]], base_rootfs: Path, tmp: Path) -> Path:
    """The rows' instance images, built once for what makes them (the rows, the recipes, the
    builder, the base image): the workers of a run, and the root and the rootless run, share
    them, a file lock letting one build while the others wait. Where the shared directory
    cannot be written (another user's, unfinished), the images are built in ``tmp``."""
    digest = hashlib.sha256()
    for made_by in (ROWS, EXAMPLES / "recipes.json", *map(Path, _BUILDERS)):
        digest.update(made_by.read_bytes())
    digest.update(str(base_rootfs.stat().st_mtime_ns).encode())
    shared = IMAGES / digest.hexdigest()[:16]
    if (shared / "complete").exists():
        return shared
    try:
        IMAGES.mkdir(parents=True, exist_ok=True)
        lock = os.open(IMAGES / f"{shared.name}.lock", os.O_RDONLY | os.O_CREAT, 0o644)
    except OSError:
        return _build(rows, base_rootfs, tmp)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (shared / "complete").exists():
            building = shared.with_name(shared.name + ".building")
            shutil.rmtree(building, ignore_errors=True)
            (_build(rows, base_rootfs, building) / "complete").touch()
            building.rename(shared)
    finally:
        os.close(lock)
    return shared


@pytest.fixture(scope="session")
def instance(tmp_path_factory: pytest.TempPathFactory) -> Instance:
    base_rootfs = require_base_rootfs()
    tmp = tmp_path_factory.mktemp("swebench")
    rows = [json.loads(line) for line in ROWS.read_text().splitlines() if line]
    images = _instance_images(rows, base_rootfs, tmp)
    [row] = [r for r in rows if r["instance_id"] == INSTANCE]
    image = f"oci-archive:{images / INSTANCE}.tar"
    classic = {k: v for k, v in row.items() if k not in ("eval_script", "log_parser", "eval_type")}
    classic.update(instance_id=CLASSIC, image=image)
    imported = tmp / "rows.jsonl"
    imported.write_text("".join(json.dumps(r) + "\n" for r in [*rows, classic]))
    reports = import_rows(imported, tmp / "tasks", f"oci-archive:{images}/{{instance_id}}.tar")
    assert all(r.valid for r in reports), reports
    return Instance(row=row, image=image, tasks_dir=tmp / "tasks", cache=tmp / "image-cache")


async def run_jobs(settings: Settings, requests: list[JobRequest]) -> list[JobRecord]:
    """Submit ``requests`` to an in-process pipeline and wait for every one to end."""
    service = build_node(settings, default_plugins())
    await service.start()
    try:
        await service.submit(requests)
        records = []
        for request in requests:
            assert request.job_id is not None
            record = await service.wait(request.job_id, 600)
            assert record.status.terminal, record
            records.append(record)
        return records
    finally:
        await service.stop()


def validate_command(
    tasks_dir: Path, data_dir: Path, cache: Path, timeout: float
) -> subprocess.CompletedProcess[str]:
    """``rollserve tasks validate`` of ``tasks_dir`` in its own process, on image cache
    ``cache``; its output."""
    env = {**os.environ, "ROLLSERVE_IMAGE_CACHE_DIR": str(cache)}
    return subprocess.run(
        [ROLLSERVE, "tasks", "validate", str(tasks_dir), "--data-dir", str(data_dir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        check=False,
    )


from tests.integration.conftest import server_factory  # noqa: E402, F401  (a real server)
