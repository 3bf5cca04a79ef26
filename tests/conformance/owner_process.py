"""A rollserve process that starts a sandbox with busy processes, reports them, and waits to be
killed: the test then checks that nothing of it outlives the next start's reaper. Arguments:
BACKEND DATA_DIR [IMAGE IMAGE_CACHE_DIR]."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from rollserve.sandbox import SandboxManager, spec_for
from rollserve.settings import Settings
from rollserve.shell import ShellSession


async def main(backend: str, data_dir: str, image: str | None, cache: str | None) -> None:
    settings = Settings(data_dir=Path(data_dir))
    if cache is not None:
        settings = settings.model_copy(update={"image_cache_dir": Path(cache)})
    manager = SandboxManager(settings)
    # With an image: its WORKDIR is the workspace (an overlay mount as root).
    box = await manager.start(spec_for(backend, image=image) if image else spec_for(backend))
    session = await ShellSession.open(box)
    await session.run("sleep 1000 & (sleep 1000 &) ; nohup sleep 1000 >/dev/null 2>&1 &")
    runner = asyncio.create_task(session.run("sleep 1000", timeout=None))
    await asyncio.sleep(0.5)
    procs = [[st.pid, st.start_ticks] for st in box.host_processes()]
    print(json.dumps({"id": box.id, "dir": str(box.workspace.parent), "procs": procs}), flush=True)
    await runner


if __name__ == "__main__":
    image, cache = (sys.argv[3], sys.argv[4]) if len(sys.argv) > 4 else (None, None)
    asyncio.run(main(sys.argv[1], sys.argv[2], image, cache))
