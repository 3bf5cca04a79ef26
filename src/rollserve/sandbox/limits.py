"""Per-sandbox resource limits: a cgroup where the host lets us write one, rlimits otherwise."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import resource
import shlex
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from rollserve.schema.sandbox import LimitCheck, SandboxLimits

log = logging.getLogger(__name__)

_MB = 1024 * 1024


_SUBTREE = "rollserve"  # the directory under a place that holds its sandboxes' cgroups
_V1_CONTROLLERS = ("memory", "pids", "freezer")


@dataclass(frozen=True)
class CgroupPlace:
    """Where a node makes its sandboxes' cgroups: under ``top`` (one directory per cgroup v1
    controller, or the one v2 directory, keyed ``""``), in ``top/rollserve/<sandbox>``.

    As root that is the hierarchy's root. Otherwise it is a subtree delegated to rollserve's
    user (systemd's ``Delegate=yes``, a batch system's job cgroup): on v1 the process's own
    cgroup of each controller, where the user may write it; on v2 the parent of the process's
    own cgroup (a cgroup that holds processes cannot give controllers to children)."""

    version: int
    top: dict[str, Path]
    delegated: bool

    @classmethod
    def find(cls, root: Path, self_cgroup: str | None = None) -> CgroupPlace | None:
        """The place on this host for this process (None: no cgroup it may write);
        ``self_cgroup`` is ``/proc/self/cgroup``'s text (read here when not given)."""
        v1 = [c for c in _V1_CONTROLLERS if (root / c).is_dir()]
        v2 = not v1 and (root / "cgroup.controllers").is_file()
        if os.geteuid() == 0:
            if v1:
                return cls(1, {c: root / c for c in v1}, delegated=False)
            return cls(2, {"": root}, delegated=False) if v2 else None
        if self_cgroup is None:
            try:
                self_cgroup = Path("/proc/self/cgroup").read_text()
            except OSError:
                return None
        own = _own_cgroups(self_cgroup)
        if v1:
            top = {
                c: root / c / own[c].lstrip("/")
                for c in v1
                if c in own and _writable(root / c / own[c].lstrip("/"))
            }
            return cls(1, top, delegated=True) if top else None
        if v2 and "" in own and own[""] != "/":
            parent = (root / own[""].lstrip("/")).parent
            control = parent / "cgroup.subtree_control"
            if parent != root and _writable(parent) and _writable(control):
                return cls(2, {"": parent}, delegated=True)
        return None

    def describe(self) -> str:
        """Where, in words (``rollserve sandbox check``)."""
        where = ", ".join(str(d / _SUBTREE) for d in self.top.values())
        kind = "a subtree delegated to this user" if self.delegated else "the hierarchy's root"
        return f"cgroup v{self.version}, {kind}: {where}"


def _own_cgroups(text: str) -> dict[str, str]:
    """This process's cgroup per v1 controller, and under ``""`` its v2 cgroup."""
    own: dict[str, str] = {}
    for line in text.splitlines():
        _, controllers, path = line.split(":", 2) if line.count(":") >= 2 else ("", "", "")
        if not path:
            continue
        for controller in controllers.split(",") if controllers else [""]:
            own[controller] = path
    return own


def _writable(path: Path) -> bool:
    return os.access(path, os.W_OK | (os.X_OK if path.is_dir() else 0))


@dataclass
class Cgroup:
    """The cgroup directories of one sandbox (one per v1 controller, or one v2 directory)."""

    dirs: list[Path]
    version: int
    controllers: set[str] = field(default_factory=set)

    @classmethod
    def create(cls, place: CgroupPlace | None, name: str, limits: SandboxLimits) -> Cgroup | None:
        """Make and configure the sandbox's cgroup; None where cgroups are not writable."""
        if place is None:
            return None
        if place.version == 1:
            return cls._create_v1(place, name, limits)
        return cls._create_v2(place.top[""], name, limits)

    @classmethod
    def _create_v1(cls, place: CgroupPlace, name: str, limits: SandboxLimits) -> Cgroup | None:
        group = cls(dirs=[], version=1)
        paths: dict[str, Path] = {}
        for ctrl, top in place.top.items():
            path = top / _SUBTREE / name
            try:
                path.mkdir(parents=True, exist_ok=True)
            except OSError:
                continue
            group.dirs.append(path)
            group.controllers.add(ctrl)
            paths[ctrl] = path
        if not group.dirs:
            return None
        try:
            if limits.memory_mb and "memory" in paths:
                _write(paths["memory"] / "memory.limit_in_bytes", str(limits.memory_mb * _MB))
                swap = paths["memory"] / "memory.memsw.limit_in_bytes"
                if swap.exists():
                    _write(swap, str(limits.memory_mb * _MB))
            if limits.max_processes and "pids" in paths:
                _write(paths["pids"] / "pids.max", str(limits.max_processes))
        except OSError:
            log.warning("cannot set cgroup limits under %s; using rlimits", place, exc_info=True)
            group.remove()
            return None
        return group

    @classmethod
    def _create_v2(cls, top: Path, name: str, limits: SandboxLimits) -> Cgroup | None:
        parent = top / _SUBTREE
        try:
            parent.mkdir(exist_ok=True)
            available = set((top / "cgroup.controllers").read_text().split())
            wanted = available & {"memory", "pids"}
            if wanted:
                _write(top / "cgroup.subtree_control", " ".join(f"+{c}" for c in wanted))
                _write(parent / "cgroup.subtree_control", " ".join(f"+{c}" for c in wanted))
            path = parent / name
            path.mkdir(exist_ok=True)
        except OSError:
            return None
        group = cls(dirs=[path], version=2)
        try:
            group.controllers = set((path / "cgroup.controllers").read_text().split())
            if limits.memory_mb and "memory" in group.controllers:
                _write(path / "memory.max", str(limits.memory_mb * _MB))
                with contextlib.suppress(OSError):  # absent where swap is not accounted
                    _write(path / "memory.swap.max", "0")
            if limits.max_processes and "pids" in group.controllers:
                _write(path / "pids.max", str(limits.max_processes))
        except OSError:
            log.warning("cannot set cgroup limits under %s; using rlimits", top, exc_info=True)
            group.remove()
            return None
        return group

    @property
    def join_files(self) -> list[str]:
        """The files a (single-threaded) process writes ``0`` into to join the cgroup.

        On v1 that is ``tasks``: moving only the calling thread skips the global
        threadgroup lock whose RCU grace period makes a ``cgroup.procs`` write cost ~10 ms
        on an idle host; for a single-threaded process the effect is the same.
        """
        name = "tasks" if self.version == 1 else "cgroup.procs"
        return [str(d / name) for d in self.dirs]

    def pids(self) -> set[int]:
        """Every process currently in the cgroup."""
        found: set[int] = set()
        for d in self.dirs:
            with contextlib.suppress(OSError):
                found.update(int(x) for x in (d / "cgroup.procs").read_text().split())
        return found

    def kill_all(self, deadline_s: float = 5.0) -> None:
        """SIGKILL every process in the cgroup, freezing it first so a fork bomb cannot race."""
        if self.version == 2 and (self.dirs[0] / "cgroup.kill").exists():
            with contextlib.suppress(OSError):
                _write(self.dirs[0] / "cgroup.kill", "1")
        freezer = next((d for d in self.dirs if (d / "freezer.state").exists()), None)
        end = time.monotonic() + deadline_s
        while (pids := self.pids()) and time.monotonic() < end:
            if freezer is not None:
                with contextlib.suppress(OSError):
                    _write(freezer / "freezer.state", "FROZEN")
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if freezer is not None:
                with contextlib.suppress(OSError):
                    _write(freezer / "freezer.state", "THAWED")
            time.sleep(0.005)

    def remove(self) -> None:
        """Remove the cgroup directories; raises OSError if one stays busy."""
        for d in self.dirs:
            for attempt in range(100):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY or attempt == 99:
                        raise
                    time.sleep(0.01)

    def limit_events(self) -> dict[str, int]:
        """How often each limit was hit so far: ``max_processes`` (forks refused at the
        pids limit) and ``memory_mb`` (processes killed at the memory limit)."""
        events: dict[str, int] = {}
        for d in self.dirs:
            for name, key, limit in (
                ("pids.events", "max", "max_processes"),
                ("memory.events", "oom_kill", "memory_mb"),  # v2
                ("memory.oom_control", "oom_kill", "memory_mb"),  # v1
            ):
                with contextlib.suppress(OSError, ValueError):
                    for line in (d / name).read_text().splitlines():
                        field_name, _, value = line.partition(" ")
                        if field_name == key:
                            events[limit] = events.get(limit, 0) + int(value)
        return events


_PRLIMIT_OPTION = {
    resource.RLIMIT_CORE: "--core",
    resource.RLIMIT_FSIZE: "--fsize",
    resource.RLIMIT_AS: "--as",
    resource.RLIMIT_NPROC: "--nproc",
}


def rlimits_for(limits: SandboxLimits, cgroup: Cgroup | None) -> list[tuple[int, int]]:
    """The rlimits to set in every sandbox process; memory and processes fall back to rlimits
    only where no cgroup enforces them."""
    out: list[tuple[int, int]] = [(resource.RLIMIT_CORE, 0)]
    if limits.max_file_size_mb:
        out.append((resource.RLIMIT_FSIZE, limits.max_file_size_mb * _MB))
    controllers = cgroup.controllers if cgroup else set()
    if limits.memory_mb and "memory" not in controllers:
        out.append((resource.RLIMIT_AS, limits.memory_mb * _MB))
    if limits.max_processes and "pids" not in controllers:
        out.append((resource.RLIMIT_NPROC, limits.max_processes))
    return out


def prlimit_args(rlimits: list[tuple[int, int]]) -> list[str]:
    """``prlimit`` options setting ``rlimits`` (capped at the current hard limits)."""
    out = []
    for which, value in rlimits:
        hard = resource.getrlimit(which)[1]
        cap = value if hard == resource.RLIM_INFINITY else min(value, hard)
        out.append(f"{_PRLIMIT_OPTION[which]}={cap}:{cap}")
    return out


def confine(
    argv: list[str],
    cgroup: Cgroup | None,
    rlimits: list[tuple[int, int]],
    *,
    set_pdeathsig: bool,
    take_tty: bool,
) -> list[str]:
    """``argv`` wrapped so that, before it runs, the process dies with rollserve
    (PR_SET_PDEATHSIG), has the rlimits, joins the cgroup and, for a terminal process, makes
    its terminal the controlling tty (``setsid -c``; spawn it *without* a new session then).

    Small exec'd tools do this instead of a Python ``preexec_fn``, which would force a full
    ``fork()`` of the server process for every sandbox process (several ms, more as the
    server grows) instead of ``vfork``.
    """
    out: list[str] = []
    if set_pdeathsig:
        out += ["setpriv", "--pdeathsig", "KILL", "--"]
    if rlimits:
        out += ["prlimit", *prlimit_args(rlimits), "--"]
    if cgroup is not None:  # sh (dash) is single-threaded: see Cgroup.join_files
        joins = " && ".join(f"echo 0 > {shlex.quote(f)}" for f in cgroup.join_files)
        out += ["sh", "-c", f'{joins} && exec "$@"', "sh"]
    if take_tty:
        out += ["setsid", "-c"]
    return out + argv


def _write(path: Path, value: str) -> None:
    path.write_text(value)


def enforcement(
    limits: SandboxLimits,
    cgroup: Cgroup | None,
    unenforced: dict[str, str],
    *,
    contained: bool,
) -> dict[str, LimitCheck]:
    """How each of ``limits`` is enforced for one sandbox (``rollserve sandbox check``)."""
    controllers = cgroup.controllers if cgroup else set()
    where = f"cgroup v{cgroup.version}" if cgroup else ""
    how = {
        "wall_time_s": "a timer closes the sandbox",
        "memory_mb": f"{where} memory controller (all processes together)"
        if "memory" in controllers
        else "RLIMIT_AS (address space, per process)",
        "max_processes": f"{where} pids controller"
        if "pids" in controllers
        else "RLIMIT_NPROC inside the sandbox's user namespace"
        if contained
        else "RLIMIT_NPROC (every process of this user)",
        "max_file_size_mb": "RLIMIT_FSIZE",
        "disk_mb": "a size-limited filesystem for the writable files, and tmpfs sizes",
    }
    out: dict[str, LimitCheck] = {}
    for name, text in how.items():
        if getattr(limits, name) is None:
            continue
        if name in unenforced:
            out[name] = LimitCheck(enforced=False, how=unenforced[name])
        else:
            out[name] = LimitCheck(enforced=True, how=text)
    return out
