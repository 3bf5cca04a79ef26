"""What one shell command returns."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class CommandResult(BaseModel):
    """Output and status of one command run in a persistent shell session."""

    model_config = ConfigDict(extra="forbid")

    output: str = Field(description="stdout and stderr interleaved, ANSI escapes stripped")
    exit_code: int | None = Field(
        description="None while waiting for input or after a timeout interrupted the command"
    )
    duration_s: float
    timed_out: bool = False
    truncated: bool = False
    waiting_for_input: bool = Field(
        False, description="the command is blocked reading the terminal; send input or interrupt"
    )
    dropped_bytes: int = Field(0, description="bytes cut from the middle of a huge output")
