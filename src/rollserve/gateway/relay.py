"""The relay an external agent's sandbox reaches the gateway through: a static program built
from ``relay.c`` (shipped with rollserve) once per data directory, so that it runs in any
image whatever its C library."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import threading
from importlib import resources
from pathlib import Path

from rollserve.errors import InfrastructureError
from rollserve.settings import Settings

RELAY_IN_SANDBOX = "/run/rollserve/bin/rollserve-relay"
SOCKET_IN_SANDBOX = "/run/rollserve/gateway.sock"

_BUILD_LOCK = threading.Lock()


def relay_source() -> bytes:
    return resources.files("rollserve.gateway").joinpath("relay.c").read_bytes()


def relay_binary(settings: Settings) -> Path:
    """The relay for this rollserve version, built on first use (``cc -static``); raises
    InfrastructureError saying what is missing when it cannot be built."""
    source = relay_source()
    digest = hashlib.sha256(source).hexdigest()[:16]
    target = settings.data_dir / "bin" / f"rollserve-relay-{digest}"
    if target.is_file():
        return target
    with _BUILD_LOCK:
        if target.is_file():
            return target
        compiler = shutil.which(settings.gateway_relay_cc)
        if compiler is None:
            raise InfrastructureError(
                f"the gateway relay needs a C compiler: {settings.gateway_relay_cc!r} is not on "
                "PATH (apt-get install gcc libc6-dev, or set gateway_relay_cc)",
                compiler=settings.gateway_relay_cc,
            )
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = target.with_name(f".{target.name}.{os.getpid()}")
        source_file = staging.with_suffix(".c")
        source_file.write_bytes(source)
        try:
            built = subprocess.run(
                [compiler, "-static", "-O2", "-o", str(staging), str(source_file)],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            if built.returncode != 0:
                raise InfrastructureError(
                    f"building the gateway relay failed: {built.stderr.strip()[-2000:]} "
                    "(a static build needs libc6-dev)",
                    compiler=compiler,
                )
            os.replace(staging, target)  # whole or not at all, for every process at once
        finally:
            source_file.unlink(missing_ok=True)
            staging.unlink(missing_ok=True)
    return target
