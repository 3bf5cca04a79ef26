"""How the SWE-bench harness tests an instance, for rows in the classic columns (no
``eval_script``): per repository and version, the test command and the steps before it, the
test directives it derives from the test patch, and its log parser.

The facts are rollserve's own table, ``specs.json`` beside this module: the SWE-bench
repositories as swebench 4.1.0 specified them (5.x moved the specifications into the rows
themselves), and the SWE-Gym repositories as SWE-Gym's fork of the harness does. Each entry
names where it was taken from. The script written here has the shape of swebench 4.1.0's
``make_eval_script_list_py``, so the 5.x harness grades its log as it grades a 5.x row's."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from rollserve.errors import InvalidInputError
from rollserve.tasks.swe.evaluation import diff_headers, modified_files

SPECS_FILE = Path(__file__).with_name("specs.json")
START_TEST_OUTPUT = ">>>>> Start Test Output"
END_TEST_OUTPUT = ">>>>> End Test Output"
HEREDOC = "EOF_114329324912"  # the harness's own delimiter: rows' scripts are compared by text
REPOSITORY = "/testbed"
ENV_NAME = "testbed"

Directives = Literal["files", "django", "mypy"]


@dataclass(frozen=True)
class VersionSpec:
    """What the harness runs for one version of a repository."""

    test_cmd: str
    install: str | None = None
    eval_commands: tuple[str, ...] = ()


@dataclass(frozen=True)
class RepoSpec:
    """One repository: its versions, its log parser, how directives come from a test patch."""

    repo: str
    source: str  # the key of the table's ``sources``: where the entry was taken from
    parser: str
    directives: Directives
    versions: dict[str, VersionSpec]
    nounset_off_for_conda: bool = False  # SWE-Gym: `conda activate` between set +u / set -u


@dataclass(frozen=True)
class HarnessSpec:
    """A classic row made gradable by the harness: its eval script and log parser."""

    eval_script: str
    log_parser: str
    source: str  # what the table entry was taken from, in words


class SpecTable:
    """The table: repositories by name (case-insensitive, as the harness's lookups are)."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.sources: dict[str, str] = {k: v["label"] for k, v in data["sources"].items()}
        self.non_test_extensions: tuple[str, ...] = tuple(data["non_test_extensions"])
        self.repos: dict[str, RepoSpec] = {}
        for repo, entry in data["repos"].items():
            versions = {
                version: VersionSpec(
                    test_cmd=spec["test_cmd"],
                    install=spec.get("install"),
                    eval_commands=tuple(spec.get("eval_commands", ())),
                )
                for spec in entry["specs"]
                for version in spec["versions"]
            }
            self.repos[repo.lower()] = RepoSpec(
                repo=repo,
                source=entry["source"],
                parser=entry["parser"],
                directives=entry["directives"],
                versions=versions,
                nounset_off_for_conda=entry["source"] == "swe-gym",
            )

    @classmethod
    def load(cls, path: Path = SPECS_FILE) -> SpecTable:
        """The table in ``path`` (rollserve's own by default)."""
        return cls(json.loads(path.read_text()))

    def lookup(self, repo: str, version: str | None) -> tuple[RepoSpec, VersionSpec]:
        """The entry of ``repo`` at ``version``; InvalidInputError naming what is unknown."""
        spec = self.repos.get(repo.lower())
        if spec is None:
            known = ", ".join(sorted(s.repo for s in self.repos.values()))
            raise InvalidInputError(
                f"task.repo: rollserve's SWE-bench table has no test specification for "
                f"{repo!r} (it knows {known}); give the row an eval_script and log_parser, "
                'or grade it with rollserve\'s pytest run ("grading": "pytest", '
                "`tasks import swebench --pytest-fallback`)",
                field="task.repo",
                repo=repo,
            )
        if version is None or version not in spec.versions:
            known = " ".join(_by_number(spec.versions))
            raise InvalidInputError(
                f"task.version: {spec.repo} has no test specification for version {version!r} "
                f"in rollserve's SWE-bench table (known: {known})",
                field="task.version",
                repo=spec.repo,
                version=version,
            )
        return spec, spec.versions[version]

    def harness_spec(
        self, repo: str, version: str | None, base_commit: str, test_patch: str
    ) -> HarnessSpec:
        """The eval script and log parser the harness would use for this instance."""
        spec, version_spec = self.lookup(repo, version)
        script = eval_script(
            spec, version_spec, base_commit=base_commit, test_patch=test_patch,
            non_test_extensions=self.non_test_extensions,
        )  # fmt: skip
        return HarnessSpec(script, spec.parser, self.sources[spec.source])


def test_command(
    spec: RepoSpec, version: VersionSpec, test_patch: str, non_test_extensions: tuple[str, ...]
) -> str:
    """The test command line: the version's command and the test patch's files (not data
    files); for django their module names; for mypy, whose command ends in ``-k``, the
    ``[case NAME]`` blocks the patch touches (its files when it names none)."""
    command = version.test_cmd
    if spec.directives == "mypy":
        cases = re.findall(r"\[case ([^\]]+)\]", test_patch)
        if cases:
            return f'{command} "{" or ".join(cases)}"'
        command = command.rstrip().removesuffix("-k").rstrip()
    files = [names[-1] for kind, names in diff_headers(test_patch) if kind == "diff"]
    files = [f for f in files if not f.endswith(non_test_extensions)]
    if spec.directives == "django":
        files = [f.removesuffix(".py").removeprefix("tests/").replace("/", ".") for f in files]
    return " ".join([command, *files])


def eval_script(
    spec: RepoSpec,
    version: VersionSpec,
    *,
    base_commit: str,
    test_patch: str,
    non_test_extensions: tuple[str, ...],
) -> str:
    """The instance's eval script: activate the environment, the version's pre-test
    commands and install step, reset the test files, apply the test patch, run the tests
    between the harness's output markers, reset the test files again."""
    files = " ".join(modified_files(test_patch))
    reset = f"git checkout {base_commit} {files}"
    activate = [f"conda activate {ENV_NAME}"]
    if spec.nounset_off_for_conda:  # conda's activation scripts read unset variables
        activate = ["set +u", *activate, "set -u"]
    commands = [
        "source /opt/miniconda3/bin/activate",
        *activate,
        f"cd {REPOSITORY}",
        *version.eval_commands,
        f"git config --global --add safe.directory {REPOSITORY}",
        f"cd {REPOSITORY}",
        "git status",
        "git show",
        f"git -c core.fileMode=false diff {base_commit}",
        "source /opt/miniconda3/bin/activate",
        *activate,
        *([version.install] if version.install else []),
        reset,
        f"git apply -v - <<'{HEREDOC}'\n{test_patch}\n{HEREDOC}",
        f": '{START_TEST_OUTPUT}'",
        test_command(spec, version, test_patch, non_test_extensions),
        f": '{END_TEST_OUTPUT}'",
        reset,
    ]
    return "\n".join(["#!/bin/bash", "set -uxo pipefail", *commands]) + "\n"


def _by_number(versions: dict[str, VersionSpec]) -> list[str]:
    def key(version: str) -> tuple[int, ...]:
        return tuple(int(part) for part in re.findall(r"\d+", version))

    return sorted(versions, key=key)
