"""rollserve's table of the SWE-bench harness's specifications, and the eval scripts written
from it for rows in the classic columns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollserve.errors import InvalidInputError
from rollserve.tasks.swebench import harness
from rollserve.tasks.swebench.specs import SpecTable

EXAMPLES = Path(__file__).parents[2] / "examples" / "swebench"
SWE_BENCH = [
    "astropy/astropy", "django/django", "matplotlib/matplotlib", "mwaskom/seaborn",
    "pallets/flask", "psf/requests", "pydata/xarray", "pylint-dev/pylint", "pytest-dev/pytest",
    "scikit-learn/scikit-learn", "sphinx-doc/sphinx", "sympy/sympy",
]  # fmt: skip
SWE_GYM = [
    "getmoto/moto", "python/mypy", "pandas-dev/pandas", "pydantic/pydantic", "iterative/dvc",
    "dask/dask", "conan-io/conan", "Project-MONAI/MONAI", "modin-project/modin",
    "facebookresearch/hydra", "bokeh/bokeh",
]  # fmt: skip


def diff(path: str, body: str = "@@ -1 +1 @@\n-a\n+b\n", new: bool = False) -> str:
    old = "/dev/null" if new else f"a/{path}"
    return f"diff --git a/{path} b/{path}\n--- {old}\n+++ b/{path}\n{body}"


@pytest.fixture(scope="module")
def table() -> SpecTable:
    return SpecTable.load()


@pytest.mark.parametrize("repo", SWE_BENCH + SWE_GYM)
def test_every_repository_has_specifications_and_a_parser_the_harness_ships(
    table: SpecTable, repo: str
) -> None:
    spec = table.repos[repo.lower()]
    assert spec.versions, repo
    assert harness.known_parser(spec.parser), spec.parser
    assert all(v.test_cmd.strip() for v in spec.versions.values())
    assert spec.source in table.sources


def test_the_script_is_the_one_swebench_4_wrote_for_the_shipped_row(table: SpecTable) -> None:
    # The shipped pylint row's eval_script was written by swebench 4.1.0's own
    # make_eval_script_list: the table's script for its classic columns must be the same text.
    [row] = [
        json.loads(line)
        for line in (EXAMPLES / "rows.jsonl").read_text().splitlines()
        if '"pylint-dev__pylint-4551"' in line
    ]
    spec = table.harness_spec(row["repo"], row["version"], row["base_commit"], row["test_patch"])
    assert spec.eval_script == row["eval_script"]
    assert spec.log_parser == "parse_log_pylint"  # 5.x's name of the same parser
    assert "swebench 4.1.0" in spec.source


def test_django_runs_its_runner_on_test_modules(table: SpecTable) -> None:
    patch = diff("tests/dbshell/test_postgresql.py") + diff("tests/x/fixtures/data.json")
    spec = table.harness_spec("django/django", "3.0", "abc", patch)
    lines = spec.eval_script.splitlines()
    test_line = lines[lines.index(": '>>>>> Start Test Output'") + 1]
    assert test_line == (
        "./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 "
        "dbshell.test_postgresql"
    )
    assert "export LC_ALL=en_US.UTF-8" in lines  # the version's pre-test commands
    assert "python -m pip install -e ." in lines  # and its install step
    # the test files are reset to the base commit before and after, new files are not
    assert (
        lines.count("git checkout abc tests/dbshell/test_postgresql.py tests/x/fixtures/data.json")
        == 2
    )
    assert spec.log_parser == "parse_log_django"
    assert (
        table.harness_spec("django/django", "1.9", "abc", patch).eval_script.count(
            "./tests/runtests.py --verbosity 2 dbshell.test_postgresql"
        )
        == 1
    )


def test_sympy_runs_bin_test_on_the_files(table: SpecTable) -> None:
    patch = diff("sympy/printing/tests/test_conventions.py") + diff("sympy/new_test.py", new=True)
    spec = table.harness_spec("sympy/sympy", "1.8", "abc", patch)
    assert (
        "PYTHONWARNINGS='ignore::UserWarning,ignore::SyntaxWarning' bin/test -C --verbose "
        "sympy/printing/tests/test_conventions.py sympy/new_test.py"
    ) in spec.eval_script.splitlines()
    assert "git checkout abc sympy/printing/tests/test_conventions.py" in spec.eval_script
    assert spec.log_parser == "parse_log_sympy"


def test_mypy_selects_the_cases_of_the_test_patch(table: SpecTable) -> None:
    body = "@@ -1,2 +1,6 @@\n [case testOld]\n+[case testNewOne]\n+x\n+[case testNewTwo]\n+y\n a\n"
    patch = diff("test-data/unit/check-x.test", body)
    spec = table.harness_spec("python/mypy", "1.4", "abc", patch)
    assert 'pytest -n0 -rA -k "testOld or testNewOne or testNewTwo"' in spec.eval_script
    assert "set +u\nconda activate testbed\nset -u" in spec.eval_script  # SWE-Gym's activation
    plain = table.harness_spec("python/mypy", "1.10", "abc", diff("mypy/test/testx.py"))
    assert "pytest -rA mypy/test/testx.py" in plain.eval_script.splitlines()


def test_swe_gym_dask_runs_pytest_without_workers(table: SpecTable) -> None:
    spec = table.harness_spec("dask/dask", "2022.8", "abc", diff("dask/array/tests/test_masked.py"))
    assert "pytest -n0 -rA  --color=no dask/array/tests/test_masked.py" in spec.eval_script
    assert spec.log_parser == "parse_log_pytest_v2"
    assert "SWE-Gym" in spec.source


def test_lookups_name_what_is_unknown(table: SpecTable) -> None:
    with pytest.raises(
        InvalidInputError, match="no test specification for 'nobody/nothing'"
    ) as bad:
        table.lookup("nobody/nothing", "1.0")
    assert bad.value.details["field"] == "task.repo"
    with pytest.raises(InvalidInputError, match=r"version '0\.1'.*known: .*1\.11") as bad:
        table.lookup("sympy/sympy", "0.1")
    assert bad.value.details["field"] == "task.version"
    with pytest.raises(InvalidInputError, match="version None"):
        table.lookup("sympy/sympy", None)
    assert table.lookup("DJANGO/Django", "3.0")[0].repo == "django/django"
