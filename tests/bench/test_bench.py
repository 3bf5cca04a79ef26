"""``rollserve bench pipeline | overhead | scale | gateway | …`` with tiny parameters, as a
user runs them: each command succeeds and its ``--json`` figures have the documented keys and
add up. Behaviour only: no speed is asserted."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from rollserve.sandbox import SandboxManager
from rollserve.settings import Settings
from tests.conformance.conftest import require
from tests.missing import missing

ROLLSERVE = shutil.which("rollserve") or str(Path(__file__).parents[2] / ".venv/bin/rollserve")


@pytest.fixture(autouse=True)
def _bwrap(tmp_path: Path) -> None:
    require(SandboxManager(Settings(data_dir=tmp_path / "data")), "bwrap")


def _bench(*args: str) -> dict[str, Any]:
    proc = subprocess.run(
        [ROLLSERVE, "bench", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=600,  # a guard against a hang; a loaded machine takes minutes
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    report: dict[str, Any] = json.loads(proc.stdout)
    return report


def test_bench_pipeline_json() -> None:
    report = _bench(
        "pipeline",
        *("--rollouts", "6", "--slots", "2", "--turns", "3"),
        *("--model-ms", "20", "--init-ms", "10", "--eval-ms", "20"),
    )
    assert set(report) == {"modes", "speedup_vs_coupled", "speedup_vs_sync"}
    modes = report["modes"]
    assert set(modes) == {"pipeline", "coupled", "sync"}
    for name, mode in modes.items():
        assert mode["mode"] == name
        assert mode["rollouts"] == 6
        assert (mode["completed"], mode["failed"]) == (6, 0)
        assert mode["model_calls"] == 6 * 3
        assert mode["rollouts_per_s"] > 0 and mode["seconds"] > 0
        assert 0 < mode["p50_s"] <= mode["p99_s"]
        assert 0 <= mode["slot_idle_fraction"] <= 1
        assert mode["peak_sandboxes"] >= 1
    assert modes["pipeline"]["workers"] == {"init": 1, "run": 2, "eval": 4}
    for name in ("coupled", "sync"):
        assert modes[name]["workers"] == {"workers": 2}
        # A worker closes its rollout's sandbox before evaluating in a fresh one.
        assert modes[name]["peak_sandboxes"] <= 2
    for name in ("coupled", "sync"):
        ratio = modes["pipeline"]["rollouts_per_s"] / modes[name]["rollouts_per_s"]
        assert report[f"speedup_vs_{name}"] == pytest.approx(ratio, abs=0.01)


def test_bench_overhead_json() -> None:
    report = _bench("overhead", "--turns", "10", "--rollouts", "1", "--jobs", "3")
    assert set(report) == {
        "turn",
        "turn_without_command",
        "shell",
        "overhead_per_turn_p50_ms",
        "job",
        "job_stages_p50_ms",
        "job_turns",
    }
    for name in ("turn", "turn_without_command"):
        assert report[name]["n"] == 10 - 3  # the first two turns (the shell starts) left out
    assert report["shell"]["n"] == 100
    assert report["job"]["n"] == 3
    for name in ("turn", "turn_without_command", "shell", "job"):
        assert 0 < report[name]["p50_ms"] <= report[name]["p99_ms"]
    stages = report["job_stages_p50_ms"]
    assert set(stages) == {"init", "run", "eval", "rest"}
    assert all(stages[k] > 0 for k in ("init", "run", "eval"))
    assert report["overhead_per_turn_p50_ms"] == pytest.approx(
        report["turn"]["p50_ms"] - report["shell"]["p50_ms"], abs=0.002
    )


def test_bench_scale_json() -> None:
    report = _bench("scale", "--max", "20", "--turns", "3", "--model-ms", "50")
    assert set(report) == {
        "user",
        "turns",
        "model_latency_ms",
        "nofile_limit",
        "steps",
        "max_sustained",
    }
    assert report["user"] == pwd.getpwuid(os.geteuid()).pw_name
    assert report["nofile_limit"] >= 1024
    [step] = report["steps"]
    assert step["rollouts"] == step["concurrent"] == step["completed"] == 20
    assert step["errors"] == step["retried"] == 0
    assert step["peak_sandboxes"] >= 20
    assert step["processes"] > 20  # this process, and each rollout's sandbox and shell
    assert 0 < step["pss_mib"] <= step["rss_mib"]
    assert 0 < step["p50_s"] <= step["p99_s"]
    assert 0 < step["turn_p50_ms"] <= step["turn_p99_ms"]
    assert 0 < step["close_p50_ms"] <= step["close_p99_ms"]
    assert 0 < step["busy_close_p50_ms"] <= step["busy_close_p99_ms"]
    assert report["max_sustained"] == 20


def test_bench_gateway_json() -> None:
    report = _bench(
        "gateway",
        "--concurrency",
        "1",
        "--concurrency",
        "3",
        "--turns",
        "2",
        "--generation-ms",
        "20",
    )
    assert set(report) == {"turns", "generation_ms", "results", "goal_overhead_p50_ms"}
    assert report["generation_ms"] == 20
    assert [row["concurrency"] for row in report["results"]] == [1, 3]
    for row in report["results"]:
        assert row["calls"] == row["concurrency"] * 2
        assert 20 <= row["direct_p50_ms"] <= row["direct_p99_ms"]  # the backend's 20 ms
        assert 0 < row["gateway_p50_ms"] <= row["gateway_p99_ms"]
        assert row["overhead_p50_ms"] == pytest.approx(
            row["gateway_p50_ms"] - row["direct_p50_ms"], abs=0.002
        )
        assert row["overhead_p99_ms"] == pytest.approx(
            row["gateway_p99_ms"] - row["direct_p99_ms"], abs=0.002
        )


def test_bench_store_counts_whole_lifecycles(pg_url: str) -> None:
    result = _bench("store", "--store-url", pg_url, "--seconds", "0.5", "--per-node", "10")
    assert result["store"] == "postgresql" and result["server"] == "given"
    assert [r["clients"] for r in result["results"]] == [1, 4, 16]
    assert all(r["lifecycles"] > 0 for r in result["results"])
    assert all(r["client_cpu_ms"] > 0 for r in result["results"])
    assert all(r["server_cpu_ms"] is None for r in result["results"])  # not a server of ours
    best = max(r["lifecycles_per_s"] for r in result["results"])
    assert result["nodes_served"] == int(best // 10)


def test_bench_nodes_runs_every_configuration(postgres: Any) -> None:
    """1 node on SQLite, then 1, 2 and 4 node processes on a throwaway PostgreSQL: every
    rollout completes once, through nodes that share one store."""
    result = _bench("nodes", "--rollouts", "6", "--turns", "2", "--model-ms", "0")
    assert [(s["store"], s["nodes"]) for s in result["steps"]] == [
        ("sqlite", 1),
        ("postgresql", 1),
        ("postgresql", 2),
        ("postgresql", 4),
    ]
    for step in result["steps"]:
        assert step["rollouts"] == step["completed"] == 6
        assert step["errors"] == step["duplicate_runs"] == step["retried"] == 0
        assert 0 < step["turn_gap_p50_ms"] <= step["turn_gap_p99_ms"]


def test_bench_soak_accounts_for_every_rollout_and_leaves_nothing() -> None:
    result = _bench("soak", "--rollouts", "60", "--in-flight", "12")
    assert result["outcomes"] == {kind: 10 for kind in (
        "rewarded", "unrewarded", "max_turns", "retried", "failed", "cancelled")}  # fmt: skip
    assert result["statuses"] == {"completed": 40, "failed": 10, "cancelled": 10}
    # a rollout runs each stage once unless it fails: no lease lapses, no job taken twice
    attempts = result["attempts"]
    assert attempts["rewarded"] == attempts["unrewarded"] == attempts["max_turns"] == 1
    assert attempts["retried"] == attempts["failed"] == 2
    assert result["lost"] == result["duplicates"] == 0
    assert result["sandbox_dirs_left"] == result["processes_left"] == 0
    assert set(result["drift_pct"]) == {"fds", "threads", "rss_mib", "processes"}
    assert result["end"]["sandbox_dirs"] == result["end"]["processes"] == 0
    assert all(s["fds"] > 0 and s["threads"] > 0 for s in result["samples"])


def test_bench_learn_trains_both_ways_and_draws_the_curves(tmp_path: Path) -> None:
    out = tmp_path / "learn"
    short = ["--steps", "3", "--prompts", "2", "--generations", "4", "--eval-every", "2"]
    short += ["--heldout", "8", "--copy-steps", "5", "--warm-steps", "5", "--out", str(out)]
    result = _bench("learn", *short)
    assert json.loads((out / "learn.json").read_text()) == result
    assert Path(result["plot"]) == (out / "learn.png").resolve()
    assert Path(result["plot"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for key in ("heldout_before", "heldout_after", "wall_s", "sync_step_s", "decoupled_step_s"):
        assert isinstance(result[key], float), key
    assert [set(s) for s in result["steps"]] == [{"step", "train_reward", "heldout_reward"}] * 3
    assert [s["heldout_reward"] is None for s in result["steps"]] == [True, False, False]
    assert result["train_instances"] == 6 and result["heldout_instances"] == 8
    runs = {run["mode"]: run for run in result["runs"]}
    assert result["main"] == "decoupled" and set(runs) == {"synchronous", "decoupled"}
    synchronous, decoupled = runs["synchronous"]["steps"], runs["decoupled"]["steps"]
    # Synchronous: each batch asked for, every turn by the policy of that step.
    assert [s["prefetched"] for s in synchronous] == [False, False, False]
    assert [s["stale_turns"] for s in synchronous] == [0.0, 0.0, 0.0]
    # Decoupled: after the first, each batch was generated while the trainer updated.
    assert [s["prefetched"] for s in decoupled] == [False, True, True]
    for run in result["runs"]:
        assert 0.0 <= run["heldout_before"] <= 1.0 and 0.0 <= run["heldout_after"] <= 1.0
        assert all(0.0 <= s["train_reward"] <= 1.0 for s in run["steps"])
        assert run["rollout_s"] > 0 and run["update_s"] > 0 and run["sync_s"] > 0


def test_bench_images_measures_the_same_images_as_root_and_as_an_ordinary_user() -> None:
    if os.geteuid() != 0:
        message = "running the bench as another user needs root"
        missing(message)
    user = "rollserve-test"  # the rootless suite's user (the Makefile's ROOTLESS_USER)
    args = ["--files", "50", "--starts", "3", "--concurrent", "2", "--backend", "bwrap"]
    report = _bench("images", *args, "--kind", "oci-archive", "--kind", "dir", "--user", user)
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
