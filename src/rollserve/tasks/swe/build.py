"""The host-side half of ``prepare-swe``: fetch a task's source (a release sdist through pip, or a
directory), make it a git repository with one commit, build its Python environment and run its
setup commands. Blocking; every failure is an InvalidInputError saying what went wrong."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from rollserve.errors import InvalidInputError
from rollserve.sandbox.env import SYSTEM_PATH
from rollserve.tasks.swe.evaluation import tail
from rollserve.tasks.swe.handler import SweFields

REQUIREMENT = r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9][A-Za-z0-9.+!_-]*)$"
_ARCHIVES = (".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".zip")
_GIT_USER = ["-c", "user.name=rollserve", "-c", "user.email=rollserve@localhost"]
STEP_TIMEOUT_S = 1800.0


def run(argv: list[str], *, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    """Run a host command to completion, its whole process group killed if it outlives the
    step timeout; its output, or InvalidInputError with the output's tail."""
    with subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    ) as proc:
        try:
            out, _ = proc.communicate(timeout=STEP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            out = f"timed out after {STEP_TIMEOUT_S:g}s".encode()
        finally:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
    output = out.decode(errors="replace")
    if proc.returncode != 0:
        raise InvalidInputError(f"{' '.join(argv[:3])} failed: {tail(output).strip()}")
    return output


def build(
    task_dir: Path, source: dict[str, Any], cache: Path, fields: SweFields, test_deps: list[str]
) -> None:
    """Lay out ``task_dir`` afresh: ``repo`` (``fields.repo``) and ``env`` (``fields.env``)."""
    remove(task_dir)
    task_dir.mkdir(parents=True)
    if "pypi" in source:
        _unpack(fetch_sdist(str(source["pypi"]), cache / "sdists"), fields.repo)
    else:
        directory = Path(source["path"])
        if not directory.is_dir():
            raise InvalidInputError(f"cannot fetch the source: {directory} is not a directory")
        shutil.copytree(
            directory, fields.repo, symlinks=True, ignore=shutil.ignore_patterns(".git")
        )
    git = ["git", "-c", "init.defaultBranch=main", *_GIT_USER]
    run([*git, "init", "-q"], cwd=fields.repo)
    run([*git, "add", "-A", "-f"], cwd=fields.repo)
    run(
        [*git, "commit", "-q", "--no-verify", "-m", f"{task_dir.name}: {json.dumps(source)}"],
        cwd=fields.repo,
    )
    run([sys.executable, "-m", "venv", "--without-pip", str(fields.env)])
    if test_deps:
        pip = [sys.executable, "-m", "pip", "--python", str(fields.env / "bin" / "python")]
        try:
            run([*pip, "install", "-q", "--disable-pip-version-check", *test_deps])
        except InvalidInputError as exc:
            raise InvalidInputError(f"installing the test deps failed: {exc.message}") from exc
    setup(fields)


def fetch_sdist(requirement: str, cache: Path) -> Path:
    """The sdist of ``NAME==VERSION`` from the package index, cached under ``cache``."""
    match = re.match(REQUIREMENT, requirement)
    if match is None:
        raise InvalidInputError(f"{requirement!r} is not NAME==VERSION")
    name = re.sub(r"[-_.]+", "-", match.group(1)).lower()
    entry = cache / f"{name}-{match.group(2)}"
    if not _archives(entry):
        shutil.rmtree(entry, ignore_errors=True)  # a stale, empty entry
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
            try:
                run([*pip, "--disable-pip-version-check", "-d", tmp, requirement])
            except InvalidInputError as exc:
                raise InvalidInputError(f"cannot fetch {requirement}: {exc.message}") from exc
            if not _archives(Path(tmp)):
                raise InvalidInputError(f"cannot fetch {requirement}: pip saved no sdist")
            with contextlib.suppress(OSError):  # a concurrent task cached it first
                os.rename(tmp, entry)
    return _archives(entry)[0]


def _archives(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if p.name.endswith(_ARCHIVES))


def _unpack(archive: Path, repo: Path) -> None:
    """An sdist's single top directory (or all of it) becomes ``repo``."""
    with tempfile.TemporaryDirectory(dir=repo.parent) as tmp:
        unpacked = Path(tmp) / "unpacked"
        if archive.name.endswith(".zip"):
            with zipfile.ZipFile(archive) as zipped:
                zipped.extractall(unpacked)
        else:
            with tarfile.open(archive) as tarred:
                tarred.extractall(unpacked, filter="data")
        tops = list(unpacked.iterdir())
        os.rename(tops[0] if len(tops) == 1 and tops[0].is_dir() else unpacked, repo)


# What of rollserve's own environment setup commands (the dataset's, run on the host) see:
# the locale, the home and temp directories, a proxy and a package index to build with; never
# the API token, the store's password or anything else the process was given.
_HOST_ENV_KEPT = frozenset(
    {"HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TERM", "TMPDIR", "SOURCE_DATE_EPOCH"}
)
_HOST_ENV_PREFIXES = (
    "LC_",
    "PIP_INDEX_URL",
    "PIP_EXTRA_INDEX_URL",
    "PIP_FIND_LINKS",
    "PIP_NO_INDEX",
)
_PROXIES = frozenset(
    {"http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY"}
)


def host_env(fields: SweFields) -> dict[str, str]:
    """What setup commands see on the host: the task's environment, as in its sandboxes, and
    an allow-list of this process's variables."""
    kept = {
        name: value
        for name, value in os.environ.items()
        if name in _HOST_ENV_KEPT or name in _PROXIES or name.startswith(_HOST_ENV_PREFIXES)
    }
    return {
        **kept,
        "PATH": f"{fields.env}/bin:{SYSTEM_PATH}",
        "VIRTUAL_ENV": str(fields.env),
        "PYTHONPATH": ":".join(str((fields.repo / p).resolve()) for p in fields.python_path),
    }


def setup(fields: SweFields) -> None:
    """Run the setup commands in the repository; files they create are kept out of the
    workspace's diff, tracked files they change are folded into the one commit."""
    if not fields.setup_commands:
        return
    for command in fields.setup_commands:
        try:
            run(["bash", "-c", command], cwd=fields.repo, env=host_env(fields))
        except InvalidInputError as exc:
            raise InvalidInputError(f"setup command failed: {command}: {exc.message}") from exc
    repo = fields.repo
    built = run(["git", "ls-files", "-o", "--exclude-standard", "-z"], cwd=repo)
    with (repo / ".git" / "info" / "exclude").open("a") as exclude:
        exclude.writelines(f"/{_escaped(name)}\n" for name in built.split("\0") if name)
    if run(["git", "status", "--porcelain", "-uno"], cwd=repo):
        run(["git", "add", "-u"], cwd=repo)
        run(["git", *_GIT_USER, "commit", "-q", "--no-verify", "--amend", "--no-edit"], cwd=repo)


def _escaped(name: str) -> str:
    """A file name as a literal gitignore pattern."""
    return re.sub(r"([][*?\\!# ])", r"\\\1", name)


def remove(task_dir: Path) -> None:
    """Remove a task's directory, whatever state it is in."""
    shutil.rmtree(task_dir, ignore_errors=True)
