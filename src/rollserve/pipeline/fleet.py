"""This process as a node of the fleet: its stable name, its lease-owner id (unique to one run
of one process), and whether an owner seen in the store still runs on this host."""

from __future__ import annotations

import os
import socket
from typing import Any

from rollserve.sandbox import procfs
from rollserve.settings import Settings
from rollserve.storage.base import Stage


def node_name(settings: Settings) -> str:
    """The node's stable name: ``settings.node_id``, or the host name."""
    return settings.node_id or socket.gethostname()


def owner_id(settings: Settings) -> str:
    """``NAME@HOST:PID:START``: a restarted process is another owner, so that it never takes
    its predecessor's leases for its own (the sandboxes behind them are gone)."""
    pid = os.getpid()
    return f"{node_name(settings)}@{socket.gethostname()}:{pid}:{procfs.start_ticks(pid) or 0}"


def node_alive(owner: str) -> bool:
    """False only for an owner of this host whose process is gone; an owner elsewhere is
    judged by its heartbeat's expiry in the store instead."""
    where = owner.rpartition("@")[2]
    host, _, rest = where.partition(":")
    pid, _, ticks = rest.partition(":")
    if host != socket.gethostname() or not pid.isdigit() or not ticks.isdigit():
        return True
    return procfs.is_same_process(int(pid), int(ticks))


def node_report(
    workers: dict[Stage, tuple[int, int]], held: int, live: int, paused: dict[str, Any]
) -> dict[str, Any]:
    """What a node's row in the store says of it: its host and process, each pool's busy and
    total workers, the sandboxes held for the run pool and alive, and its part in pauses."""
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "workers": {stage.value: {"busy": b, "total": t} for stage, (b, t) in workers.items()},
        "held_sandboxes": held,
        "live_sandboxes": live,
        "paused": paused,
    }
