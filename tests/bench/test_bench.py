"""``rollserve bench pipeline | overhead | scale | gateway | …`` with tiny parameters, as a
user runs them: each command succeeds and its ``--json`` figures have the documented keys and
add up. Behaviour only: no speed is asserted."""

from __future__ import annotations

import os
import pwd
from typing import Any

import psycopg
import pytest

from tests.bench.conftest import bench


def test_bench_pipeline_json() -> None:
    report = bench(
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
    report = bench("overhead", "--turns", "10", "--rollouts", "1", "--jobs", "3")
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
    report = bench("scale", "--max", "20", "--turns", "3", "--model-ms", "50")
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
    report = bench(
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
    sizes = ("--request-bytes", "3000", "--output-bytes", "20000")
    args = ("--seconds", "0.5", "--per-node", "10", "--batch", "3", *sizes)
    result = bench("store", "--store-url", pg_url, *args)
    assert result["store"] == "postgresql" and result["server"] == "given"
    assert (result["request_bytes"], result["output_bytes"], result["batch"]) == (3000, 20000, 3)
    with psycopg.connect(pg_url) as conn:  # the store's jobs and pgbench's carried the text
        lengths = conn.execute(
            "SELECT DISTINCT length(request #>> '{task,text}') FROM jobs"
            " WHERE job_id LIKE 'bench-%' OR job_id LIKE 'pg-%'"
        ).fetchall()
    assert lengths == [(3000,)]
    assert [r["clients"] for r in result["results"]] == [1, 4, 16]
    assert all(r["lifecycles"] > 0 for r in result["results"])
    assert all(r["client_cpu_ms"] > 0 for r in result["results"])
    assert all(r["server_cpu_ms"] is None for r in result["results"])  # not a server of ours
    for row in result["results"]:  # pgbench ran the same lifecycle on the same database
        assert row["pgbench_lifecycles_per_s"] > 0
        assert row["ratio"] == pytest.approx(
            row["lifecycles_per_s"] / row["pgbench_lifecycles_per_s"], abs=0.002
        )
    best = max(r["lifecycles_per_s"] for r in result["results"])
    assert result["nodes_served"] == int(best // 10)


def test_bench_nodes_runs_every_configuration(postgres: Any) -> None:
    """1 node on SQLite, then 1, 2 and 4 node processes on a throwaway PostgreSQL: every
    rollout completes once, through nodes that share one store."""
    result = bench("nodes", "--rollouts", "6", "--turns", "2", "--model-ms", "0")
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
    result = bench("soak", "--rollouts", "60", "--in-flight", "12")
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
