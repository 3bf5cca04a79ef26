"""The third-party agents' own environment, made once and kept in ``.agents``: a virtual
environment with the ``openai`` SDK and mini-swe-agent from PyPI (and rollserve's client from
this checkout, for the harness runner), and the agent programs the tests run, in one
directory an external agent's sandbox gets read-only at /opt/agent."""

from __future__ import annotations

import filecmp
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]
AGENTS = ROOT / ".agents"
REQUIREMENTS = ["openai==3.63.0", "mini-swe-agent==2.4.6"]
PROGRAMS = Path(__file__).parent / "agent_programs"
IN_SANDBOX = "/opt/agent"


def _current(agents: Path, wanted: str) -> bool:
    stamp = agents / "venv" / ".rollserve-requirements"
    if not (stamp.is_file() and stamp.read_text() == wanted):
        return False
    programs = agents / "programs"
    mine = sorted(p.relative_to(PROGRAMS) for p in PROGRAMS.rglob("*") if p.is_file())
    theirs = sorted(p.relative_to(programs) for p in programs.rglob("*") if p.is_file())
    return mine == theirs and all(
        filecmp.cmp(PROGRAMS / p, programs / p, shallow=False) for p in mine
    )


def agents_dir() -> Path:
    """The directory (venv/, programs/), made or brought up to date: in the checkout, or for
    a user who may not write there (the rootless suite), the checkout's where it is current,
    else one in the user's home."""
    wanted = " ".join(REQUIREMENTS)
    agents = AGENTS
    if not os.access(ROOT, os.W_OK):
        if _current(AGENTS, wanted):
            return AGENTS
        agents = Path.home() / ".cache" / "rollserve-test-agents"
    venv = agents / "venv"
    python = venv / "bin" / "python"
    stamp = venv / ".rollserve-requirements"
    if not (python.exists() and stamp.is_file() and stamp.read_text() == wanted):
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        pip = [str(python), "-m", "pip", "install", "--quiet"]
        subprocess.run([*pip, *REQUIREMENTS], check=True, timeout=1200)
        stamp.write_text(wanted)
    # rollserve's client from this checkout, as an editable install would put it on the
    # path, without writing into the checkout (which the rootless suite's user may not).
    where = [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
    site = Path(subprocess.run(where, check=True, capture_output=True, text=True).stdout.strip())
    (site / "rollserve-checkout.pth").write_text(f"{ROOT / 'src'}\n")
    programs = agents / "programs"
    shutil.rmtree(programs, ignore_errors=True)
    shutil.copytree(PROGRAMS, programs)
    return agents
