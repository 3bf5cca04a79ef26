"""Process facts read from /proc: identity that survives PID reuse, sessions, groups."""

from __future__ import annotations

import os
import platform
import signal
from dataclasses import dataclass
from pathlib import Path

_PROC = Path("/proc")

# Syscall numbers of read/readv/pread64 by machine: a process blocked in one of these on the
# terminal is waiting for input.
_READ_SYSCALLS = {
    "x86_64": {0, 17, 19},
    "aarch64": {63, 65, 67},
}


@dataclass(frozen=True)
class ProcStat:
    """The fields of /proc/PID/stat that rollserve uses."""

    pid: int
    ppid: int
    pgrp: int
    session: int
    start_ticks: int
    state: str


def stat(pid: int) -> ProcStat | None:
    """The process's stat line, or None if it is gone."""
    try:
        raw = (_PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name is in parentheses and may itself contain spaces or parentheses.
    rest = raw[raw.rindex(")") + 2 :].split()
    return ProcStat(
        pid=pid,
        ppid=int(rest[1]),
        pgrp=int(rest[2]),
        session=int(rest[3]),
        start_ticks=int(rest[19]),
        state=rest[0],
    )


def start_ticks(pid: int) -> int | None:
    """When the process started (clock ticks since boot): with the PID, a unique identity."""
    st = stat(pid)
    return st.start_ticks if st else None


def is_same_process(pid: int, ticks: int) -> bool:
    """Whether ``pid`` still names the process that started at ``ticks`` and is not a zombie."""
    st = stat(pid)
    return st is not None and st.start_ticks == ticks and st.state not in ("Z", "X")


def all_stats() -> list[ProcStat]:
    """Every process visible in /proc."""
    out = []
    for entry in os.scandir(_PROC):
        if entry.name.isdigit():
            st = stat(int(entry.name))
            if st is not None:
                out.append(st)
    return out


def kill_session(leader_pid: int, leader_ticks: int) -> int:
    """SIGKILL every process of the session that ``leader_pid`` started (by session id).

    Processes that started before the leader cannot belong to its session, which guards
    against a session id reused after the leader died. Returns how many were signalled.
    """
    killed = 0
    for st in all_stats():
        if st.session == leader_pid and st.start_ticks >= leader_ticks:
            try:
                os.kill(st.pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
    return killed


def family(roots: dict[int, int]) -> list[ProcStat]:
    """Live processes descending from, or in a session led by, the ``roots`` (PID → start
    ticks); a root that no longer names the same process contributes only its session."""
    stats = all_stats()
    children: dict[int, list[ProcStat]] = {}
    for st in stats:
        children.setdefault(st.ppid, []).append(st)
    found: dict[int, ProcStat] = {}
    stack = [st for st in stats if roots.get(st.pid) == st.start_ticks]
    stack += [st for st in stats if st.session in roots and st.start_ticks >= roots[st.session]]
    while stack:
        st = stack.pop()
        if st.pid in found or st.state in ("Z", "X"):
            continue
        found[st.pid] = st
        stack.extend(children.get(st.pid, []))
    return list(found.values())


def reading_terminal(pids: list[int], tty_rdev: int) -> bool:
    """Whether any of ``pids`` is blocked in a read on the terminal device ``tty_rdev``."""
    reads = _READ_SYSCALLS.get(platform.machine(), set())
    for pid in pids:
        try:
            fields = (_PROC / str(pid) / "syscall").read_text().split()
            if not fields or not fields[0].isdigit() or int(fields[0]) not in reads:
                continue
            fd = int(fields[1], 16)
            if os.stat(_PROC / str(pid) / "fd" / str(fd)).st_rdev == tty_rdev:
                return True
        except (OSError, ValueError, IndexError):
            continue
    return False


def group_members(pgrp: int) -> list[int]:
    """PIDs of the processes in process group ``pgrp``."""
    return [st.pid for st in all_stats() if st.pgrp == pgrp]
