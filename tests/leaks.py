"""Test helpers that look for what a sandbox might leave behind on the host."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rollserve.sandbox import SandboxInstance, procfs


@dataclass(frozen=True)
class Proc:
    pid: int
    ticks: int

    def alive(self) -> bool:
        return procfs.is_same_process(self.pid, self.ticks)


def sandbox_processes(box: SandboxInstance) -> list[Proc]:
    """The sandbox's host processes now, to be checked again once it is closed."""
    return [Proc(st.pid, st.start_ticks) for st in box.host_processes()]


def mounts_under(path: Path) -> list[str]:
    prefix = str(path.resolve())
    targets = [ln.split()[4] for ln in Path("/proc/self/mountinfo").read_text().splitlines()]
    return [t for t in targets if t == prefix or t.startswith(prefix + "/")]


def cgroup_dirs(box_id: str, root: Path = Path("/sys/fs/cgroup")) -> list[Path]:
    return [p for p in root.glob(f"*/rollserve/{box_id}")] + [
        p for p in root.glob(f"rollserve/{box_id}")
    ]


def processes_naming(text: str) -> list[Proc]:
    """Every process whose command line holds ``text`` (a data directory: the sandbox
    launchers and mount namespace holders of a server name their sandbox's directory)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in argv:
            st = procfs.stat(int(entry.name))
            if st is not None:
                found.append(Proc(st.pid, st.start_ticks))
    return found


def descendants(pid: int) -> list[Proc]:
    """Every process below ``pid`` now (children, their children …)."""
    children: dict[int, list[int]] = {}
    for st in procfs.all_stats():
        children.setdefault(st.ppid, []).append(st.pid)
    found, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop()
        st = procfs.stat(child)
        if st is not None:
            found.append(Proc(st.pid, st.start_ticks))
        todo += children.get(child, [])
    return found
