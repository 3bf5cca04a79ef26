"""``rollserve view``'s app over a results file: the same filters and order as the stores,
clear errors for a file that is not one, and the viewer's page without a token."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from rollserve.client.parquet import read_results
from rollserve.errors import InvalidInputError
from rollserve.schema.api import JobQuery
from rollserve.server.ui.offline import JobTable, create_offline_app, summary


def _view(job_id: str, kind: str, created: float, **fields: Any) -> dict[str, Any]:
    return {"job_id": job_id, "kind": kind, "status": "completed", "created": created, **fields}


def _result(reward: float, reason: str, version: int | None) -> dict[str, Any]:
    return {"reward": reward, "exit_reason": reason, "max_policy_version": version, "turns": 3}


@pytest.fixture
def results(tmp_path: Path) -> Path:
    """The store suite's jobs: a (math, 1.0, v2), b (math, 0.0, v1, group g), c (code,
    failed), d (code, queued)."""
    views = [
        _view("a", "math", 1000, result=_result(1.0, "submitted", 2)),
        _view("b", "math", 1001, group_id="g", result=_result(0.0, "max_turns", 1)),
        _view("c", "code", 1002, status="failed", error={"code": "sandbox_died", "message": "x"}),
        _view("d", "code", 1003, status="queued"),
    ]
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(v) + "\n" for v in views))
    return path


def _ids(path: Path, **query: Any) -> list[str]:
    rows = [summary(view) for view in read_results(path)]
    return [r.job_id for r in JobTable(rows).page(JobQuery.model_validate(query)).jobs]


def test_filters_and_order_are_the_stores(results: Path) -> None:
    assert _ids(results) == ["d", "c", "b", "a"]
    assert _ids(results, status=["completed"]) == ["b", "a"]
    assert _ids(results, kind="code") == ["d", "c"]
    assert _ids(results, group_id="g") == ["b"]
    assert _ids(results, exit_reason=["max_turns"]) == ["b"]
    assert _ids(results, reward_min=0.5) == ["a"]
    assert _ids(results, policy_version_max=1) == ["b"]
    assert _ids(results, created_after=1001, created_before=1003) == ["c", "b"]
    assert _ids(results, sort="reward") == ["a", "b", "d", "c"]
    assert _ids(results, sort="reward", order="asc") == ["b", "a", "c", "d"]
    assert _ids(results, limit=3, offset=3) == ["a"]


def test_a_file_that_is_not_results_names_the_line(tmp_path: Path, results: Path) -> None:
    broken = tmp_path / "broken.jsonl"
    broken.write_text(results.read_text() + '{"job_id": "x"}\n')
    with pytest.raises(InvalidInputError, match=r"broken.jsonl:5: not a job view \(status"):
        read_results(broken)
    with pytest.raises(InvalidInputError, match="cannot read"):
        read_results(tmp_path / "missing.jsonl")


def test_the_offline_app_answers_what_the_viewer_reads(results: Path) -> None:
    with TestClient(create_offline_app(results)) as http:
        status = http.get("/v1/status").json()
        assert status == {
            "offline": True,
            "source": str(results),
            "jobs": {"completed": 2, "failed": 1, "queued": 1},
        }
        assert http.get("/v1/jobs", params={"kind": "math"}).json()["total"] == 2
        refused = http.get("/v1/jobs", params={"status": "bogus"})
        assert refused.status_code == 422 and refused.json()["error"]["code"] == "invalid_input"
        missing = http.get("/v1/jobs/nothing/trajectory")
        assert missing.status_code == 404 and "results.jsonl" in missing.json()["error"]["message"]
        trajectory = http.get("/v1/jobs/c/trajectory").json()
        assert trajectory["error"]["code"] == "sandbox_died" and trajectory["live"] is False
        page_ = http.get("/ui/")
        assert page_.status_code == 200 and "/ui/static/app.js" in page_.text
        assert http.get("/ui/static/app.js").status_code == 200
