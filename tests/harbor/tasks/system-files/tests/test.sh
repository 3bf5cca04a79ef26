#!/bin/bash
# The check reads files outside the task's working directory: /etc and /opt.
ok=1
[ "$(cat /etc/motd 2>/dev/null)" = "hello from rollserve" ] || { echo "motd is wrong"; ok=0; }
[ "$(/opt/greeting/bin/greet world 2>/dev/null)" = "hi world" ] || { echo "greet is wrong"; ok=0; }
echo "$ok" > /logs/verifier/reward.txt
