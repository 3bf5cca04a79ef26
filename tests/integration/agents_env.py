"""The third-party agents' own environment, made once and kept in ``.agents``: a virtual
environment with the ``openai`` SDK and mini-swe-agent from PyPI (and rollserve's client from
this checkout, for the harness runner), and the agent programs the tests run, in one
directory an external agent's sandbox gets read-only at /opt/agent."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]
AGENTS = ROOT / ".agents"
REQUIREMENTS = ["openai==3.63.0", "mini-swe-agent==2.4.6"]
PROGRAMS = Path(__file__).parent / "agent_programs"
IN_SANDBOX = "/opt/agent"


def agents_dir() -> Path:
    """The directory (venv/, programs/), made or brought up to date."""
    venv = AGENTS / "venv"
    python = venv / "bin" / "python"
    stamp = venv / ".rollserve-requirements"
    wanted = " ".join(REQUIREMENTS)
    if not (python.exists() and stamp.is_file() and stamp.read_text() == wanted):
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        pip = [str(python), "-m", "pip", "install", "--quiet"]
        subprocess.run([*pip, *REQUIREMENTS], check=True, timeout=1200)
        stamp.write_text(wanted)
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--no-deps", "-e", str(ROOT)],
        check=True,
        timeout=600,
    )
    programs = AGENTS / "programs"
    shutil.rmtree(programs, ignore_errors=True)
    shutil.copytree(PROGRAMS, programs)
    return AGENTS
