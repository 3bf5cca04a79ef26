#!/bin/bash
set -e
echo "hello from rollserve" > /etc/motd
mkdir -p /opt/greeting/bin
printf '#!/bin/sh\necho "hi $1"\n' > /opt/greeting/bin/greet
chmod +x /opt/greeting/bin/greet
