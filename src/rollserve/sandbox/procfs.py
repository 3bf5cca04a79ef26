"""Process facts read from /proc: identity that survives PID reuse, sessions, groups."""

from __future__ import annotations

import os
import platform
import signal
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

_PROC = Path("/proc")

# Syscall numbers by machine: the reads, and the waits that name descriptors (poll: an array
# of struct pollfd; select: an fd_set of readable descriptors; epoll: an epoll descriptor).
_READS = {
    "x86_64": {0, 17, 19},
    "aarch64": {63, 65, 67},
}
_WAITS = {
    "x86_64": {
        7: "poll",
        271: "poll",
        23: "select",
        270: "select",
        232: "epoll",
        281: "epoll",
        441: "epoll",
    },
    "aarch64": {73: "poll", 72: "select", 22: "epoll", 441: "epoll"},
}
_MAX_FDS = 4096
_POLLIN = 0x001


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


def boot_id() -> str:
    """This boot's id: PIDs and start times from another boot name nothing now."""
    try:
        return (_PROC / "sys" / "kernel" / "random" / "boot_id").read_text().strip()
    except OSError:
        return ""


def start_ticks(pid: int) -> int | None:
    """When the process started (clock ticks since boot): with the PID, a unique identity."""
    st = stat(pid)
    return st.start_ticks if st else None


def is_same_process(pid: int, ticks: int) -> bool:
    """Whether ``pid`` still names the process that started at ``ticks`` and is not a zombie."""
    st = stat(pid)
    return st is not None and st.start_ticks == ticks and st.state not in ("Z", "X")


def all_stats(among: Iterable[int] | None = None) -> list[ProcStat]:
    """Every process visible in /proc, or those of the PIDs ``among`` still alive."""
    if among is None:
        among = (int(e.name) for e in os.scandir(_PROC) if e.name.isdigit())
    return [st for st in map(stat, among) if st is not None]


def kill_sessions(leaders: dict[int, int], among: Iterable[int] | None = None) -> int:
    """SIGKILL what remains of the sessions that the ``leaders`` (PID → start ticks) started,
    leaders included; returns how many processes were signalled.

    A PID stays allocated while any process still uses it as its session id, so members of a
    session whose leader is gone are that leader's orphans — unless the PID now names another
    live process, which means the old session is gone and the id was reused: then nothing of
    that session is touched. Members must also have started no earlier than their leader.

    ``among`` limits the search to those PIDs (a sandbox's cgroup, where its processes all
    are) besides the leaders; by default every process on the host is looked at.
    """
    if not leaders:
        return 0
    stats = all_stats(None if among is None else {*among, *leaders})
    by_pid = {st.pid: st for st in stats}
    ours: dict[int, int] = {}
    for pid, ticks in leaders.items():
        now = by_pid.get(pid)
        if now is None or now.start_ticks == ticks:
            ours[pid] = ticks
    killed = 0
    for st in stats:
        leader_ticks = ours.get(st.session)
        own = ours.get(st.pid) == st.start_ticks
        if own or (leader_ticks is not None and st.start_ticks >= leader_ticks):
            try:
                os.kill(st.pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
    return killed


def session_members(
    leader_pid: int, leader_ticks: int, among: Iterable[int] | None = None
) -> list[tuple[int, int]]:
    """(PID, start ticks) of the live members of the session ``leader_pid`` started, looked
    for ``among`` those PIDs if given — call it while the leader is not yet reaped (its PID
    cannot have been reused then)."""
    return [
        (st.pid, st.start_ticks)
        for st in all_stats(among)
        if st.session == leader_pid
        and st.pid != leader_pid
        and st.start_ticks >= leader_ticks
        and st.state not in ("Z", "X")
    ]


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
    """Whether any of ``pids`` is blocked reading the terminal device ``tty_rdev``: in a read
    on it, or in poll/select/epoll waiting for it to become readable."""
    machine = platform.machine()
    for pid in pids:
        try:
            fields = (_PROC / str(pid) / "syscall").read_text().split()
            if len(fields) < 4 or not fields[0].isdigit():
                continue  # running, or not in a system call
            number, args = int(fields[0]), [int(a, 16) for a in fields[1:7]]
            if number in _READS.get(machine, ()):
                fds = {args[0]}
            elif (kind := _WAITS.get(machine, {}).get(number)) is not None:
                fds = _waited_fds(pid, kind, args)
            else:
                continue
            if any(_is_tty(pid, fd, tty_rdev) for fd in fds):
                return True
        except (OSError, ValueError, IndexError):
            continue
    return False


def _waited_fds(pid: int, kind: str, args: list[int]) -> set[int]:
    """The descriptors a process blocked in poll/select/epoll waits to read."""
    if kind == "epoll":
        info = (_PROC / str(pid) / "fdinfo" / str(args[0])).read_text()
        return {int(line.split()[1]) for line in info.splitlines() if line.startswith("tfd:")}
    if kind == "poll":
        count = min(args[1], _MAX_FDS)
        raw = _memory(pid, args[0], 8 * count)
        entries = (struct.unpack_from("ihh", raw, 8 * i) for i in range(count))
        return {fd for fd, events, _ in entries if fd >= 0 and events & _POLLIN}
    count = min(args[0], _MAX_FDS)  # select: nfds, then the readable set
    if args[1] == 0:
        return set()
    raw = _memory(pid, args[1], (count + 7) // 8)
    return {fd for fd in range(count) if raw[fd // 8] >> (fd % 8) & 1}


def _memory(pid: int, address: int, size: int) -> bytes:
    with open(_PROC / str(pid) / "mem", "rb", buffering=0) as mem:
        mem.seek(address)
        return mem.read(size)


def _is_tty(pid: int, fd: int, tty_rdev: int) -> bool:
    try:
        return os.stat(_PROC / str(pid) / "fd" / str(fd)).st_rdev == tty_rdev
    except OSError:
        return False


def group_members(pgrp: int) -> list[int]:
    """PIDs of the processes in process group ``pgrp``."""
    return [st.pid for st in all_stats() if st.pgrp == pgrp]
