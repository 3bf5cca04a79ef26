"""Memory of a process tree (this process and every descendant: sandboxes, shells), from /proc.

RSS summed over processes counts shared pages (libraries, the bwrap and bash binaries) once
per process; PSS splits each shared page among its users, so that its sum is the tree's
actual footprint.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass

from rollserve.sandbox import procfs


@dataclass(frozen=True)
class TreeMemory:
    """One reading of the tree."""

    processes: int
    rss_kib: int
    pss_kib: int


def descendants(root: int) -> list[int]:
    """``root`` and every live process below it."""
    children: dict[int, list[int]] = {}
    for st in procfs.all_stats():
        children.setdefault(st.ppid, []).append(st.pid)
    found, stack = [], [root]
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, []))
    return found


def _rollup(pid: int) -> tuple[int, int] | None:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            text = f.read()
    except OSError:  # gone meanwhile, or not ours to read
        return None
    fields = {}
    for line in text.splitlines()[1:]:
        name, _, rest = line.partition(":")
        if name in ("Rss", "Pss"):
            fields[name] = int(rest.split()[0])
    return fields.get("Rss", 0), fields.get("Pss", 0)


def tree_memory(root: int | None = None) -> TreeMemory:
    """RSS and PSS summed over ``root`` (default: this process) and its descendants."""
    rss = pss = count = 0
    for pid in descendants(root if root is not None else os.getpid()):
        found = _rollup(pid)
        if found is not None:
            count += 1
            rss += found[0]
            pss += found[1]
    return TreeMemory(processes=count, rss_kib=rss, pss_kib=pss)


def raise_nofile() -> int:
    """Raise this process's soft limit on open files to its hard limit (to the kernel's
    ``nr_open`` where the hard limit is unlimited); returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if hard == resource.RLIM_INFINITY:
        try:
            with open("/proc/sys/fs/nr_open") as f:
                target = int(f.read())
        except (OSError, ValueError):
            target = soft
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return soft
