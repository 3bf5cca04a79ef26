"""The third-party agents' own environment, made once and kept in ``.agents``: a virtual
environment with the ``openai`` SDK and mini-swe-agent from PyPI (and rollserve's client from
this checkout, for the harness runner), and the agent programs the tests run, in one
directory an external agent's sandbox gets read-only at /opt/agent."""

from __future__ import annotations

import fcntl
import filecmp
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from rollserve.harness.mini_swe import OFFLINE_ENV
from tests.venvs import current, made_venv

ROOT = Path(__file__).parents[2]
AGENTS = ROOT / ".agents"
REQUIREMENTS = ["openai==3.63.0", "mini-swe-agent==2.4.6"]
# What the agent programs and the mini-swe-agent harness import, offline as the harness runs.
IMPORTS = (
    "openai",
    "litellm",
    "minisweagent.agents.default",
    "minisweagent.config",
    "minisweagent.models.litellm_model",
)
PROGRAMS = Path(__file__).parent / "agent_programs"
IN_SANDBOX = "/opt/agent"


def _current(agents: Path) -> bool:
    if not current(agents / "venv", REQUIREMENTS):
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
    agents = AGENTS
    if not os.access(ROOT, os.W_OK):
        if _current(AGENTS):
            return AGENTS
        agents = Path.home() / ".cache" / "rollserve-test-agents"
    with tempfile.TemporaryDirectory(prefix="mswea-") as config:
        offline = {**OFFLINE_ENV, "MSWEA_GLOBAL_CONFIG_DIR": config}
        python = made_venv(agents / "venv", REQUIREMENTS, imports=IMPORTS, env=offline)
    # rollserve's client from this checkout, as an editable install would put it on the
    # path, without writing into the checkout (which the rootless suite's user may not).
    where = [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
    site = Path(subprocess.run(where, check=True, capture_output=True, text=True).stdout.strip())
    pth, line = site / "rollserve-checkout.pth", f"{ROOT / 'src'}\n"
    if not (pth.is_file() and pth.read_text() == line):  # not rewritten while others read it
        pth.write_text(line)
    # Replaced only when they changed: another test worker's agent may be running them.
    with (agents / "programs.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _current(agents):
            programs = agents / "programs"
            shutil.rmtree(programs, ignore_errors=True)
            shutil.copytree(PROGRAMS, programs)
    return agents
