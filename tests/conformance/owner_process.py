"""A rollserve process that starts a sandbox with busy processes, reports them, and waits to be
killed: the test then checks that nothing of it outlives the next start's reaper."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from rollserve.sandbox import SandboxManager, spec_for
from rollserve.settings import Settings
from rollserve.shell import ShellSession


async def main(backend: str, data_dir: str) -> None:
    manager = SandboxManager(Settings(data_dir=Path(data_dir)))
    box = await manager.start(spec_for(backend))
    session = await ShellSession.open(box)
    await session.run("sleep 1000 & (sleep 1000 &) ; nohup sleep 1000 >/dev/null 2>&1 &")
    runner = asyncio.create_task(session.run("sleep 1000", timeout=None))
    await asyncio.sleep(0.5)
    procs = [[st.pid, st.start_ticks] for st in box.host_processes()]
    print(json.dumps({"id": box.id, "dir": str(box.workspace.parent), "procs": procs}), flush=True)
    await runner


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
