"""The isolating backends run for an ordinary user too: rollserve's exact sandbox command lines,
run as ``nobody`` (as root) or as the user running the suite (the rootless run), are isolated
and write through to the workspace."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollserve.sandbox import SandboxManager, spec_for
from rollserve.settings import Settings
from tests.conformance.conftest import require

NOBODY = 65534


@pytest.fixture
def unprivileged_dir() -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="rollserve-rootless-"))
    base.chmod(0o755)
    workspace = base / "workspace"
    workspace.mkdir()
    yield workspace
    shutil.rmtree(base)


async def test_sandbox_as_an_ordinary_user(
    settings: Settings, isolating_backend: str, unprivileged_dir: Path
) -> None:
    # The interpreter rollserve runs on here lives in root's home, which nobody cannot read;
    # an ordinary user's rollserve binds its own interpreter instead.
    settings = settings.model_copy(update={"bwrap_host_binds": []})
    manager = SandboxManager(settings)
    require(manager, isolating_backend)
    spec = spec_for(isolating_backend)
    image = await manager.images.runnable(spec.image, isolating_backend)  # type: ignore[union-attr]
    launcher = manager.backends.get(isolating_backend).launcher(
        spec, unprivileged_dir, image=image, guest_workspace=None
    )
    root = os.geteuid() == 0
    user = NOBODY if root else os.geteuid()
    if root:
        for path in unprivileged_dir.parent.rglob("*"):
            os.chown(path, NOBODY, NOBODY)
    drop = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"]
    script = "id -u; echo written > /workspace/out; tail -n +3 /proc/net/dev | cut -d: -f1"
    proc = subprocess.run(
        [*(drop if root else []), *launcher.argv(["bash", "-c", script])],
        env={**launcher.env, "HOME": str(unprivileged_dir.parent)},
        cwd=launcher.cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.split()
    assert lines[0] != "0"  # not root inside either: no privilege was gained
    assert lines[1:] == ["lo"]
    out = unprivileged_dir / "out"
    assert out.read_text() == "written\n"
    assert out.stat().st_uid == user
