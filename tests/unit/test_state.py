"""The state directory: records of live sandboxes and the reaper of dead owners' leftovers."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from rollserve.sandbox import procfs, state


def _dead_owner() -> tuple[int, int]:
    proc = subprocess.Popen(["true"])
    ticks = procfs.start_ticks(proc.pid) or 1
    proc.wait()
    return proc.pid, ticks


def test_reap_destroys_records_of_dead_owners(tmp_path: Path) -> None:
    record = state.SandboxRecord.create(tmp_path, "dead-1", "local")
    record.owner_pid, record.owner_ticks = _dead_owner()
    record.save()
    victim = subprocess.Popen(["sleep", "1000"], start_new_session=True)
    record.add_process(victim.pid)
    (record.path / "workspace" / "sub").mkdir(parents=True)
    (record.path / "workspace" / "sub").chmod(0o500)  # read-only dirs are removed too

    assert state.reap(tmp_path) == ["dead-1"]
    assert victim.wait(timeout=5) == -9
    assert not record.path.exists()


def test_reap_keeps_records_of_live_owners(tmp_path: Path) -> None:
    record = state.SandboxRecord.create(tmp_path, "mine-1", "local")
    assert record.owner_pid == os.getpid()
    assert state.reap(tmp_path) == []
    assert record.path.exists()


def test_reap_never_kills_a_reused_pid(tmp_path: Path) -> None:
    record = state.SandboxRecord.create(tmp_path, "dead-2", "local")
    record.owner_pid, record.owner_ticks = _dead_owner()
    record.save()
    bystander = subprocess.Popen(["sleep", "1000"], start_new_session=True)
    # A record naming the bystander's PID with an earlier start time: a dead sandbox process
    # whose PID (and so session id) the bystander now reuses. Neither it nor its session may
    # be touched.
    with open(record.path / "procs", "a") as fh:
        fh.write(f"{bystander.pid} {(procfs.start_ticks(bystander.pid) or 1) - 1}\n")
    try:
        assert state.reap(tmp_path) == ["dead-2"]
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_directory_without_record_is_removed_after_grace(tmp_path: Path) -> None:
    young = tmp_path / "young"
    old = tmp_path / "old"
    young.mkdir()
    old.mkdir()
    past = time.time() - 3600
    os.utime(old, (past, past))
    assert state.reap(tmp_path) == ["old"]
    assert young.exists() and not old.exists()


def test_a_creation_cut_short_is_reaped_at_once_and_one_under_way_is_kept(
    tmp_path: Path,
) -> None:
    """A sandbox directory takes its name only with its record in it: a crash between the
    two leaves a staging directory naming its dead owner, removed at the next start."""
    pid, ticks = _dead_owner()
    cut_short = tmp_path / f".new-{pid}-{ticks}-bwrap-1"
    under_way = tmp_path / f".new-{os.getpid()}-{procfs.start_ticks(os.getpid())}-bwrap-2"
    cut_short.mkdir()
    under_way.mkdir()
    assert state.reap(tmp_path) == [cut_short.name]
    assert under_way.exists() and not cut_short.exists()
    record = state.SandboxRecord.create(tmp_path, "bwrap-3", "bwrap")
    assert state.load(record.path) == record
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["bwrap-3", under_way.name])


def test_records_of_an_earlier_boot_touch_no_process(tmp_path: Path) -> None:
    record = state.SandboxRecord.create(tmp_path, "old-boot", "local")
    record.boot_id = "an-earlier-boot"
    record.save()
    bystander = subprocess.Popen(["sleep", "1000"], start_new_session=True)
    record.add_process(bystander.pid)  # the same PID and start time, but from another boot
    try:
        assert state.reap(tmp_path) == ["old-boot"]  # its owner cannot be alive either
        assert bystander.poll() is None
        assert not record.path.exists()
    finally:
        bystander.kill()
        bystander.wait()


def test_retired_leaders_are_no_longer_looked_up(tmp_path: Path) -> None:
    record = state.SandboxRecord.create(tmp_path, "r-1", "local")
    record.add_process(1000, ticks=5)
    record.add_process(1001, ticks=6)
    record.retire(1000, 5, members=[(1500, 9)])
    assert sorted(record.processes()) == [(1001, 6), (1500, 9)]
    with open(record.path / "procs", "a") as fh:
        fh.write("17")  # torn by a crash mid-write
    assert sorted(record.processes()) == [(1001, 6), (1500, 9)]
