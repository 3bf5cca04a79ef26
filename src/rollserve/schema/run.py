"""What the run stage hands to evaluation, kept in the job store between the two (so that an
evaluation resumes after a restart, on any node)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rollserve.schema.jobs import ExitReason


@dataclass
class RunOutput:
    """What the run stage hands to evaluation: kept in the job store, so that evaluation can
    resume after a restart."""

    exit_reason: ExitReason
    submission: str | None = None  # the answer, or the patch of a repository task
    messages: list[dict[str, Any]] = field(default_factory=list)
    turns: int = 0
    tokens: dict[str, Any] | None = None
    tool_errors: int = 0
    policy_versions: list[int] = field(default_factory=list)  # of every model call's segments
    turn_log: list[dict[str, Any]] = field(default_factory=list)  # TurnLog, one per model turn
    segments: list[dict[str, Any]] = field(default_factory=list)  # Tokens, when more than one
    agent_run: dict[str, Any] | None = None  # AgentRun: the agent process, where one ran
    layer: str | None = None  # what a writable-root sandbox wrote, kept for evaluation

    def to_json(self) -> dict[str, Any]:
        return {
            "exit_reason": self.exit_reason.value,
            "submission": self.submission,
            "messages": self.messages,
            "turns": self.turns,
            "tokens": self.tokens,
            "tool_errors": self.tool_errors,
            "policy_versions": self.policy_versions,
            "turn_log": self.turn_log,
            "segments": self.segments,
            "agent_run": self.agent_run,
            "layer": self.layer,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunOutput:
        return cls(
            exit_reason=ExitReason(data["exit_reason"]),
            submission=data["submission"],
            messages=data["messages"],
            turns=data["turns"],
            tokens=data["tokens"],
            tool_errors=data.get("tool_errors", 0),
            policy_versions=data.get("policy_versions", []),
            turn_log=data.get("turn_log", []),
            segments=data.get("segments", []),
            agent_run=data.get("agent_run"),
            layer=data.get("layer"),
        )
