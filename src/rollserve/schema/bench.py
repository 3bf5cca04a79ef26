"""Figures printed by ``rollserve bench``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

ShellMethod = Literal["pty", "tmux", "bash_c"]


class ShellBenchResult(BaseModel):
    """Latency of trivial commands by one method in one backend."""

    model_config = ConfigDict(extra="forbid")

    backend: str
    method: ShellMethod
    p50_ms: float
    p99_ms: float
    n: int
