"""The bash tool tells the model when a command ran into the sandbox's limits: a process the
kernel killed over the memory limit is otherwise a bare exit code 137."""

from __future__ import annotations

from rollserve.agents.tools import Toolbox
from rollserve.llm.toolcalls import ToolCall
from rollserve.sandbox import SandboxManager, spec_for
from rollserve.schema.sandbox import SandboxLimits
from tests.conformance.conftest import require

HOG = "python3 -c 'b = bytearray(512 * 1024 * 1024); print(len(b))'"


async def test_a_command_over_the_memory_limit_is_reported_as_such(
    manager: SandboxManager,
) -> None:
    require(manager, "bwrap")
    spec = spec_for("bwrap").model_copy(update={"limits": SandboxLimits(memory_mb=64)})
    box = await manager.start(spec)
    toolbox = Toolbox(box, ["bash"], command_timeout_s=30.0)
    try:
        outcome = await toolbox.call(ToolCall("bash", {"command": HOG}, "call_0"))
        cgroup = box.cgroup
        if cgroup is not None and "memory" in cgroup.controllers:
            assert "memory limit of 64 MB was reached" in outcome.output, outcome.output
        else:  # rlimits: the allocation itself fails, and Python says so
            assert "MemoryError" in outcome.output, outcome.output
        assert "536870912" not in outcome.output
        after = await toolbox.call(ToolCall("bash", {"command": "echo fine"}, "call_1"))
        assert "fine" in after.output and "limit" not in after.output
    finally:
        await toolbox.close()
        await manager.close(box)


async def test_no_note_without_a_limit_hit(manager: SandboxManager) -> None:
    require(manager, "bwrap")
    box = await manager.start(spec_for("bwrap"))
    toolbox = Toolbox(box, ["bash"], command_timeout_s=30.0)
    try:
        outcome = await toolbox.call(ToolCall("bash", {"command": "(exit 137)"}, "call_0"))
        assert outcome.output == "[exit code 137]"
    finally:
        await toolbox.close()
        await manager.close(box)
