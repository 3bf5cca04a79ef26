"""A throwaway PostgreSQL server in a temporary directory, for tests and ``rollserve bench``.

It runs Debian's PostgreSQL binaries (``initdb``, ``pg_ctl``); as root they run as the
``postgres`` user, which ``initdb`` requires. Trust authentication on 127.0.0.1 only, a free
port, the socket inside the directory: nothing of the machine's own PostgreSQL is touched.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from rollserve.errors import InfrastructureError
from rollserve.ports import free_port

_SEARCH = ("/usr/lib/postgresql",)


def postgres_bin() -> Path | None:
    """The directory of the newest installed PostgreSQL server binaries, if any."""
    for root in _SEARCH:
        versions = sorted(Path(root).glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
        if versions:
            return versions[-1].parent
    found = shutil.which("initdb")
    return Path(found).parent if found else None


class TempPostgres:
    """One PostgreSQL server of its own; ``url(db)`` for each database made with ``create``."""

    def __init__(self, base: Path | None = None) -> None:
        binaries = postgres_bin()
        if binaries is None:
            raise InfrastructureError(
                "PostgreSQL is not installed (Debian: apt install postgresql)"
            )
        self.bin = binaries
        self.dir = Path(tempfile.mkdtemp(prefix="rollserve-pg-", dir=base))
        self.data = self.dir / "data"
        self.port = free_port()
        self._user = "postgres" if os.geteuid() == 0 else None
        if self._user is not None:
            entry = pwd.getpwnam(self._user)
            os.chown(self.dir, entry.pw_uid, entry.pw_gid)
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-A",
            "trust",
            "-U",
            "postgres",
            "--no-sync",
            "-E",
            "UTF8",
        )
        (self.data / "postgresql.auto.conf").write_text(
            f"port = {self.port}\nlisten_addresses = '127.0.0.1'\n"
            f"unix_socket_directories = '{self.dir}'\nfsync = off\nmax_connections = 300\n"
        )

    def _run(self, tool: str, *args: str) -> None:
        command = [str(self.bin / tool), *args]
        if self._user is not None:
            command = ["runuser", "-u", self._user, "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, cwd=self.dir)
        if done.returncode != 0:
            raise InfrastructureError(f"{tool} failed: {done.stderr.strip()[-2000:]}")

    def start(self) -> TempPostgres:
        """Start the server and wait until it accepts connections."""
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.dir / "log"), "-w", "start")
        return self

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``fast``: disconnect clients; ``immediate``: as if killed)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def kill(self) -> None:
        """SIGKILL the postmaster: the database goes away without a word."""
        pid = int((self.data / "postmaster.pid").read_text().split()[0])
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)

    def create(self, name: str) -> str:
        """A new empty database; returns its URL."""
        self._run("createdb", "-h", str(self.dir), "-p", str(self.port), "-U", "postgres", name)
        return self.url(name)

    def password_user(self, user: str, password: str) -> None:
        """A role that must give ``password`` (SCRAM) over TCP; everyone else stays trusted."""
        self.sql(f"CREATE ROLE {user} LOGIN SUPERUSER PASSWORD '{password}'")
        hba = self.data / "pg_hba.conf"
        hba.write_text(f"host all {user} 127.0.0.1/32 scram-sha-256\n" + hba.read_text())
        self._run("pg_ctl", "-D", str(self.data), "reload")

    def sql(self, statement: str, database: str = "postgres") -> None:
        """Run one statement as the superuser."""
        self._run(
            "psql", "-h", str(self.dir), "-p", str(self.port), "-U", "postgres", "-d", database,
            "-v", "ON_ERROR_STOP=1", "-c", statement,
        )  # fmt: skip

    def cpu_seconds(self) -> float:
        """CPU time the server's processes (postmaster and the backends alive now) have used."""
        postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        ticks = 0
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                fields = (entry / "stat").read_text().rpartition(")")[2].split()
            except OSError:  # gone meanwhile
                continue
            if int(entry.name) == postmaster or int(fields[1]) == postmaster:
                ticks += int(fields[11]) + int(fields[12])  # utime, stime
        return ticks / os.sysconf("SC_CLK_TCK")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def close(self) -> None:
        """Stop the server if it runs, and remove its directory."""
        if (self.data / "postmaster.pid").exists():
            try:
                self.stop("immediate")
            except InfrastructureError:
                self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
