"""A latency-emulating model for the pipeline benchmarks: an in-process text-mode backend that
sits behind the real Router and answers every turn with a scripted tool call.

Turn ``k`` of a rollout calls ``tool`` (``bash`` by default) with the script's ``k``-th command,
and the turn after the last command submits the task's prompt as the answer (what the ``echo``
task rewards). Each call takes ``latency_s`` scaled by a factor drawn from
``[1 - jitter, 1 + jitter]``, seeded by the rollout and the turn, so that every mode of a
benchmark sees the same model; at most ``slots`` calls generate at once. The backend records
how long its slots were busy and when each episode's calls started and ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import shlex
import time
from dataclasses import dataclass, field
from typing import Any

from rollserve.errors import InvalidInputError
from rollserve.llm.base import ChatCompletion, SamplingParams, TokenCompletion
from rollserve.schema.backends import BackendView
from rollserve.settings import Settings


@dataclass(frozen=True)
class ModelScript:
    """What the emulated model does: its commands (``{prompt}`` is replaced by the task's
    prompt, shell-quoted), its speed, and how many calls it serves at once."""

    commands: tuple[str, ...]
    tool: str = "bash"
    latency_s: float = 0.0
    jitter: float = 0.0
    slots: int | None = None
    seed: int = 0
    barrier: int = 0  # hold first calls until this many rollouts made theirs (0: no barrier)
    barrier_timeout_s: float = 300.0
    checkpoint: int = 0  # with a barrier: hold this turn's calls until ``measured`` is set
    checkpoint_timeout_s: float = 120.0

    def latency(self, rollout: str, turn: int) -> float:
        """The seconds one call takes: the same for a rollout's turn in every mode."""
        if self.latency_s <= 0:
            return 0.0
        if self.jitter <= 0:
            return self.latency_s
        rng = random.Random(f"{self.seed}:{rollout}:{turn}")
        return self.latency_s * rng.uniform(1 - self.jitter, 1 + self.jitter)


@dataclass
class CallLog:
    """When a rollout's model calls started and ended (``time.perf_counter``)."""

    starts: list[float] = field(default_factory=list)
    ends: list[float] = field(default_factory=list)


class ScriptedToolBackend:
    """An LLMBackend (text mode) that answers with the script's tool calls."""

    def __init__(self, view: BackendView, script: ModelScript) -> None:
        self.view = view
        self.script = script
        self._slots = asyncio.Semaphore(script.slots) if script.slots else None
        self._arrived = 0
        self._released = asyncio.Event()
        self.barrier_reached = 0  # first calls that had arrived when the barrier opened
        self.checkpoint = asyncio.Event()  # every rollout has started the checkpoint turn
        self.measured = asyncio.Event()  # whoever waited for the checkpoint lets the calls go
        self._at_checkpoint = 0
        self.calls = 0
        self.busy_s = 0.0  # slot-seconds spent generating
        self.logs: list[CallLog] = []  # one per episode (a rollout run again gets another)
        self._current: dict[str, CallLog] = {}

    @property
    def token_mode(self) -> bool:
        """Always False: the script answers in OpenAI chat format."""
        return False

    async def check(self) -> None:
        """Always healthy."""

    async def verify(self) -> None:
        """Nothing to verify: there is no server."""

    async def complete_tokens(
        self, prompt_ids: list[int], sampling: SamplingParams
    ) -> TokenCompletion:
        raise InvalidInputError(f"backend {self.view.id} has no token mode", field="kind")

    async def chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        sampling: SamplingParams,
    ) -> ChatCompletion:
        """The next scripted tool call, after the emulated generation time."""
        prompt = str(messages[1]["content"]) if len(messages) > 1 else ""
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        log = self._current.get(prompt)
        if log is None or turn == 0:
            log = self._current[prompt] = CallLog()
            self.logs.append(log)
        log.starts.append(time.perf_counter())
        if turn == 0 and self.script.barrier:
            await self._barrier()
        if self.script.barrier and turn == self.script.checkpoint > 0:
            self._at_checkpoint += 1
            if self._at_checkpoint >= self.barrier_reached:
                self.checkpoint.set()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.script.checkpoint_timeout_s):
                    await self.measured.wait()
        seconds = self.script.latency(prompt, turn)
        if self._slots is None:
            await self._generate(seconds)
        else:
            async with self._slots:
                await self._generate(seconds)
        self.calls += 1
        log.ends.append(time.perf_counter())
        commands = self.script.commands
        if turn < len(commands):
            name = self.script.tool
            arguments: dict[str, Any] = {
                "command": commands[turn].replace("{prompt}", shlex.quote(prompt))
            }
        else:
            name, arguments = "submit", {"answer": prompt}
        call = {"id": f"call-{turn}", "name": name, "arguments": json.dumps(arguments)}
        return ChatCompletion(
            content="",
            tool_calls=[call],
            finish_reason="tool_calls",
            usage={"prompt_tokens": 16 * len(messages), "completion_tokens": 16},
        )

    async def _generate(self, seconds: float) -> None:
        begun = time.perf_counter()
        if seconds > 0:
            await asyncio.sleep(seconds)
        else:
            await asyncio.sleep(0)  # an instant model still answers through the event loop
        self.busy_s += time.perf_counter() - begun

    async def _barrier(self) -> None:
        self._arrived += 1
        if self._arrived >= self.script.barrier and not self._released.is_set():
            self.barrier_reached = self._arrived
            self._released.set()
        try:
            async with asyncio.timeout(self.script.barrier_timeout_s):
                await self._released.wait()
        except TimeoutError:
            if not self._released.is_set():
                self.barrier_reached = self._arrived
                self._released.set()

    async def aclose(self) -> None:
        """Nothing to close."""


class ScriptedToolFactory:
    """A router backend factory building ScriptedToolBackends; keeps the last one built."""

    def __init__(self, script: ModelScript) -> None:
        self.script = script
        self.built: ScriptedToolBackend | None = None

    def __call__(self, view: BackendView, settings: Settings) -> ScriptedToolBackend:
        self.built = ScriptedToolBackend(view, self.script)
        return self.built

    @property
    def backend(self) -> ScriptedToolBackend:
        """The registered backend."""
        if self.built is None:
            raise InvalidInputError("no benchmark backend was registered")
        return self.built
