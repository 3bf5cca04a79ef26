"""``rollserve serve`` processes that benchmarks start on this machine (with the test
plug-ins) and stop again."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def start_node(port: int, data_dir: Path, log: Path, *flags: str) -> subprocess.Popen[bytes]:
    """A node on ``port`` over ``data_dir``, its stderr in ``log``; ``flags`` are more of
    ``serve``'s (``--store-url=…``, ``--config=…``)."""
    command = [sys.executable, "-m", "rollserve.cli.app", "serve", "--port", str(port)]
    command += ["--data-dir", str(data_dir), "--plugins", "rollserve.testing.plugin", *flags]
    with open(log, "wb") as stderr:
        return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr)


def stop_node(node: subprocess.Popen[bytes]) -> None:
    """SIGTERM (the node hands its jobs back and closes its sandboxes), SIGKILL after 60 s."""
    node.terminate()
    try:
        node.wait(timeout=60)
    except subprocess.TimeoutExpired:
        node.kill()
        node.wait()
