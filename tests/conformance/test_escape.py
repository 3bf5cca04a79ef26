"""Escape attempts: what a hostile command in a sandbox tries, and the proof that each is refused.

Run over the isolating backends only: ``local`` runs commands on the host as they are, with no
isolation by design, so every attempt here would (rightly) succeed there. Each test runs its
attempts as one script per sandbox (``NAME rc=N`` lines) to keep the suite quick, and checks the
host from outside as well as the exit codes inside. Where this host cannot enforce a limit, the
test asserts the sandbox's report of that (``unenforced``) instead of skipping.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shlex
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rollserve.errors import SandboxClosedError
from rollserve.sandbox import SandboxInstance, SandboxManager, quota, spec_for
from rollserve.schema.sandbox import SandboxLimits
from rollserve.settings import Settings
from rollserve.shell import ShellSession
from tests.conformance.conftest import require
from tests.leaks import mounts_under
from tests.missing import missing

_MB = 1024 * 1024


def _script(attempts: dict[str, str]) -> str:
    """One bash script running each attempt in a subshell, then printing ``@@ NAME RC``."""
    return "\n".join(
        f"( {cmd} ) </dev/null 2>&1; rc=$?; echo; echo '@@ {name}' $rc"
        for name, cmd in attempts.items()
    )


async def _attempt(box: SandboxInstance, attempts: dict[str, str]) -> tuple[dict[str, int], str]:
    """Run the attempts in ``box``: each one's exit status, and everything they printed."""
    result = await box.exec(_script(attempts), timeout=60)
    codes = {}
    for line in result.stdout.splitlines():
        if line.startswith("@@ "):
            _, name, code = line.split()
            codes[name] = int(code)
    assert set(codes) == set(attempts), result
    return codes, result.stdout


def _found_in(files: str, needle: str) -> str:
    """A shell test that succeeds when any of ``files`` holds ``needle``. The needle is spelled
    in two halves and matched by the shell itself: no process's command line (this script's,
    a grep's) then holds it, which would match itself in /proc."""
    half = len(needle) // 2
    return (
        f'a="{needle[:half]}"; b="{needle[half:]}"; for f in {files}; do '
        'v=$(tr "\\0" "\\n" < "$f" 2>/dev/null); case $v in *"$a$b"*) echo "$f";; esac; '
        "done | grep ."
    )


def _refused(codes: dict[str, int]) -> list[str]:
    """The attempts that succeeded (exit status 0): each is an escape."""
    return [name for name, code in codes.items() if code == 0]


def _marked(marker: str, comm: str | None = None) -> list[int]:
    """Host processes whose command line carries ``marker`` (and whose name is ``comm``)."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if marker.encode() not in Path(entry.path, "cmdline").read_bytes():
                    continue
                if comm is None or Path(entry.path, "comm").read_text().strip() == comm:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


async def _until(condition: Callable[[], bool], timeout: float) -> None:
    """Poll ``condition`` (a host fact nothing signals) until true or ``timeout`` passed."""
    deadline = time.monotonic() + timeout
    for _ in range(int(timeout / 0.05)):
        if condition() or time.monotonic() > deadline:
            return
        await asyncio.sleep(0.05)


@pytest.fixture
def planted(settings: Settings) -> Iterator[dict[str, Path]]:
    """Secret files where the host keeps them: root's and the users' home directories, and the
    service's data directory. Removed afterwards."""
    name = f".rollserve-escape-{secrets.token_hex(6)}"
    places = {"root": Path("/root"), "home": Path("/home"), "data": settings.data_dir}
    made: dict[str, Path] = {}
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    for key, where in places.items():
        if where.is_dir() and os.access(where, os.W_OK):
            path = where / name
            path.write_text(f"secret-{key}-{secrets.token_hex(8)}")
            made[key] = path
    try:
        yield made
    finally:
        for path in made.values():
            path.unlink(missing_ok=True)


async def test_host_secrets_are_unreadable(
    manager: SandboxManager,
    isolating_backend: str,
    planted: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    require(manager, isolating_backend)
    token = f"tok-{secrets.token_hex(16)}"
    monkeypatch.setenv("ROLLSERVE_API_TOKEN", token)  # as the service's own would be
    other = await manager.start(spec_for(isolating_backend))
    (other.workspace / "neighbour.txt").write_text(f"neighbour-{secrets.token_hex(8)}")
    box = await manager.start(spec_for(isolating_backend))
    names = " ".join(p.name for p in planted.values()) or "none"
    attempts = {f"read_{key}": f"cat {shlex.quote(str(path))}" for key, path in planted.items()}
    attempts |= {
        "list_homes": f"ls -a /root /home 2>/dev/null | grep -F -e {names.replace(' ', ' -e ')}",
        "read_neighbour": f"cat {other.workspace}/neighbour.txt",
        "list_sandboxes": f"ls {manager.settings.state_dir}",
        "list_data_dir": f"ls -a {manager.settings.data_dir}",
        # /proc shows only the sandbox's own processes: its PID 1 is its own init, and none
        # seen there carries the host's environment (the test process's token).
        "token_in_proc": _found_in("/proc/[0-9]*/environ /proc/[0-9]*/cmdline", token),
        "token_in_env": f"env > /tmp/env; {_found_in('/tmp/env', token)}",
        "init_environ": _found_in("/proc/1/environ", token),
        "test_process": f"cat /proc/{os.getpid()}/environ",
    }
    codes, out = await _attempt(box, attempts)
    assert _refused(codes) == [], out
    secrets_ = [p.read_text() for p in planted.values()]
    secrets_ += [token, (other.workspace / "neighbour.txt").read_text()]
    assert not [s for s in secrets_ if s in out], out
    own = await box.exec(["readlink", "/proc/self/ns/pid"])
    assert own.stdout.strip() != os.readlink("/proc/self/ns/pid")  # /proc/1 is its own init


async def test_writes_outside_workspace_and_tmp_are_refused(
    manager: SandboxManager, isolating_backend: str
) -> None:
    require(manager, isolating_backend)
    other = await manager.start(spec_for(isolating_backend))
    box = await manager.start(spec_for(isolating_backend))
    probe = f"escape-{secrets.token_hex(4)}"
    cgroup_files = [Path(d, "pids.max") for d in box.cgroup.dirs] if box.cgroup else []
    cgroup_files = [p for p in cgroup_files if p.exists()]
    before = {p: p.read_text() for p in cgroup_files}

    def write_back(path: str) -> str:  # a knob written with its own value: harmless if it works
        return f'v=$(cat {path}) && echo "$v" > {path}'

    attempts = {
        "data_dir": f"echo x > {manager.settings.data_dir}/{probe}",
        "neighbour": f"echo x > {other.workspace}/{probe}",
        # Root in the sandbox is the host's root when rollserve runs as root: sysctls are
        # writable by file mode alone, and kernel.core_pattern runs a program on the host.
        "sysctl": write_back("/proc/sys/kernel/printk_ratelimit"),
        "core_pattern": write_back("/proc/sys/kernel/core_pattern"),
        "sysfs": write_back("/sys/kernel/mm/ksm/run"),
        "own_cgroup": " || ".join(f"echo 100000 > {p}" for p in cgroup_files) or "false",
        "leave_cgroup": "echo $$ > /sys/fs/cgroup/pids/tasks || "
        "echo $$ > /sys/fs/cgroup/cgroup.procs",
    }
    codes, out = await _attempt(box, attempts)
    assert _refused(codes) == [], out
    assert not (manager.settings.data_dir / probe).exists()
    assert not (other.workspace / probe).exists()
    assert {p: p.read_text() for p in cgroup_files} == before
    # Writing to the sandbox's own /root, /home, /etc may work (a private tmpfs or overlay)
    # but reaches nothing on the host.
    private = ["/root", "/home", "/etc", "/var/tmp"]
    await box.exec("; ".join(f"echo x > {d}/{probe}" for d in private))
    assert not [d for d in private if Path(d, probe).exists()]
    ok = await box.exec(f"echo x > /workspace/{probe} && echo x > /tmp/{probe}")
    assert ok.exit_code == 0 and (box.workspace / probe).exists()


async def test_network_off_reaches_nothing_on_the_host(
    manager: SandboxManager, isolating_backend: str
) -> None:
    require(manager, isolating_backend)
    accepted: list[str] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append("tcp")
        writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    abstract = f"rollserve-escape-{secrets.token_hex(4)}"
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.bind("\0" + abstract)
    unix.listen()
    try:
        box = await manager.start(spec_for(isolating_backend))
        connect_unix = (
            f"import socket; s = socket.socket(socket.AF_UNIX); s.connect(chr(0) + '{abstract}')"
        )
        attempts = {
            "tcp_loopback": f"timeout 5 bash -c 'exec 3<>/dev/tcp/127.0.0.1/{port}'",
            "tcp_localhost": f"timeout 5 bash -c 'exec 3<>/dev/tcp/localhost/{port}'",
            "abstract_unix": f'timeout 5 python3 -c "{connect_unix}"',
            "outside": "timeout 5 bash -c 'exec 3<>/dev/tcp/1.1.1.1/53'",
        }
        codes, out = await _attempt(box, attempts)
        await asyncio.sleep(0.1)  # a connection that got through would be accepted by now
        assert _refused(codes) == [], out
        assert not accepted
        unix.setblocking(False)
        with pytest.raises(BlockingIOError):  # nobody is waiting on the abstract socket
            unix.accept()
    finally:
        unix.close()
        server.close()
        await server.wait_closed()


async def test_host_processes_cannot_be_signalled_or_traced(
    manager: SandboxManager, isolating_backend: str
) -> None:
    require(manager, isolating_backend)
    marker = f"rollserve-escape-{secrets.token_hex(4)}"
    sleeper = subprocess.Popen(["bash", "-c", f"exec -a {marker} sleep 300"])
    try:
        box = await manager.start(spec_for(isolating_backend))
        pid, me = sleeper.pid, os.getpid()
        ptrace = (
            "import ctypes, sys; libc = ctypes.CDLL(None, use_errno=True); "
            f"sys.exit(0 if libc.ptrace(16, {pid}, 0, 0) == 0 else 1)"
        )
        attempts = {
            "kill0_sleeper": f"kill -0 {pid}",
            "kill9_sleeper": f"kill -9 {pid}",
            "kill0_test": f"kill -0 {me}",
            "kill9_test": f"kill -9 {me}",
            "ptrace_attach": f'python3 -c "{ptrace}"',
            "proc_entry": f"ls /proc/{pid}/",
            "proc_marker": _found_in("/proc/[0-9]*/cmdline", marker),
        }
        codes, out = await _attempt(box, attempts)
        assert _refused(codes) == [], out
        assert sleeper.poll() is None, "the sandbox killed a host process"
        assert _marked(marker) == [pid]
    finally:
        sleeper.kill()
        sleeper.wait()


async def test_privileges_mounts_and_devices_are_refused(
    manager: SandboxManager, isolating_backend: str
) -> None:
    require(manager, isolating_backend)
    box = await manager.start(spec_for(isolating_backend))
    disks = [f"/dev/{d.name}" for d in sorted(Path("/sys/block").iterdir())][:4]
    attempts = {
        "mount_tmpfs": "mkdir -p /tmp/m && mount -t tmpfs none /tmp/m",
        "mount_bind": "mkdir -p /tmp/m && mount --bind /workspace /tmp/m",
        "mount_proc": "mkdir -p /tmp/m && mount -t proc proc /tmp/m",
        "unshare_mount": "unshare -m true",
        "unshare_user": "unshare -Ur true",
        "unshare_user_mount": "unshare -Urm mount -t tmpfs none /tmp",
        "mknod_char": "mknod /tmp/mem c 1 1",
        "mknod_block": f"mknod ./disk b {os.major(os.stat('/').st_dev)} 0",
        "chown": "touch ./mine && chown 12345 ./mine",
        "kcore": "head -c 16 /proc/kcore > /dev/null",
        "kmsg": "head -c 16 /dev/kmsg > /dev/null",
        "mem": "head -c 16 /dev/mem > /dev/null",
        "host_disk": " || ".join(f"head -c 16 {d} > /dev/null" for d in disks) or "false",
        # A setuid copy in the workspace gains nothing: the mount is nosuid, the process has
        # no_new_privs and an empty bounding set: succeeding means a capability showed up.
        "setuid": "cp /bin/cat ./suid && chmod 4755 ./suid && ./suid /proc/self/status "
        "| grep -E '^Cap(Prm|Eff):' | grep -v '0000000000000000$' | grep .",
    }
    codes, out = await _attempt(box, attempts)
    assert _refused(codes) == [], out
    status = (await box.exec("grep -E '^(CapEff|CapBnd|NoNewPrivs):' /proc/self/status")).stdout
    assert status.split() == ["CapEff:", "0" * 16, "CapBnd:", "0" * 16, "NoNewPrivs:", "1"]


@pytest.mark.parametrize("via", ["exec", "shell"])
async def test_no_process_outlives_close(
    manager: SandboxManager, isolating_backend: str, via: str
) -> None:
    require(manager, isolating_backend)
    marker = f"rollserve-escape-{secrets.token_hex(4)}"
    sleep = f"exec -a {marker} sleep 300"
    quiet = "</dev/null >/dev/null 2>&1"
    daemon = (
        "import os; os.fork() and os._exit(0); os.setsid(); os.fork() and os._exit(0); "
        f"os.execvp('bash', ['bash', '-c', '{sleep}'])"
    )
    tricks = [
        f"setsid bash -c '{sleep}' {quiet} &",
        f"nohup bash -c '{sleep}' {quiet} &",
        f"bash -c '{sleep}' {quiet} & disown",
        f"( ( bash -c '{sleep}' {quiet} & ) & )",
        f"setsid -f bash -c 'trap \"\" HUP TERM; {sleep}' {quiet}",
        f'python3 -c "{daemon}" {quiet}',
    ]
    box = await manager.start(spec_for(isolating_backend))
    running = None
    if via == "exec":  # the command is still running when the sandbox closes
        running = asyncio.create_task(box.exec("\n".join([*tricks, "sleep 300"]), timeout=60))
    else:
        session = await ShellSession.open(box)
        for trick in tricks:
            assert (await session.run(trick, timeout=30)).exit_code == 0
    await _until(lambda: len(_marked(marker, "sleep")) >= len(tricks), 10)
    assert len(_marked(marker, "sleep")) == len(tricks)
    await manager.close(box)
    if running is not None:
        with pytest.raises(SandboxClosedError):
            await running
    assert _marked(marker) == []


async def test_fork_bomb_is_reported(manager: SandboxManager, isolating_backend: str) -> None:
    require(manager, isolating_backend)
    box = await manager.start(spec_for(isolating_backend, limits=SandboxLimits(max_processes=32)))
    bomb = await box.exec("bomb() { bomb | bomb & }; bomb; sleep 2", timeout=3)
    assert subprocess.run(["true"], check=False).returncode == 0  # the host still forks
    if box.cgroup is not None and "pids" in box.cgroup.controllers:
        assert box.limit_events().get("max_processes", 0) > 0
    else:
        assert "max_processes" not in box.unenforced  # test_unenforced_... covers that case
        assert "Resource temporarily unavailable" in bomb.stderr  # the shell saw EAGAIN
    assert (await box.exec("echo usable")).stdout == "usable\n"


async def test_memory_hog_is_reported(manager: SandboxManager, isolating_backend: str) -> None:
    require(manager, isolating_backend)
    box = await manager.start(spec_for(isolating_backend, limits=SandboxLimits(memory_mb=128)))
    hog = await box.exec(
        "python3 -c \"b = bytearray(512 * 1024 * 1024); print('allocated')\"", timeout=60
    )
    assert hog.exit_code != 0 and "allocated" not in hog.stdout
    if box.cgroup is not None and "memory" in box.cgroup.controllers:
        assert box.limit_events().get("memory_mb", 0) >= 1  # the cgroup's OOM kill, counted
    else:  # the address-space rlimit: the allocation itself fails
        assert "MemoryError" in hog.stderr
    assert (await box.exec("echo usable")).stdout == "usable\n"


async def test_unenforced_process_limit_is_reported(
    settings: Settings, isolating_backend: str, tmp_path: Path
) -> None:
    no_cgroups = settings.model_copy(update={"cgroup_root": tmp_path / "no-cgroups"})
    async with SandboxManager(no_cgroups) as manager:
        require(manager, isolating_backend)
        limits = SandboxLimits(max_processes=8)
        box = await manager.start(spec_for(isolating_backend, limits=limits))
        if os.geteuid() != 0:
            assert "max_processes" not in box.unenforced  # RLIMIT_NPROC binds other users
            return
        assert "RLIMIT_NPROC does not bind root" in box.unenforced["max_processes"]
        # The report is true: more processes than the limit start (a dozen, not a bomb).
        started = await box.exec("for i in $(seq 12); do sleep 1 & done; wait; echo done")
        assert started.stdout == "done\n" and "unavailable" not in started.stderr


def _loops_on(image: Path) -> list[str]:
    """Loop devices whose backing file is ``image``."""
    found = []
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        with contextlib.suppress(OSError):
            if backing.read_text().strip().startswith(str(image)):
                found.append(backing.parent.parent.name)
    return found


async def _assert_removed(record: Path) -> None:
    """Nothing of a closed sandbox's quota is left: no mount, loop device or file."""
    await _until(lambda: not _loops_on(record / "disk.img"), 5)  # freed asynchronously
    assert not _loops_on(record / "disk.img")
    assert not mounts_under(record) and not record.exists()


def _quota_reported(manager: SandboxManager, backend: str, box: SandboxInstance) -> bool:
    """Where this host cannot enforce the quota, check that both reports say so."""
    reason = quota.unsupported_reason()
    if reason is None:
        assert "disk_mb" not in manager.availability(backend).unenforced
        assert "disk_mb" not in box.unenforced
        return False
    assert reason in manager.availability(backend).unenforced["disk_mb"]
    assert reason in box.unenforced["disk_mb"]
    return True


async def test_disk_quota_stops_filling_the_host(
    manager: SandboxManager, isolating_backend: str
) -> None:
    require(manager, isolating_backend)
    box = await manager.start(spec_for(isolating_backend, limits=SandboxLimits(disk_mb=8)))
    if _quota_reported(manager, isolating_backend, box):
        return
    record = box.workspace.parent
    assert mounts_under(record) == [str(box.workspace.resolve())]
    fill = await box.exec("head -c 32000000 /dev/zero > big; echo rc=$?; ls -A")
    assert "No space left on device" in fill.stderr
    assert fill.stdout.split() == ["rc=1", "big"]  # nothing of the filesystem's own shows
    assert (box.workspace / "big").stat().st_size < 8 * _MB
    assert (record / "disk.img").stat().st_blocks * 512 <= 8 * _MB  # all the host gave
    if isolating_backend == "bwrap":  # its tmpfs mounts have the same size
        tmp = await box.exec("head -c 32000000 /dev/zero > /tmp/big")
        assert "No space left on device" in tmp.stderr
    # Space freed is space again: the quota limits what is there, not what was written.
    again = await box.exec("rm big && head -c 4000000 /dev/zero > small && echo ok")
    assert again.stdout == "ok\n"
    await manager.close(box)
    await _assert_removed(record)


async def test_disk_quota_covers_a_workspace_inside_the_image(
    manager: SandboxManager, isolating_backend: str
) -> None:
    require(manager, isolating_backend)
    image = manager.settings.image_dir / "base"
    if not image.is_dir():
        message = f"base image {image} missing: run scripts/build-images.sh"
        missing(message, manager.settings)
    limits = SandboxLimits(disk_mb=8)
    spec = spec_for(isolating_backend, image=str(image), workspace="/opt", limits=limits)
    box = await manager.start(spec)
    if _quota_reported(manager, isolating_backend, box):
        return
    record = box.workspace.parent
    if os.path.ismount(record / "overlay"):  # the overlay's upper layer holds the writes
        assert str((record / "overlay").resolve()) in mounts_under(record)
    fill = await box.exec("head -c 32000000 /dev/zero > /opt/big")
    assert "No space left on device" in fill.stderr
    await manager.close(box)
    await _assert_removed(record)


async def test_unenforced_disk_quota_is_reported(
    settings: Settings, isolating_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What a host without root or loop devices reports: the quota cannot be mounted there.
    why = "needs root to mount a size-limited filesystem (running as uid 1000)"
    monkeypatch.setattr(quota, "unsupported_reason", lambda: why)
    async with SandboxManager(settings) as manager:
        require(manager, isolating_backend)
        assert why in manager.availability(isolating_backend).unenforced["disk_mb"]
        box = await manager.start(spec_for(isolating_backend, limits=SandboxLimits(disk_mb=8)))
        assert why in box.unenforced["disk_mb"]
        assert mounts_under(box.workspace.parent) == []
        unlimited = await box.exec("head -c 10000000 /dev/zero > big && echo written")
        assert unlimited.stdout == "written\n"
        free = await manager.start(spec_for(isolating_backend, limits=SandboxLimits(disk_mb=None)))
        assert free.unenforced == {}
