"""Process identity and families read from /proc."""

from __future__ import annotations

import os
import subprocess
import time

from rollserve.sandbox import procfs


def test_identity_survives_only_for_the_same_process() -> None:
    me = os.getpid()
    ticks = procfs.start_ticks(me)
    assert ticks is not None
    assert procfs.is_same_process(me, ticks)
    assert not procfs.is_same_process(me, ticks + 1)
    assert procfs.stat(2**22 + 12345) is None


def test_kill_session_kills_orphaned_members() -> None:
    leader = subprocess.Popen(
        ["bash", "-c", "sleep 1000 & echo $!; wait"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert leader.stdout is not None
    child = int(leader.stdout.readline())
    ticks = procfs.start_ticks(leader.pid)
    assert ticks is not None
    child_ticks = procfs.start_ticks(child)
    assert child_ticks is not None
    assert {st.pid for st in procfs.family({leader.pid: ticks})} >= {leader.pid, child}
    assert procfs.kill_sessions({leader.pid: ticks}) == 2
    leader.wait()
    for _ in range(100):
        if not procfs.is_same_process(child, child_ticks):
            break
        time.sleep(0.01)
    assert not procfs.is_same_process(child, child_ticks)


def test_reading_terminal_detects_a_blocked_read() -> None:
    import pty

    master, slave = pty.openpty()
    reader = subprocess.Popen(["cat"], stdin=slave, stdout=subprocess.DEVNULL)
    sleeper = subprocess.Popen(["sleep", "5"], stdin=slave)
    try:
        rdev = os.fstat(slave).st_rdev
        for _ in range(100):
            if procfs.reading_terminal([reader.pid], rdev):
                break
            time.sleep(0.01)
        assert procfs.reading_terminal([reader.pid], rdev)
        assert not procfs.reading_terminal([sleeper.pid], rdev)
    finally:
        reader.kill()
        sleeper.kill()
        reader.wait()
        sleeper.wait()
        os.close(master)
        os.close(slave)
