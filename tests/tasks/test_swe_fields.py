"""The ``swe`` task fields, its sandbox spec, and the parsing pieces of SWE evaluation (no
sandbox needed)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from rollserve.errors import InvalidInputError
from rollserve.schema.jobs import Task
from rollserve.schema.sandbox import BwrapSpec
from rollserve.tasks.swe.evaluation import (
    junit_key,
    outcome_of,
    parse_junit,
    patch_paths,
    runnable_id,
)
from rollserve.tasks.swe.handler import SweHandler


def task(**fields: Any) -> Task:
    own = {
        "repo": "/prepared/repo",
        "env": "/prepared/env",
        "test_patch": "",
        "fail_to_pass": ["tests/test_a.py::test_a"],
        **fields,
    }
    return Task.model_validate({"task_id": "t", "kind": "swe", "prompt": "fix it", **own})


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"fail_to_pass": []}, "task.fail_to_pass"),
        ({"repo": "relative/repo"}, "task.repo"),
        ({"python_path": ["../outside"]}, "task.python_path"),
        ({"pass_to_pass": ["--co"]}, "task.pass_to_pass"),
        ({"test_timeout_s": 0}, "task.test_timeout_s"),
        ({"unknown": 1}, "task.unknown"),
    ],
)
def test_bad_fields_name_the_field(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInputError) as caught:
        SweHandler().fields(task(**fields))
    assert caught.value.details["field"] == field


def test_validate_wants_prepared_directories(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="prepare-swe") as caught:
        SweHandler().validate(task(repo=str(tmp_path)))
    assert caught.value.details["field"] == "task.repo"


def test_the_sandbox_is_the_repository_with_its_environment() -> None:
    base = BwrapSpec(env={"KEEP": "1"}, mounts=[Path("/data")])
    spec = SweHandler().sandbox_spec(task(python_path=[".", "src"]), base)
    assert isinstance(spec, BwrapSpec)
    assert spec.template == Path("/prepared/repo")
    assert spec.mounts == [Path("/data"), Path("/prepared/env")]
    assert spec.env["PATH"].startswith("/prepared/env/bin:")
    assert spec.env["PYTHONPATH"] == "/workspace:/workspace/src"
    assert spec.env["VIRTUAL_ENV"] == "/prepared/env"
    assert spec.env["KEEP"] == "1"
    assert SweHandler().tools(task()) == ["bash", "editor", "submit"]


def test_patch_paths() -> None:
    patch = (
        "diff --git a/src/x.py b/src/x.py\n--- a/src/x.py\n+++ b/src/x.py\n@@ -1 +1 @@\n-a\n+b\n"
        "diff --git a/new.py b/new.py\nnew file mode 100644\n--- /dev/null\n+++ b/new.py\n"
        "diff --git a/old name.py b/new name.py\nrename from old name.py\nrename to new name.py\n"
        '--- "a/t\\303\\251st.py"\t2024-01-01\n+++ "b/t\\303\\251st.py"\n'
    )
    assert patch_paths(patch) == ["src/x.py", "new.py", "old name.py", "new name.py", "tést.py"]


def test_junit_outcomes() -> None:
    report = b"""<?xml version="1.0"?><testsuites><testsuite>
      <testcase classname="tests.test_a" name="test_ok"/>
      <testcase classname="tests.test_a.TestK" name="test_m"><failure message="x"/></testcase>
      <testcase classname="tests.test_a" name="test_p[\\u2028]"/>
      <testcase classname="tests.test_a" name="test_p[b]"><error message="e"/></testcase>
      <testcase classname="tests.test_a" name="test_s"><skipped/></testcase>
      <testcase classname="" name="tests.test_broken"><error message="collection"/></testcase>
    </testsuite></testsuites>"""
    cases = parse_junit(report)
    assert junit_key("tests/test_a.py::TestK::test_m") == ("tests.test_a.TestK", "test_m")
    expected = {
        "tests/test_a.py::test_ok": "passed",
        "tests/test_a.py::TestK::test_m": "failed",
        "tests/test_a.py::test_p[\\u2028]": "passed",
        "tests/test_a.py::test_p": "error",
        "tests/test_a.py::test_s": "skipped",
        "tests/test_broken.py::test_x": "error",
        "tests/test_a.py::test_gone": "missing",
    }
    assert {node: outcome_of(node, cases) for node in expected} == expected


def test_truncated_ids_of_swe_bench_data() -> None:
    # SWE-bench cuts ids at the first space: "test_q[a: int]" is listed as "test_q[a:".
    report = b"""<?xml version="1.0"?><testsuites><testsuite>
      <testcase classname="tests.test_a" name="test_q[a: int]"/>
      <testcase classname="tests.test_a" name="test_q[a: str]"/>
      <testcase classname="tests.test_a" name="test_q[b: int]"><failure message="x"/></testcase>
    </testsuite></testsuites>"""
    cases = parse_junit(report)
    assert runnable_id("tests/test_a.py::test_q[a:") == "tests/test_a.py::test_q"
    assert runnable_id("tests/test_a.py::test_q[b]") == "tests/test_a.py::test_q[b]"
    assert outcome_of("tests/test_a.py::test_q[a:", cases) == "passed"
    assert outcome_of("tests/test_a.py::test_q[b:", cases) == "failed"
    assert outcome_of("tests/test_a.py::test_q[c:", cases) == "missing"


def test_setup_commands_see_no_secret_of_the_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Host-side setup commands (the dataset's) get the task's environment and an allow-list
    of rollserve's: never its API token or store password."""
    from rollserve.tasks.swe.build import setup
    from rollserve.tasks.swe.handler import SweFields

    monkeypatch.setenv("ROLLSERVE_API_TOKEN", "secret-token-value")
    monkeypatch.setenv("ROLLSERVE_STORE_PASSWORD", "secret-password")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret-key")
    monkeypatch.setenv("LANG", "C.UTF-8")
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "a.txt").write_text("a\n")
    for command in (["init", "-q"], ["add", "."], ["-c", "user.name=t", "-c", "user.email=t@t",
                    "commit", "-q", "-m", "one"]):  # fmt: skip
        subprocess.run(["git", *command], cwd=repo, check=True)
    fields = SweFields.model_construct(
        repo=repo, env=tmp_path / "env", python_path=["."], setup_commands=["env > seen.env"]
    )
    setup(fields)
    seen = (repo / "seen.env").read_text()
    assert "secret" not in seen
    assert "LANG=C.UTF-8" in seen and f"VIRTUAL_ENV={tmp_path / 'env'}" in seen
