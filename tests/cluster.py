"""A one-machine Slurm cluster of its own for a test: munged, slurmctld and slurmd (Debian's
``slurm-wlm`` and ``munge``) in a temporary directory, on free ports, this host being both
controller and compute node. ``env`` points Slurm's commands at it."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from tests.servers import free_port

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scancel", "squeue")


def slurm_missing() -> list[str]:
    """The Slurm and munge programs this machine lacks."""
    return [d for d in DAEMONS if shutil.which(d) is None and not Path(f"/usr/sbin/{d}").exists()]


class TempSlurm:
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="rollserve-slurm-"))
        self.host = socket.gethostname()
        for sub in ("munge", "state", "spool"):
            (self.dir / sub).mkdir()
        (self.dir / "munge").chmod(0o711)  # munged wants its socket's directory searchable
        key = self.dir / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.conf = self.dir / "slurm.conf"
        cpus = os.cpu_count() or 1
        self.conf.write_text(
            f"""ClusterName=rollserve-test
SlurmctldHost={self.host}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
AuthType=auth/munge
AuthInfo=socket={self.dir}/munge/sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={self.dir}/state
SlurmdSpoolDir={self.dir}/spool
SlurmctldPidFile={self.dir}/slurmctld.pid
SlurmdPidFile={self.dir}/slurmd.pid
SlurmctldLogFile={self.dir}/slurmctld.log
SlurmdLogFile={self.dir}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
SwitchType=switch/none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
SchedulerType=sched/backfill
KillWait=30
NodeName={self.host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=test Nodes={self.host} Default=YES MaxTime=INFINITE State=UP
"""
        )
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    def start(self) -> TempSlurm:
        munge = self.dir / "munge"
        self._daemon(
            "munged", "--force", f"--key-file={munge}/munge.key", f"--socket={munge}/sock",
            f"--pid-file={munge}/pid", f"--log-file={munge}/log", f"--seed-file={munge}/seed",
        )  # fmt: skip
        self._daemon("slurmctld", "-c", "-f", str(self.conf))
        self._daemon("slurmd", "-f", str(self.conf))
        end = time.monotonic() + 30
        while "idle" not in self.run("sinfo", "-h", "-o", "%T"):
            if time.monotonic() > end:
                raise RuntimeError(f"slurm did not come up: {self.logs()}")
            time.sleep(0.2)
        return self

    def _daemon(self, name: str, *args: str) -> None:
        """Start a daemon that forks away; its output goes to a file, not to a pipe that it
        would keep open."""
        with open(self.dir / f"{name}.out", "w") as out:
            done = subprocess.run(
                [name, *args], env=self.env, stdin=subprocess.DEVNULL, stdout=out, stderr=out
            )
        if done.returncode != 0:
            raise RuntimeError(f"{name} failed: {(self.dir / f'{name}.out').read_text()}")

    def run(self, *command: str) -> str:
        done = subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise RuntimeError(f"{command[0]} failed: {done.stderr}")
        return done.stdout

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text()[-3000:]}" for p in self.dir.glob("*.log") if p.is_file()
        )

    def close(self) -> None:
        """Stop the daemons, wait until they are gone (they write their state as they go),
        then remove the directory."""
        pids = []
        for pid_file in ("slurmd.pid", "slurmctld.pid", "munge/pid"):
            path = self.dir / pid_file
            with contextlib.suppress(OSError, ValueError, ProcessLookupError):
                pid = int(path.read_text().split()[0])
                os.kill(pid, signal.SIGTERM)
                pids.append(pid)
        deadline = time.monotonic() + 15
        while any(_running(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.dir, ignore_errors=True)


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie, whose parent is not us, counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"
