"""The cost of a writable root and of handing its layer on (part of ``rollserve bench images``):
a start with the whole image writable, the close that keeps what the sandbox wrote, and a start
with that layer laid under a fresh one, as a Harbor task's run and verifier do."""

from __future__ import annotations

import time
from pathlib import Path

from rollserve.bench.stats import quantile, running_user
from rollserve.sandbox import SandboxManager, spec_for
from rollserve.schema.bench import LayerFigures
from rollserve.settings import Settings
from rollserve.trees import remove_tree

WRITTEN_MB = 10
_WRITE = (
    f"mkdir -p /opt/bench && head -c {WRITTEN_MB * 1024 * 1024} /dev/zero > /opt/bench/blob && "
    "echo bench > /etc/bench"
)


async def layer_figures(
    settings: Settings, backend: str, image: str, work: Path, n: int
) -> LayerFigures:
    """``n`` runs of: start a writable root, write ``WRITTEN_MB`` MB, close keeping the
    layer, start over it and read what was written."""
    starts, keeps, overs = [], [], []
    async with SandboxManager(settings) as manager:
        await manager.close(await manager.start(spec_for(backend, image=image)))  # converted
        for i in range(n):
            layer = work / f"layer-{backend}-{i}"
            began = time.perf_counter()
            box = await manager.start(spec_for(backend, image=image, writable_root=True))
            await box.exec("true")
            starts.append(time.perf_counter() - began)
            await box.exec(_WRITE)
            began = time.perf_counter()
            await box.close_keeping_layer(layer)
            keeps.append(time.perf_counter() - began)
            began = time.perf_counter()
            spec = spec_for(backend, image=image, writable_root=True, lower_layers=[layer])
            over = await manager.start(spec)
            await over.exec("cat /etc/bench")
            overs.append(time.perf_counter() - began)
            await manager.close(over)
            remove_tree(layer)
    return LayerFigures(
        user=running_user(),
        backend=backend,
        written_mb=WRITTEN_MB,
        start_p50_ms=_p50(starts),
        keep_p50_ms=_p50(keeps),
        start_over_layer_p50_ms=_p50(overs),
        n=n,
    )


def _p50(seconds: list[float]) -> float:
    return round(quantile([s * 1000 for s in seconds], 0.5), 1)
