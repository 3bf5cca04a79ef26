"""``rollserve images list|pull|prune`` as a user runs them."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.cli.test_cli import ROLLSERVE
from tests.images.conftest import tiny_image


def _images(*args: str, cache: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ROLLSERVE_IMAGE_CACHE_DIR": str(cache)}
    return subprocess.run(
        [ROLLSERVE, "images", *args], capture_output=True, text=True, env=env, timeout=120
    )


def test_pull_list_prune(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = tiny_image(tmp_path, {"a.txt": b"a\n"}, name="first", workdir="/srv")
    second = tiny_image(tmp_path, {"b.txt": b"b\n"}, name="second")
    pulled = _images("pull", first, second, cache=cache)
    assert pulled.returncode == 0, pulled.stderr
    assert pulled.stdout.count("sha256:") == 2
    listed = json.loads(_images("list", "--json", cache=cache).stdout)["images"]
    assert sorted(r for i in listed for r in i["refs"]) == sorted([first, second])
    by_ref = {i["refs"][0]: i for i in listed}
    assert by_ref[first]["workdir"] == "/srv" and by_ref[first]["files"] == 1
    assert "2 images" in _images("list", cache=cache).stdout
    pruned = _images("prune", "--all", cache=cache)
    assert pruned.returncode == 0, pruned.stderr
    assert "2 removed; 0 left" in pruned.stdout
    assert json.loads(_images("list", "--json", cache=cache).stdout)["images"] == []


def test_pull_of_a_missing_image_names_it(tmp_path: Path) -> None:
    missing = f"oci-archive:{tmp_path}/nope.tar"
    done = _images("pull", missing, cache=tmp_path / "cache")
    assert done.returncode != 0
    assert "image_not_found" in done.stderr and "nope.tar" in done.stderr
