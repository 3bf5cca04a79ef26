"""Running rollserve as an ordinary user from a root process: how the test suite and ``rollserve
bench … --user`` check the rootless paths on one machine.

``as_user_argv`` wraps a command so that it runs as that user, with the interpreter and the
rollserve checkout reachable even where they live in a directory the user cannot enter (a
pyenv under ``/root``, a checkout in a 0700 home): in a private mount namespace of the command's
own, such a directory is covered by an empty tmpfs that holds only those paths, bound back in.
Nothing on the host changes. ``python -m rollserve.testing.users USER -- CMD…`` does the same
from a shell (the Makefile's rootless test run).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shlex
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import rollserve


@dataclass(frozen=True)
class User:
    """An account on this machine."""

    name: str
    uid: int
    gid: int
    home: Path


def ensure_user(name: str) -> User:
    """The account ``name``, made (a system user with a home directory) if it is missing."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        if os.geteuid() != 0:
            raise PermissionError(
                f"user {name!r} does not exist, and only root can add it"
            ) from None
        subprocess.run(
            ["useradd", "--system", "--create-home", "--home-dir", f"/home/{name}", name],
            check=True,
            capture_output=True,
        )
        entry = pwd.getpwnam(name)
    return User(entry.pw_name, entry.pw_uid, entry.pw_gid, Path(entry.pw_dir))


def needed_paths() -> list[Path]:
    """What a rollserve process needs to read: the interpreter's prefix (with pyenv, every
    version beside it: SWE-bench images copy an older CPython in), the environment's, and
    the rollserve package (its checkout, for an editable install)."""
    package = Path(rollserve.__file__).resolve().parent
    checkout = package.parents[1] if package.parent.name == "src" else package
    prefix = Path(sys.base_prefix).resolve()
    interpreters = prefix.parent if prefix.parent.name == "versions" else prefix
    paths = {interpreters, Path(sys.prefix).resolve(), checkout}
    # Only the outermost of nested paths is bound.
    return sorted(p for p in paths if not any(q in p.parents for q in paths))


def hidden_ancestor(path: Path, user: User) -> Path | None:
    """The outermost directory above ``path`` that ``user`` cannot enter, if any."""
    for ancestor in reversed(path.parents):
        if ancestor == Path("/"):
            continue
        info = ancestor.stat()
        if info.st_uid == user.uid:
            bit = stat.S_IXUSR
        elif info.st_gid == user.gid:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if not info.st_mode & bit:
            return ancestor
    return None


def expose_script(paths: list[Path], user: User) -> list[str]:
    """Shell lines (run as root in a private mount namespace) that make ``paths`` reachable
    for ``user`` through the directories it cannot enter."""
    lines: list[str] = []
    covered: dict[Path, list[Path]] = {}
    for path in paths:
        hidden = hidden_ancestor(path, user)
        if hidden is not None:
            covered.setdefault(hidden, []).append(path)
    for n, (hidden, inside) in enumerate(sorted(covered.items())):
        staged = [f"/run/rollserve-expose-{os.getpid()}-{n}-{i}" for i in range(len(inside))]
        for path, stage in zip(inside, staged, strict=True):
            lines.append(f"mkdir -p {stage} && mount --rbind {shlex.quote(str(path))} {stage}")
        lines.append(f"mount -t tmpfs -o mode=0755 tmpfs {shlex.quote(str(hidden))}")
        for path, stage in zip(inside, staged, strict=True):
            target = shlex.quote(str(path))
            lines.append(f"mkdir -p {target} && mount --move {stage} {target} && rmdir {stage}")
    return lines


def delegation(user: User, root: Path = Path("/sys/fs/cgroup")) -> list[Path]:
    """The cgroups a root process hands ``user`` the way systemd's ``Delegate=yes`` does: one
    below this process's own cgroup per v1 controller (memory, pids, freezer), or on v2 a
    directory whose leaf the command runs in (rollserve uses the leaf's parent)."""
    own: dict[str, str] = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            own[controller] = path.lstrip("/")
    name = f"rollserve-user-{user.uid}"
    v1 = [c for c in ("memory", "pids", "freezer") if (root / c).is_dir() and c in own]
    if v1:
        return [root / c / own[c] / name for c in v1]
    if (root / "cgroup.controllers").is_file() and "" in own:
        return [root / own[""] / name / "leaf"]
    return []


def delegation_script(dirs: list[Path], user: User) -> list[str]:
    """Shell lines (as root) that make ``dirs``, give them to ``user`` and move the shell
    (and so the command it becomes) into them."""
    lines = []
    for d in dirs:
        top = d.parent if d.name == "leaf" else d
        quoted = shlex.quote(str(d))
        lines.append(f"mkdir -p {quoted} && chown -R {user.uid}:{user.gid} {shlex.quote(str(top))}")
        lines.append(f"echo $$ > {quoted}/cgroup.procs")
    return lines


def as_user_argv(
    user: User,
    argv: list[str],
    env: dict[str, str] | None = None,
    delegate: list[Path] | None = None,
) -> list[str]:
    """``argv`` run as ``user`` (its groups, its home) from a root process, with rollserve's
    interpreter and checkout reachable, inside the cgroups ``delegate`` (see
    :func:`delegation`) where given; ``env`` is added to a minimal environment."""
    environment = {
        "HOME": str(user.home),
        "USER": user.name,
        "LOGNAME": user.name,
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LANG": "C.UTF-8",
        **(env or {}),
    }
    lines = ["set -e", *expose_script(needed_paths(), user)]
    lines += delegation_script(delegate or [], user)
    drop = [
        "setpriv",
        f"--reuid={user.uid}",
        f"--regid={user.gid}",
        "--init-groups",
        "--reset-env",
        "--",
        "env",
        *(f"{k}={v}" for k, v in environment.items()),
    ]
    lines.append(f'cd {shlex.quote(os.getcwd())} 2>/dev/null || cd /; exec {shlex.join(drop)} "$@"')
    script = "\n".join(lines)
    private = ["unshare", "--mount", "--propagation", "private", "--"]
    return [*private, "sh", "-c", script, "as-user", *argv]


def undelegate(dirs: list[Path]) -> None:
    """Remove delegated cgroups once their command ended (what is left in them stays)."""
    for d in dirs:
        top = d.parent if d.name == "leaf" else d
        for leftover in sorted(top.glob("**/"), key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                leftover.rmdir()


def main(args: list[str]) -> int:
    """``[--delegate] USER -- CMD…``: run CMD as USER (made if missing), in cgroups
    delegated to it with ``--delegate``, passing ``CI`` and ``ROLLSERVE_*`` variables
    through."""
    delegate = bool(args) and args[0] == "--delegate"
    args = args[1:] if delegate else args
    if len(args) < 3 or args[1] != "--":
        usage = "usage: python -m rollserve.testing.users [--delegate] USER -- CMD..."
        print(usage, file=sys.stderr)
        return 2
    user = ensure_user(args[0])
    passed = {k: v for k, v in os.environ.items() if k == "CI" or k.startswith("ROLLSERVE_")}
    dirs = delegation(user) if delegate else []
    try:
        return subprocess.call(as_user_argv(user, args[2:], passed, dirs))
    finally:
        undelegate(dirs)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
