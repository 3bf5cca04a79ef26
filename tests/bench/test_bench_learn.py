"""``rollserve bench learn`` with tiny parameters (its own file: the longest bench test runs
beside the others)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.bench.conftest import bench


def test_bench_learn_trains_both_ways_and_draws_the_curves(tmp_path: Path) -> None:
    out = tmp_path / "learn"
    short = ["--steps", "3", "--prompts", "2", "--generations", "4", "--eval-every", "2"]
    short += ["--heldout", "8", "--copy-steps", "5", "--warm-steps", "5", "--out", str(out)]
    result = bench("learn", *short)
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
