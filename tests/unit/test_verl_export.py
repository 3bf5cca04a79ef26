"""The veRL export: finished jobs (as ``rollserve submit --out`` writes them) → Parquet rows in
veRL's agent-loop format, and back; through the function and through ``rollserve export``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rollserve.cli.app import app
from rollserve.client.parquet import COLUMNS, read_results, read_verl_parquet, write_verl_parquet
from rollserve.errors import InvalidInputError
from rollserve.schema.jobs import JobErrorInfo, JobView, RolloutResult
from rollserve.schema.tokens import Tokens, TurnInfo


def finished(job_id: str, group: str | None, reward: float, *, tokens: bool = True) -> JobView:
    trajectory = Tokens(
        prompt_ids=[5, 6, 7],
        response_ids=[20, 21, 22, 23],
        response_mask=[1, 1, 0, 1],
        response_logprobs=[-0.25, -1.5, 0.0, -0.125],
        turns=[
            TurnInfo(backend_id="b", model="m", policy_version=0, finish_reason="stop"),
            TurnInfo(backend_id="b", model="m", policy_version=1, finish_reason="stop"),
        ],
    )
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": "a"},
        {"role": "tool", "content": "t"},
        {"role": "assistant", "content": "b"},
    ]
    result = RolloutResult(
        reward=reward,
        exit_reason="submitted",
        messages=messages,
        turns=2,
        tokens=trajectory if tokens else None,
    )
    return JobView(job_id=job_id, group_id=group, status="completed", result=result)


def failed(job_id: str) -> JobView:
    error = JobErrorInfo(code="sandbox_died", message="gone")
    return JobView(job_id=job_id, group_id="g", status="failed", error=error)


JOBS = [
    finished("j0", "g", 1.0),
    finished("j1", "g", 0.25),
    failed("j2"),
    finished("j3", None, 0.5),
    finished("j4", "h", 1.0, tokens=False),
]


def write_jsonl(path: Path) -> Path:
    path.write_text("".join(json.dumps(j.model_dump(mode="json")) + "\n" for j in JOBS))
    return path


def test_round_trip(tmp_path: Path) -> None:
    jobs = read_results(write_jsonl(tmp_path / "results.jsonl"))
    assert [j.job_id for j in jobs] == ["j0", "j1", "j2", "j3", "j4"]
    export = write_verl_parquet(jobs, tmp_path / "out" / "rollouts.parquet")
    assert export.rows == 3
    assert export.skipped == {"j2": "status failed", "j4": "no token ids (text mode)"}
    rows = read_verl_parquet(tmp_path / "out" / "rollouts.parquet")
    assert [tuple(r) for r in rows] == [COLUMNS] * 3
    first = rows[0]
    assert first == {
        "uid": "g",
        "job_id": "j0",
        "prompt_ids": [5, 6, 7],
        "response_ids": [20, 21, 22, 23],
        "response_mask": [1, 1, 0, 1],
        "response_logprobs": [-0.25, -1.5, 0.0, -0.125],
        "reward_score": 1.0,
        "num_turns": 4,  # user, assistant, tool, assistant: veRL counts chat turns
        "exit_reason": "submitted",
        "policy_versions": [0, 1],
    }
    assert [r["uid"] for r in rows] == ["g", "g", "j3"]  # no group: the job is its own group
    assert [r["reward_score"] for r in rows] == [1.0, 0.25, 0.5]


def test_nothing_to_export(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="no completed token-mode job"):
        write_verl_parquet([failed("j2")], tmp_path / "x.parquet")


def test_a_bad_line_is_named(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps(JOBS[0].model_dump(mode="json")) + "\n{}\n")
    with pytest.raises(InvalidInputError, match=r"results\.jsonl:2"):
        read_results(path)


def test_cli(tmp_path: Path) -> None:
    results = write_jsonl(tmp_path / "results.jsonl")
    out = tmp_path / "rollouts.parquet"
    answer = CliRunner().invoke(app, ["export", "verl", str(results), "--out", str(out)])
    assert answer.exit_code == 0, answer.output
    assert "wrote 3 rows" in answer.output
    assert "skipped j2: status failed" in answer.output
    assert [r["job_id"] for r in read_verl_parquet(out)] == ["j0", "j1", "j3"]


def test_without_pyarrow_the_error_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow now fails
    with pytest.raises(InvalidInputError, match=r"pip install 'rollserve\[train\]'"):
        write_verl_parquet(JOBS, tmp_path / "x.parquet")
