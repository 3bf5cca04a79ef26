"""rollserve's own record of live sandboxes, and the reaper of what a dead process left.

Each sandbox owns one directory ``STATE/<id>/`` holding ``record.json`` (owner process, cgroup
directories) and ``procs`` (every process spawned for it, as PID + start time). Everything the
sandbox creates on the host lives under that directory, so removing it removes them all. After a
crash the next start reaps exactly the records whose owner is gone: processes by recorded identity
(PID *and* start time, then their sessions), cgroups by recorded path — never by process name.

The directory is made under a staging name that carries its owner's identity, and takes its
sandbox's name only once it holds the record: a crash at any point leaves nothing the reaper
cannot attribute to a dead owner at once.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rollserve.sandbox import procfs
from rollserve.sandbox.limits import Cgroup
from rollserve.trees import remove_tree

log = logging.getLogger(__name__)

_RECORD = "record.json"
_PROCS = "procs"
_ORPHAN_GRACE_S = 60.0  # a record-less directory not made here (by hand, say)
_STAGING = ".new-"  # + "<owner pid>-<owner start ticks>-<sandbox id>"


@dataclass
class SandboxRecord:
    """What rollserve needs to find and remove a sandbox after its owner died."""

    id: str
    backend: str
    dir: str
    owner_pid: int
    owner_ticks: int
    created: float = field(default_factory=time.time)
    cgroup_dirs: list[str] = field(default_factory=list)
    cgroup_version: int = 0
    boot_id: str = field(default_factory=procfs.boot_id)
    # Every recorded process leads PID namespaces that end with it (Launcher.contained).
    contained: bool = False

    @classmethod
    def create(cls, state_dir: Path, sandbox_id: str, backend: str) -> SandboxRecord:
        """Make the sandbox's directory with its record in it, before anything else exists."""
        path = state_dir / sandbox_id
        me = os.getpid()
        ticks = procfs.start_ticks(me) or 0
        record = cls(id=sandbox_id, backend=backend, dir=str(path), owner_pid=me, owner_ticks=ticks)
        staging = state_dir / f"{_STAGING}{me}-{ticks}-{sandbox_id}"
        staging.mkdir(parents=True)
        record._write(staging)
        staging.rename(path)
        return record

    @property
    def path(self) -> Path:
        return Path(self.dir)

    def save(self) -> None:
        self._write(self.path)

    def _write(self, directory: Path) -> None:
        tmp = directory / (_RECORD + ".tmp")
        tmp.write_text(json.dumps(asdict(self)))
        tmp.replace(directory / _RECORD)

    def add_process(self, pid: int, ticks: int | None = None) -> int:
        """Note a spawned process (a session leader); returns its start time."""
        ticks = procfs.start_ticks(pid) or 0 if ticks is None else ticks
        with open(self.path / _PROCS, "a") as fh:
            fh.write(f"{pid} {ticks}\n")
        return ticks

    def retire(self, pid: int, ticks: int, members: list[tuple[int, int]]) -> None:
        """A leader was reaped: from now on its PID may name anything, so its session is no
        longer looked up by id; the members it left (a snapshot) are recorded one by one."""
        with open(self.path / _PROCS, "a") as fh:
            fh.writelines(f"{m} {t}\n" for m, t in members)
            fh.write(f"-{pid} {ticks}\n")

    def processes(self) -> list[tuple[int, int]]:
        """Recorded processes not retired, as (PID, start ticks)."""
        try:
            lines = (self.path / _PROCS).read_text().splitlines()
        except FileNotFoundError:
            return []
        live: dict[tuple[int, int], None] = {}
        for line in lines:
            fields = line.split()
            if len(fields) != 2 or not fields[1].isdigit():
                continue  # a line torn by a crash mid-write
            try:
                pid, ticks = int(fields[0]), int(fields[1])
            except ValueError:
                continue
            if pid < 0:
                live.pop((-pid, ticks), None)
            else:
                live[(pid, ticks)] = None
        return list(live)

    def cgroup(self) -> Cgroup | None:
        if not self.cgroup_dirs:
            return None
        return Cgroup(dirs=[Path(d) for d in self.cgroup_dirs], version=self.cgroup_version)

    def this_boot(self) -> bool:
        """Whether the record was written since the machine last booted."""
        return self.boot_id == procfs.boot_id()

    def owner_alive(self) -> bool:
        return self.this_boot() and procfs.is_same_process(self.owner_pid, self.owner_ticks)


def destroy(record: SandboxRecord) -> bool:
    """Kill every process of the sandbox, remove its cgroup, mounts and files. Idempotent.

    Each step runs even if an earlier one failed; the record is removed last and only when
    everything else is gone, so that a failed removal is retried by the reaper. Returns whether
    the sandbox is completely gone.
    """
    complete = True
    cgroup = record.cgroup()
    if record.this_boot():  # after a reboot its processes are long gone, their PIDs reused
        among = set() if record.contained else (cgroup.pids() if cgroup else None)
        procfs.kill_sessions(dict(record.processes()), among)
    if cgroup is not None:
        try:
            cgroup.kill_all()
            cgroup.remove()
        except OSError:
            log.exception("removing the cgroup of sandbox %s failed", record.id)
            complete = False
    unmount_under(record.path)
    for entry in list(record.path.iterdir()) if record.path.is_dir() else []:
        if entry.name in (_RECORD, _PROCS):
            continue
        try:
            if entry.is_dir() and not entry.is_symlink():
                remove_tree(entry)
            else:
                entry.unlink()
        except OSError:
            log.exception("removing %s failed", entry)
            complete = False
    if complete:
        try:
            remove_tree(record.path)
        except OSError:
            log.exception("removing %s failed", record.path)
            complete = False
    return complete


def unmount_under(path: Path) -> None:
    """Lazily unmount anything mounted at or below ``path`` in our mount namespace."""
    prefix = str(path.resolve())
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return
    targets = [ln.split()[4] for ln in lines]
    for target in sorted(
        (t for t in targets if t == prefix or t.startswith(prefix + "/")), key=len, reverse=True
    ):
        subprocess.run(["umount", "-l", target], check=False, capture_output=True)


def load(path: Path) -> SandboxRecord | None:
    try:
        data = json.loads((path / _RECORD).read_text())
        return SandboxRecord(**data)
    except (OSError, ValueError, TypeError):
        return None


def reap(state_dir: Path) -> list[str]:
    """Destroy every sandbox whose owning process is gone; returns the reaped ids."""
    if not state_dir.is_dir():
        return []
    reaped = []
    for entry in sorted(state_dir.iterdir()):
        if not entry.is_dir():
            continue
        if entry.name.startswith(_STAGING):  # a creation cut short, or under way
            if not _staging_owner_alive(entry.name):
                remove_tree(entry)
                reaped.append(entry.name)
            continue
        record = load(entry)
        if record is None:
            # Not made by a sandbox's creation (that renames it in with its record): it may
            # be another process's work in hand, so only an old one goes.
            if time.time() - entry.stat().st_mtime > _ORPHAN_GRACE_S:
                remove_tree(entry)
                reaped.append(entry.name)
            continue
        if record.owner_alive():
            continue
        log.warning("reaping sandbox %s left by dead process %d", record.id, record.owner_pid)
        destroy(record)
        reaped.append(record.id)
    return reaped


def _staging_owner_alive(name: str) -> bool:
    """Whether the process named in a staging directory's name still runs."""
    pid, _, rest = name.removeprefix(_STAGING).partition("-")
    ticks = rest.partition("-")[0]
    if not (pid.isdigit() and ticks.isdigit()):
        return False
    return procfs.is_same_process(int(pid), int(ticks))
