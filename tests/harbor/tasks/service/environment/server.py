"""A tiny TCP service: answers every connection with its configured reply."""

import socket
from pathlib import Path

settings = {"port": "7000", "reply": "hello"}
conf = Path("/etc/svc.conf")
if conf.exists():
    for line in conf.read_text().splitlines():
        key, _, value = line.partition("=")
        settings[key.strip()] = value.strip()
with socket.socket() as server:
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", int(settings["port"])))
    server.listen()
    while True:
        conn, _ = server.accept()
        with conn:
            conn.sendall(settings["reply"].encode() + b"\n")
