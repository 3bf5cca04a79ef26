"""``python -m rollserve.harness NAME``: run harness NAME for the job whose gateway key and
socket are in ``ROLLSERVE_GATEWAY_KEY`` and ``ROLLSERVE_GATEWAY_SOCKET`` (rollserve's
``harness`` agent starts it so, in the harness's own environment)."""

from __future__ import annotations

import importlib
import json
import os
import sys
from importlib.metadata import entry_points
from typing import Any

from rollserve.harness.base import Harness, HarnessJob
from rollserve.harness.relay import LoopbackRelay

BUILT_IN = {"mini-swe-agent": "rollserve.harness.mini_swe:MiniSweAgent"}
GROUP = "rollserve.harnesses"


def find(name: str) -> Harness:
    """The harness called ``name``: built in, an entry point, or ``module:attribute``."""
    known = dict(BUILT_IN)
    known.update({point.name: point.value for point in entry_points(group=GROUP)})
    target = known.get(name, name if ":" in name else None)
    if target is None:
        names = ", ".join(sorted(known))
        raise SystemExit(f"rollserve.harness: unknown harness {name!r}; known: {names}")
    module, _, attribute = target.partition(":")
    found: Any = getattr(importlib.import_module(module), attribute)
    harness: Harness = found() if isinstance(found, type) else found
    return harness


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m rollserve.harness NAME", file=sys.stderr)
        return 2
    harness = find(argv[0])
    socket = os.environ["ROLLSERVE_GATEWAY_SOCKET"]
    key = os.environ["ROLLSERVE_GATEWAY_KEY"]
    options = json.loads(os.environ.get("ROLLSERVE_HARNESS_OPTIONS") or "{}")
    relay = LoopbackRelay(socket).start()
    base_url = f"http://127.0.0.1:{relay.port}/v1/gateway/{key}/v1"
    job = HarnessJob(socket, key, base_url, options)
    try:
        harness.run(job)
    finally:
        job.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
