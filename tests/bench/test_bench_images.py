"""``rollserve bench images`` with tiny parameters, as root and as an ordinary user (its own
file: it runs beside the other bench tests)."""

from __future__ import annotations

import os
import pwd

from tests.bench.conftest import bench
from tests.missing import missing


def test_bench_images_measures_the_same_images_as_root_and_as_an_ordinary_user() -> None:
    if os.geteuid() != 0:
        message = "running the bench as another user needs root"
        missing(message)
    user = "rollserve-test"  # the rootless suite's user (the Makefile's ROOTLESS_USER)
    args = ["--files", "50", "--starts", "3", "--concurrent", "2", "--backend", "bwrap"]
    report = bench("images", *args, "--kind", "oci-archive", "--kind", "dir", "--user", user)
    rows = {(r["user"], r["image_kind"]): r for r in report["results"]}
    assert set(rows) == {(u, k) for u in ("root", user) for k in ("oci-archive", "dir")}
    # An ordinary user's /testbed is an overlay too: the image cache's trees, and its copy of
    # the dir image, are its own.
    assert {r["workspace"] for r in rows.values()} == {"overlay"}
    assert all(r["files"] == 50 and r["starts"] == 3 for r in rows.values())
    assert {(w["user"], w["mode"]) for w in report["workspace"]} == {
        (u, m) for u in ("root", user) for m in ("overlay", "copy")
    }
    assert report["conversions"] == 1
    # a writable root, keeping its layer and a start over it, for each user
    layers = {(f["user"], f["backend"]): f for f in report["layers"]}
    assert set(layers) == {("root", "bwrap"), (user, "bwrap")}
    for figures in layers.values():
        assert figures["n"] == 3 and figures["written_mb"] == 10
        assert min(figures["start_p50_ms"], figures["keep_p50_ms"]) > 0
        assert figures["start_over_layer_p50_ms"] > 0
    assert pwd.getpwnam(user).pw_uid != 0
