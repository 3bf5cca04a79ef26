"""Inference backends registered at run time (a trainer re-registers after a weight update)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class BackendSpec(BaseModel):
    """An OpenAI-compatible inference server: vLLM, SGLang, or any other."""

    model_config = ConfigDict(extra="forbid")

    id: str | None = Field(None, min_length=1, description="default: derived from the url")
    kind: Literal["vllm", "sglang", "openai"] = "openai"
    url: str = Field(pattern=r"^https?://", description="base URL, e.g. http://host:8000/v1")
    model: str = Field(min_length=1)
    tokenizer: str | None = Field(
        None, description="a local Hugging Face tokenizer directory; enables token mode"
    )
    weight: float = Field(1.0, gt=0, description="share of the load, relative to the others")
    max_concurrency: int | None = Field(None, ge=1, description="requests in flight at most")
    max_model_len: int | None = Field(
        None, ge=1, description="context length; default: the tokenizer's model_max_length"
    )
    policy_version: str | None = Field(None, description="recorded with every turn it serves")


class BackendView(BackendSpec):
    """A registered backend and its live state on this node."""

    id: str
    registered_at: float
    healthy: bool = True
    draining: bool = False
    in_flight: int = 0
    served: int = Field(0, description="requests answered since registration on this node")
    failures: int = Field(0, description="requests that failed on this backend")
    last_error: str | None = None
