"""The bridge to the SWE-bench harness (the ``swebench`` package, 5.x): a row's eval script as
the harness builds it, and grading as the harness grades — its log parser for the row's test
framework, its per-test report and its resolution rule."""

from __future__ import annotations

import importlib
import tempfile
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from rollserve.errors import InfrastructureError


@dataclass
class HarnessGrade:
    """What the harness made of one test run."""

    resolved: bool
    resolution: str  # RESOLVED_FULL, RESOLVED_PARTIAL, RESOLVED_NO
    graded: bool  # False: the log showed no usable test run (errored, patch failed, no markers)
    statuses: dict[str, str] = field(default_factory=dict)  # each test's status in the log
    report: dict[str, Any] = field(default_factory=dict)  # FAIL_TO_PASS/… success and failure


def _module(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise InfrastructureError(
            f"the SWE-bench harness is not installed ({exc}): pip install 'rollserve[swe]'"
        ) from exc


def harness_version() -> str:
    """The installed ``swebench`` version."""
    try:
        return metadata.version("swebench")
    except metadata.PackageNotFoundError:
        return "not installed"


def instance(fields: Any, image: str) -> dict[str, Any]:
    """The harness's instance dict of a task's fields."""
    return {
        "instance_id": fields.instance_id,
        "image": image,
        "repo": fields.repo,
        "version": fields.version or "",
        "FAIL_TO_PASS": fields.fail_to_pass,
        "PASS_TO_PASS": fields.pass_to_pass,
        "log_parser": fields.log_parser,
        "eval_type": fields.eval_type,
        "eval_script": fields.eval_script,
    }


def known_parser(name: str) -> bool:
    """Whether the harness has a log parser of this name."""
    parsers = _module("swebench.harness.log_parsers")
    return name in parsers.PARSER_REGISTRY


def eval_script(row: dict[str, Any]) -> str:
    """The script the harness runs in the instance's container (it records the test
    command's exit status between its output markers)."""
    utils = _module("swebench.harness.utils")
    return str(utils.make_test_spec(row).eval_script)


def grade(row: dict[str, Any], log: str) -> HarnessGrade:
    """Grade a test run's log (the eval script's stdout and stderr) with the harness."""
    utils = _module("swebench.harness.utils")
    grading = _module("swebench.harness.grading")
    constants = _module("swebench.harness.constants")
    spec = utils.make_test_spec(row)
    with tempfile.NamedTemporaryFile("w", suffix=".log", encoding="utf-8") as fh:
        fh.write(log)
        fh.flush()
        statuses, graded = grading.get_logs_eval(spec, fh.name)
    gold = {
        constants.FAIL_TO_PASS: spec.FAIL_TO_PASS,
        constants.PASS_TO_PASS: spec.PASS_TO_PASS,
    }
    eval_type = constants.EvalType(row["eval_type"]) if row.get("eval_type") else None
    kwargs = {"eval_type": eval_type} if eval_type is not None else {}
    report = grading.get_eval_tests_report(statuses, gold, **kwargs)
    resolution = str(grading.get_resolution_status(report))
    full = constants.ResolvedStatus.FULL.value
    return HarnessGrade(
        resolved=graded and resolution == full,
        resolution=resolution if graded else constants.ResolvedStatus.NO.value,
        graded=graded,
        statuses=dict(statuses),
        report=report,
    )
