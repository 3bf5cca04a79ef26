"""Harbor task directories written for the tests (tests/harbor/tasks: one whose check reads
/etc and /opt, one whose check runs a service the agent configured) and the image their
Dockerfiles would build, made offline from the base root filesystem: /app as WORKDIR and the
service's program at /opt/svc."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from rollserve.fixtures.oci import LayerSpec, build_image
from rollserve.settings import Settings
from rollserve.tasks.harbor_import import import_dirs
from tests.images.conftest import BASE_ROOTFS, require_base_rootfs

TASKS = Path(__file__).parent / "tasks"
SYSTEM_FILES = "rollserve/system-files"
SERVICE = "rollserve/service"


@dataclass
class Harbor:
    image: str  # oci-archive:… of the tasks' image
    tasks_dir: Path  # tasks.jsonl of the imported directories
    cache: Path  # one image cache for the session

    def settings(self, tmp: Path, **changes: object) -> Settings:
        return Settings(data_dir=tmp / "data", image_cache_dir=self.cache, **changes)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def harbor(tmp_path_factory: pytest.TempPathFactory) -> Harbor:
    require_base_rootfs()
    tmp = tmp_path_factory.mktemp("harbor")
    svc = tmp / "svc"
    svc.mkdir()
    shutil.copy(TASKS / "service" / "environment" / "server.py", svc / "server.py")
    app = tmp / "app"
    app.mkdir()
    (app / "README").write_text("the task's working directory\n")
    image = build_image(
        tmp / "harbor.tar",
        [LayerSpec(BASE_ROOTFS), LayerSpec(svc, prefix="/opt/svc"), LayerSpec(app, prefix="/app")],
        workdir="/app",
    )
    reports = import_dirs([TASKS], tmp / "tasks", image)
    assert all(r.valid for r in reports), reports
    return Harbor(image=image, tasks_dir=tmp / "tasks", cache=tmp / "image-cache")


from tests.integration.conftest import server_factory  # noqa: E402, F401  (a real server)
