"""Free TCP ports on this machine, for the servers rollserve starts itself (the demo's model
server, benchmark nodes, throwaway databases)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
