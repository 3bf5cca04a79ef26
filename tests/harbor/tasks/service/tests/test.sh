#!/bin/bash
# Runs the service as configured, and asks it.
python3 /opt/svc/server.py > /tmp/svc.log 2>&1 &
server=$!
python3 - "$SVC_PORT" <<'PY' > /logs/verifier/reward.json
import json, socket, sys, time
port = int(sys.argv[1])
for _ in range(50):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as conn:
            answer = conn.recv(64).decode().strip()
        break
    except OSError:
        time.sleep(0.1)
else:
    answer = None
print(json.dumps({"reward": 1.0 if answer == "pong" else 0.0, "answered": 1.0 if answer else 0.0}))
PY
kill "$server" 2>/dev/null
cat /tmp/svc.log
