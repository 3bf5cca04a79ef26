"""Finished rollserve jobs as Parquet, for analysis: one row a trajectory, in veRL's names.

No veRL trainer reads this file: veRL's Parquet inputs are prompt datasets, and trajectories
reach veRL through an agent loop (``rollserve.client.verl.RollserveAgentLoop``). The columns
follow veRL's ``AgentLoopOutput``: ``prompt_ids``, ``response_ids`` (generated tokens and
observation tokens), ``response_mask`` (1 for generated, 0 for observations),
``response_logprobs``, ``reward_score`` and ``num_turns`` (chat messages: user, assistant and
tool); ``uid`` is the job's ``group_id``. Provenance rides along: ``job_id``, ``exit_reason``
and each model turn's ``policy_version``. pyarrow is imported only when a file is written or
read (``pip install 'rollserve[train]'``)."""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from rollserve.errors import InvalidInputError
from rollserve.schema.jobs import JobView

COLUMNS = (
    "uid",
    "job_id",
    "prompt_ids",
    "response_ids",
    "response_mask",
    "response_logprobs",
    "reward_score",
    "num_turns",
    "exit_reason",
    "policy_versions",
)


class VerlExport(BaseModel):
    """What an export wrote, and which jobs it left out and why."""

    path: str
    rows: int
    skipped: dict[str, str] = Field(default_factory=dict, description="job id → reason")


def read_results(path: Path) -> list[JobView]:
    """Jobs from a JSONL results file, one ``JobView`` a line (``rollserve submit --out``, the
    demo's ``trajectories.jsonl``); a line that is not one names its number and field."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise InvalidInputError(f"cannot read {path}: {exc.strerror}", path=str(path)) from exc
    jobs = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            jobs.append(JobView.model_validate_json(line))
        except ValidationError as exc:
            problem = exc.errors()[0]
            where = ".".join(str(p) for p in problem["loc"]) or "the line"
            raise InvalidInputError(
                f"{path}:{number}: not a job view ({where}: {problem['msg']})",
                path=str(path),
                line=number,
            ) from None
    return jobs


def verl_rows(jobs: Iterable[JobView]) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """One veRL row per completed token-mode job, and the jobs skipped with the reason."""
    rows: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    for job in jobs:
        result = job.result
        if job.status != "completed" or result is None:
            skipped[job.job_id] = f"status {job.status}"
            continue
        tokens = result.tokens
        if tokens is None:
            skipped[job.job_id] = "no token ids (text mode)"
            continue
        rows.append(
            {
                "uid": job.group_id or job.job_id,
                "job_id": job.job_id,
                "prompt_ids": tokens.prompt_ids,
                "response_ids": tokens.response_ids,
                "response_mask": tokens.response_mask,
                "response_logprobs": tokens.response_logprobs,
                "reward_score": result.reward,
                "num_turns": len([m for m in result.messages if m.role != "system"]),
                "exit_reason": result.exit_reason.value,
                "policy_versions": [t.policy_version for t in tokens.turns],
            }
        )
    return rows, skipped


def _pyarrow() -> Any:
    """The pyarrow module with its parquet submodule loaded (pyarrow ships no type hints)."""
    try:
        pyarrow = importlib.import_module("pyarrow")
        importlib.import_module("pyarrow.parquet")
    except ImportError as exc:
        raise InvalidInputError(
            "writing veRL Parquet files needs pyarrow: pip install 'rollserve[train]' "
            "(or pip install pyarrow)"
        ) from exc
    return pyarrow


def _schema(pa: Any) -> Any:
    ids = pa.list_(pa.int64())
    return pa.schema(
        [
            ("uid", pa.string()),
            ("job_id", pa.string()),
            ("prompt_ids", ids),
            ("response_ids", ids),
            ("response_mask", ids),
            ("response_logprobs", pa.list_(pa.float64())),
            ("reward_score", pa.float64()),
            ("num_turns", pa.int64()),
            ("exit_reason", pa.string()),
            ("policy_versions", pa.list_(pa.int64())),
        ]
    )


def write_verl_parquet(jobs: Iterable[JobView], out: Path) -> VerlExport:
    """Write the completed token-mode jobs among ``jobs`` to ``out`` (Parquet); an error
    when none is left to write."""
    rows, skipped = verl_rows(jobs)
    if not rows:
        reasons = sorted(set(skipped.values()))
        raise InvalidInputError(
            f"no completed token-mode job to export ({len(skipped)} skipped: {reasons})"
        )
    pa = _pyarrow()
    table = pa.Table.from_pylist(rows, schema=_schema(pa))
    out.parent.mkdir(parents=True, exist_ok=True)
    pa.parquet.write_table(table, out)
    return VerlExport(path=str(out), rows=len(rows), skipped=skipped)


def read_verl_parquet(path: Path) -> list[dict[str, Any]]:
    """The rows of a file ``write_verl_parquet`` wrote, as dicts."""
    rows: list[dict[str, Any]] = _pyarrow().parquet.read_table(path).to_pylist()
    return rows
