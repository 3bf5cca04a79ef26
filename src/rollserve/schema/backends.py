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
    tokenizer: str | None = Field(None, description="enables token mode (vllm, sglang)")
    max_concurrency: int | None = Field(None, ge=1)
    policy_version: str | None = None


class BackendView(BackendSpec):
    id: str
    registered_at: float
