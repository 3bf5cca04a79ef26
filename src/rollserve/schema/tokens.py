"""Token-exact trajectories (token mode) and what each model turn used.

Policy versions are non-negative integers that grow with every weight update (the trainer's
step); a turn records the version that generated it, segment by segment when an aborted
generation was resumed under newer weights."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

LogprobMode = Literal["raw", "processed"]
"""``raw``: log-softmax of the model's logits (vLLM's default); ``processed``: after
temperature scaling (SGLang's default)."""


def legacy_version(value: Any) -> Any:
    """Results stored before versions were integers carried free-form strings: digits are
    read as the integer, anything else as unknown (None)."""
    if isinstance(value, str):
        return int(value) if value.isdigit() else None
    return value


class TokenSpan(BaseModel):
    """A half-open range ``[start, end)`` of positions in ``prompt_ids + response_ids``."""

    model_config = ConfigDict(extra="forbid")

    start: int = Field(ge=0)
    end: int = Field(ge=0)


class Segment(BaseModel):
    """One request to a backend within a turn. A turn has one segment, or several when its
    generation was aborted (a weight update, a backend lost) and resumed from the tokens it had."""

    model_config = ConfigDict(extra="forbid")

    backend_id: str
    policy_version: int | None = None
    weight_version: str | None = Field(
        None, description="the version the inference server itself reported (SGLang)"
    )
    generated_tokens: int = 0
    finish_reason: str = Field(description="stop | length | abort | repetition | tool_calls")

    _legacy = field_validator("policy_version", mode="before")(legacy_version)


class TurnInfo(BaseModel):
    """One model call: where it ran and what it produced."""

    model_config = ConfigDict(extra="forbid")

    backend_id: str
    model: str
    policy_version: int | None = Field(
        None, description="the version that generated the turn's last segment"
    )
    prompt_tokens: int = Field(0, description="tokens the backend received (token mode)")
    generated_tokens: int = 0
    finish_reason: str = Field(description="stop | length | repetition | tool_calls")
    truncated: bool = Field(False, description="cut by the token budget, not ended by the model")
    segments: list[Segment] = Field(default_factory=list)
    prompt: TokenSpan | None = Field(
        None, description="token mode: the turn's prompt within prompt_ids + response_ids"
    )
    generation: TokenSpan | None = Field(
        None, description="token mode: what the turn generated within prompt_ids + response_ids"
    )
    sampling: dict[str, Any] = Field(
        default_factory=dict, description="the sampling fields sent with the turn's request"
    )
    latency_s: float | None = Field(
        None, description="seconds from the turn's first request to its last answer"
    )

    _legacy = field_validator("policy_version", mode="before")(legacy_version)

    @property
    def versions(self) -> list[int]:
        """The policy versions of the turn's segments (known ones)."""
        found = [s.policy_version for s in self.segments if s.policy_version is not None]
        if not found and self.policy_version is not None:
            found = [self.policy_version]
        return found


class Tokens(BaseModel):
    """A token-mode trajectory: ``prompt_ids + response_ids`` is exactly what the backend saw
    in the last turn plus what it generated. ``response_mask`` is 1 for generated tokens and 0
    for observations and template tokens; ``response_logprobs`` is 0.0 where the mask is 0."""

    model_config = ConfigDict(extra="forbid")

    prompt_ids: list[int]
    response_ids: list[int] = Field(default_factory=list)
    response_mask: list[int] = Field(default_factory=list)
    response_logprobs: list[float] = Field(default_factory=list)
    logprob_mode: LogprobMode | None = Field(
        None, description="what the logprobs are: raw (before temperature) or processed"
    )
    turns: list[TurnInfo] = Field(default_factory=list)
    segment: int = Field(0, ge=0, description="its place among the trajectory's segments")
    started_by: str | None = Field(
        None,
        description="why a new segment began: the agent's history no longer extended an "
        "earlier segment's (rewritten, truncated, another conversation)",
    )

    @model_validator(mode="after")
    def _lengths_agree(self) -> Tokens:
        """``response_mask`` and ``response_logprobs`` have one entry per response token, the
        mask holds only 0 and 1, and each turn's spans lie within the trajectory."""
        n = len(self.response_ids)
        for name in ("response_mask", "response_logprobs"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name} has {len(getattr(self, name))} entries, response_ids {n}")
        if any(m not in (0, 1) for m in self.response_mask):
            raise ValueError("response_mask holds values other than 0 and 1")
        total = len(self.prompt_ids) + n
        for index, turn in enumerate(self.turns):
            for span in (turn.prompt, turn.generation):
                if span is not None and not span.start <= span.end <= total:
                    raise ValueError(
                        f"turns[{index}]: span [{span.start}, {span.end}) is outside the "
                        f"{total} tokens of prompt_ids + response_ids"
                    )
        return self
