"""Token-exact trajectories (token mode) and what each model turn used."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class TurnInfo(BaseModel):
    """One model call: where it ran and what it produced."""

    model_config = ConfigDict(extra="forbid")

    backend_id: str
    model: str
    policy_version: str | None = None
    prompt_tokens: int = Field(0, description="tokens the backend received (token mode)")
    generated_tokens: int = 0
    finish_reason: str = Field(description="stop | length | tool_calls")
    truncated: bool = Field(False, description="cut by the token budget, not ended by the model")


class Tokens(BaseModel):
    """A token-mode trajectory: ``prompt_ids + response_ids`` is exactly what the backend saw
    in the last turn plus what it generated. ``response_mask`` is 1 for generated tokens and 0
    for observations and template tokens; ``response_logprobs`` is 0.0 where the mask is 0."""

    model_config = ConfigDict(extra="forbid")

    prompt_ids: list[int]
    response_ids: list[int] = Field(default_factory=list)
    response_mask: list[int] = Field(default_factory=list)
    response_logprobs: list[float] = Field(default_factory=list)
    turns: list[TurnInfo] = Field(default_factory=list)
