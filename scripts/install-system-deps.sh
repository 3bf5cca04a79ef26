#!/usr/bin/env bash
# Installs the Debian packages rollserve needs, only those that are missing.
set -euo pipefail

missing=()
have() { command -v "$1" >/dev/null 2>&1; }
have bwrap || missing+=(bubblewrap)
have tmux || missing+=(tmux)
have git || missing+=(git)
have patch || missing+=(patch)
have setpriv || missing+=(util-linux)
have debootstrap || missing+=(debootstrap)
have less || missing+=(less)
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || missing+=(python3-venv)
# PostgreSQL: the shared job store's client library, and a server that the tests start.
ldconfig -p | grep -q 'libpq\.so\.5' || missing+=(libpq5)
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || missing+=(postgresql)
# Slurm and munge: deploy/slurm is tested on a one-machine cluster that the test starts.
[ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/slurmd ] || missing+=(slurm-wlm)
[ -x /usr/sbin/munged ] || missing+=(munge)
# Chromium: the web viewer's end-to-end tests drive it through Playwright.
[ -x /usr/bin/chromium ] || missing+=(chromium)

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "installing Debian packages: ${missing[*]}"
sudo=()
if [ "$(id -u)" -ne 0 ]; then
  if have sudo; then sudo=(sudo); else
    echo "error: need root (or sudo) to apt-get install ${missing[*]}" >&2; exit 1
  fi
fi
"${sudo[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends \
  "${missing[@]}"
