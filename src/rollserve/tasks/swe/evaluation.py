"""The steps of SWE evaluation inside a sandbox, shared by the ``swe`` handler and the validation
of ``rollserve tasks prepare-swe``: apply a patch (``git apply``, then a fuzzy ``patch -p1 -F2``
as the SWE-bench harness does), reset the files a test patch touches, run setup commands, run
pytest on node ids and read each test's outcome from its JUnit XML report."""

from __future__ import annotations

import re
import shlex
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

from rollserve.errors import SandboxPathError
from rollserve.sandbox.base import Sandbox

Outcome = Literal["passed", "failed", "error", "skipped", "missing"]
Applied = Literal["git apply", "patch -F2"]

OUTPUT_TAIL = 4000
PATCH_TIMEOUT_S = 120.0
# Hooks never run: a submission must not get code run by the harness's own git commands.
_GIT = "git -c core.hooksPath=/dev/null"
_GIT_APPLY = f"{_GIT} apply --verbose --whitespace=nowarn"
_FUZZY = "patch --batch --forward --no-backup-if-mismatch --reject-file=- -p1 -F2 -i"
# Restore each path from the commit, or remove it when the commit does not have it.
_RESET = (
    'for f in "$@"; do '
    f'if {_GIT} cat-file -e "HEAD:$f" 2>/dev/null; then {_GIT} checkout -q HEAD -- "$f" || exit 1; '
    'else rm -rf -- "$f" || exit 1; fi; done'
)
_SEVERITY: dict[str, int] = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}
_TAGS: tuple[tuple[str, Outcome], ...] = (
    ("error", "error"),
    ("failure", "failed"),
    ("skipped", "skipped"),
)


def scratch(sandbox: Sandbox) -> str:
    """Where patches and the test report go: under .git, outside the repository's files, and
    in the workspace, which outlives each command (a sandbox's /tmp may be private to one)."""
    return f"{sandbox.guest_workspace}/.git/rollserve"


def tail(text: str, limit: int = OUTPUT_TAIL) -> str:
    """The last ``limit`` characters of ``text``."""
    return text if len(text) <= limit else "…" + text[-limit:]


@dataclass
class PatchResult:
    """How a patch went in (``git apply`` or ``patch -F2``), or None with the tools' output."""

    applied: Applied | None
    output: str


async def apply_patch(sandbox: Sandbox, patch: str, name: str) -> PatchResult:
    """Apply ``patch`` to the repository in the workspace: ``git apply`` first (all or
    nothing), then a fuzzy ``patch -p1 -F2``."""
    try:
        data = patch.encode("utf-8", errors="surrogateescape")
    except UnicodeEncodeError as exc:  # a surrogate that stands for no byte
        return PatchResult(None, f"the patch is not text: {exc}")
    path = f"{scratch(sandbox)}/{name}.patch"
    await sandbox.write_file(path, data)
    outputs = []
    methods: tuple[tuple[Applied, str], ...] = (("git apply", _GIT_APPLY), ("patch -F2", _FUZZY))
    for method, command in methods:
        result = await sandbox.exec(f"{command} {shlex.quote(path)}", timeout=PATCH_TIMEOUT_S)
        outputs.append(f"$ {method}\n{result.stdout}{result.stderr}")
        if result.exit_code == 0:
            return PatchResult(method, tail("\n".join(outputs)))
    return PatchResult(None, tail("\n".join(outputs)))


def patch_paths(patch: str) -> list[str]:
    """The repository paths a unified diff names (old and new names, ``-p1``), in order.
    Lines inside a hunk are file contents, never headers, whatever they begin with."""
    found: dict[str, None] = {}
    for _, names in diff_headers(patch):
        for name in names:
            if name and name != "/dev/null":
                found.setdefault(name, None)
    return list(found)


def modified_files(patch: str) -> list[str]:
    """The files a diff changes that exist before it (its ``--- a/PATH`` names, not
    ``/dev/null``), in order: what the SWE-bench harness resets before a test patch."""
    found: dict[str, None] = {}
    for header, names in diff_headers(patch):
        if header == "---" and names[0] != "/dev/null":
            found.setdefault(names[0], None)
    return list(found)


def diff_headers(patch: str) -> Iterator[tuple[str, list[str]]]:
    """Each file header line of a diff: its kind (``diff``, ``---``, ``+++``, ``rename``)
    and the names it holds; hunk contents are skipped by their line counts."""
    old = new = 0  # lines of the current hunk still to come
    for line in patch.split("\n"):  # as git and patch read it: other line breaks are content
        if old > 0 or new > 0:
            kind = line[:1]
            if kind in (" ", ""):  # a context line ("": one whose space was stripped)
                old, new = old - 1, new - 1
                continue
            if kind in ("-", "+", "\\"):
                old -= kind == "-"
                new -= kind == "+"
                continue
            old = new = 0  # the hunk was cut short: read on as headers
        line = line.removesuffix("\r")
        if hunk := _HUNK.match(line):
            old, new = (1 if count is None else int(count) for count in hunk.groups())
        elif line.startswith("diff --git "):
            yield "diff", _git_header_names(line[len("diff --git ") :])
        elif line.startswith(("--- ", "+++ ")):
            yield line[:3], [_strip_prefix(_unquote(line[4:].split("\t")[0]))]
        elif line.startswith(("rename from ", "rename to ", "copy from ", "copy to ")):
            yield "rename", [_unquote(line.split(" ", 2)[2])]


_HUNK = re.compile(r"@@ -\d+(?:,(\d{1,9}))? \+\d+(?:,(\d{1,9}))? @@")


def _git_header_names(rest: str) -> list[str]:
    if rest.startswith('"'):
        return [
            _strip_prefix(_unquote(part)) for part in re.findall(r'"(?:[^"\\]|\\.)*"|\S+', rest)
        ]
    half = (len(rest) - 1) // 2
    if rest[half : half + 1] == " " and rest[2:half] == rest[half + 3 :]:
        return [rest[2:half]]  # "a/P b/P": the one unambiguous split
    old, _, new = rest.partition(" b/")
    return [_strip_prefix(old), new]


def _strip_prefix(name: str) -> str:
    return name if name == "/dev/null" else name.split("/", 1)[-1]


# Git's C-style quoting of unusual file names (``"a/x\ty"``): these escapes and \ooo octal bytes.
_ESCAPED = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92}
_OCTAL = re.compile(r"[0-3][0-7][0-7]")


def _unquote(name: str) -> str:
    """A name as git writes it, quoted or not; what is not a valid escape is kept as it is,
    and bytes that are not UTF-8 come back as surrogate escapes (the name's exact bytes)."""
    if len(name) < 2 or not (name.startswith('"') and name.endswith('"')):
        return name
    body, out, at = name[1:-1], bytearray(), 0
    while at < len(body):
        if body[at] == "\\" and at + 1 < len(body):
            if (escaped := _ESCAPED.get(body[at + 1])) is not None:
                out.append(escaped)
                at += 2
                continue
            if _OCTAL.match(body, at + 1):
                out.append(int(body[at + 1 : at + 4], 8))
                at += 4
                continue
        out += body[at].encode("utf-8", errors="surrogatepass")
        at += 1
    return out.decode("utf-8", errors="surrogateescape")


async def reset_files(sandbox: Sandbox, paths: list[str]) -> str | None:
    """Put ``paths`` back as the repository's commit has them (removed where it has none);
    the tools' output when that fails, else None."""
    if not paths:
        return None
    result = await sandbox.exec(["bash", "-c", _RESET, "reset", *paths], timeout=PATCH_TIMEOUT_S)
    return None if result.exit_code == 0 else tail(result.stdout + result.stderr)


@dataclass
class SetupResult:
    """The first failing setup command, if any, with the output of the commands run."""

    failed: str | None
    timed_out: bool
    output: str


async def run_setup(sandbox: Sandbox, commands: list[str], timeout_s: float) -> SetupResult:
    """Run ``commands`` in the repository root, in order; stop at the first that fails."""
    output = ""
    for command in commands:
        result = await sandbox.exec(command, timeout=timeout_s)
        output = tail(f"{output}$ {command}\n{result.stdout}{result.stderr}")
        if result.exit_code != 0:
            return SetupResult(command, result.timed_out, output)
    return SetupResult(None, False, output)


@dataclass
class TestRun:
    """Per-node-id outcomes of one pytest run, and what went wrong with the run itself."""

    outcomes: dict[str, Outcome] = field(default_factory=dict)
    exit_code: int | None = None
    timed_out: bool = False
    problem: str | None = None  # no report, unreadable report
    output: str = ""


async def run_tests(
    sandbox: Sandbox, node_ids: list[str], test_args: list[str], timeout_s: float
) -> TestRun:
    """Run pytest on ``node_ids`` (relative to the repository root) and read the outcomes."""
    report = f"{scratch(sandbox)}/report.xml"
    selected = list(dict.fromkeys(runnable_id(node_id) for node_id in node_ids))
    argv = [
        "python",
        "-m",
        "pytest",
        "-rA",
        "-p",
        "no:cacheprovider",
        f"--rootdir={sandbox.guest_workspace}",
        f"--junitxml={report}",
        *test_args,
        "--",
        *selected,
    ]
    await sandbox.exec(["rm", "-f", report], timeout=PATCH_TIMEOUT_S)
    result = await sandbox.exec(argv, timeout=timeout_s)
    run = TestRun(
        exit_code=result.exit_code,
        timed_out=result.timed_out,
        output=tail(result.stdout + result.stderr),
    )
    missing: dict[str, Outcome] = dict.fromkeys(node_ids, "missing")
    if result.timed_out:
        run.outcomes = missing
        return run
    try:
        cases = parse_junit(await sandbox.read_file(report))
    except SandboxPathError:
        run.problem = f"pytest wrote no report (exit code {result.exit_code})"
    except ET.ParseError as exc:
        run.problem = f"pytest's report is unreadable: {exc}"
    else:
        run.outcomes = {node_id: outcome_of(node_id, cases) for node_id in node_ids}
        return run
    run.outcomes = missing
    return run


def parse_junit(data: bytes) -> dict[tuple[str, str], Outcome]:
    """Each test case of a JUnit XML report by ``(classname, name)``, with its outcome."""
    cases: dict[tuple[str, str], Outcome] = {}
    for case in ET.fromstring(data).iter("testcase"):
        tags = {child.tag for child in case}
        outcome: Outcome = "passed"
        for tag, named in _TAGS:
            if tag in tags:
                outcome = named
                break
        key = (case.get("classname", ""), case.get("name", ""))
        if key not in cases or _SEVERITY[outcome] > _SEVERITY[cases[key]]:
            cases[key] = outcome
    return cases


def truncated(node_id: str) -> bool:
    """SWE-bench data cuts test ids at the first space (its log parsers split lines on
    whitespace): a parametrized id whose ``[`` is never closed."""
    return "[" in node_id and not node_id.endswith("]")


def runnable_id(node_id: str) -> str:
    """The id to hand pytest: a truncated parametrized id runs its whole function."""
    return node_id.partition("[")[0] if truncated(node_id) else node_id


def junit_key(node_id: str) -> tuple[str, str]:
    """The ``(classname, name)`` pytest's JUnit XML gives the test ``node_id``."""
    path, bracket, params = node_id.partition("[")
    names = path.split("::")
    names[0] = re.sub(r"\.py$", "", names[0].replace("/", "."))
    names[-1] += bracket + params
    return ".".join(names[:-1]), names[-1]


def outcome_of(node_id: str, cases: dict[tuple[str, str], Outcome]) -> Outcome:
    """The outcome of ``node_id``: its own test case, or the worst of its parametrized cases
    (of those matching a truncated id), or ``error`` when its module failed to collect;
    ``missing`` when the report lacks it."""
    classname, name = junit_key(node_id)
    if (classname, name) in cases:
        return cases[(classname, name)]
    if truncated(node_id):  # the cases whose parameters start as the id does, as the harness
        prefixed = [o for (c, n), o in cases.items() if c == classname and n.startswith(name)]
        if prefixed:
            return max(prefixed, key=lambda o: _SEVERITY[o])
    params = [o for (c, n), o in cases.items() if c == classname and n.startswith(name + "[")]
    if params:
        return max(params, key=lambda o: _SEVERITY[o])
    module = junit_key(node_id.split("::")[0])[1]
    if cases.get(("", module)) == "error":  # a collection error of the test's module
        return "error"
    return "missing"
