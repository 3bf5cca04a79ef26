"""``rollserve serve --processes N``: N node processes behind one listening socket, so that a
machine's cores all run rollouts. The parent binds the address, starts the children (each a
``rollserve serve --fd`` of its own, a node named ``NAME-i`` on the same store and data
directory), starts again one that dies, and passes SIGTERM/SIGINT on to all of them."""

from __future__ import annotations

import logging
import signal
import socket
import subprocess
import sys
import time
from types import FrameType

log = logging.getLogger(__name__)

_RESTART_BACKOFF_S = (1.0, 30.0)  # first and longest wait before a dead child starts again


def serve_processes(count: int, host: str, port: int, name: str, child_args: list[str]) -> int:
    """Run ``count`` children until a signal stops them; returns the exit status."""
    listener = socket.create_server((host, port), backlog=4096)
    listener.set_inheritable(True)
    fd = listener.fileno()
    stopping = False

    def spawn(index: int) -> subprocess.Popen[bytes]:
        command = [sys.executable, "-m", "rollserve.cli.app", "serve", "--fd", str(fd)]
        command += [f"--node-id={name}-{index}", *child_args]
        return subprocess.Popen(command, pass_fds=(fd,))

    def stop(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        for child in children.values():
            if child.poll() is None:
                child.send_signal(signum)

    children = {index: spawn(index) for index in range(count)}
    backoff = dict.fromkeys(children, _RESTART_BACKOFF_S[0])
    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        while not stopping:
            time.sleep(0.2)
            for index, child in list(children.items()):
                if stopping or child.poll() is None:
                    continue
                log.warning(
                    "node process %d exited with %s; starting it again in %.0f s",
                    index,
                    child.returncode,
                    backoff[index],
                )
                time.sleep(backoff[index])
                backoff[index] = min(backoff[index] * 2, _RESTART_BACKOFF_S[1])
                if not stopping:
                    children[index] = spawn(index)
        for child in children.values():
            child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        listener.close()
    return 0
