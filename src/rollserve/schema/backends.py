"""Inference backends registered at run time (a trainer re-registers after a weight update),
and the pause/resume of a model around a weight update."""

from __future__ import annotations

from typing import Any, Literal
from urllib.parse import urlsplit

import httpx
from pydantic import BaseModel, Field, field_validator

from rollserve.schema.tokens import LogprobMode
from rollserve.schema.wire import WireModel

PauseMode = Literal["wait", "abort"]
"""wait: new turns wait, turns in flight finish; abort: turns in flight are aborted too."""


def check_version(value: Any) -> Any:
    """Policy versions are ordered integers: a string (even of digits) is refused by name;
    a number written with a fraction of zero (``3.0``) is the integer it is."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str | float | bool):
        raise ValueError(
            f"policy_version must be a non-negative integer that grows with every weight "
            f"update (the trainer's step), not {value!r}"
        )
    return value


def check_url(value: str) -> str:
    """An http(s) URL with a host, and nothing in it that a request line cannot carry."""
    if any(c.isspace() or not c.isprintable() for c in value):
        raise ValueError("the url has spaces or control characters")
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 (an invalid port raises)
    except ValueError as exc:
        raise ValueError(f"the url is not valid: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{value!r} is not an http(s) URL with a host")
    try:
        httpx.URL(value)  # what will send the requests: its host must be one it can encode
    except httpx.InvalidURL as exc:
        raise ValueError(f"the url is not valid: {exc}") from None
    return value


class BackendSpec(WireModel):
    """An OpenAI-compatible inference server: vLLM, SGLang, or any other."""

    id: str | None = Field(
        None, min_length=1, max_length=200, description="default: derived from the url"
    )
    kind: str = Field(
        "openai",
        min_length=1,
        max_length=100,
        description="the server's kind: vllm, sglang, openai, or one a plug-in adds",
    )
    url: str = Field(
        pattern=r"^https?://",
        max_length=2048,
        description="base URL, e.g. http://host:8000/v1",
    )
    model: str = Field(min_length=1, max_length=200)
    tokenizer: str | None = Field(
        None, description="a local Hugging Face tokenizer directory; enables token mode"
    )
    weight: float = Field(1.0, gt=0, description="share of the load, relative to the others")
    max_concurrency: int | None = Field(None, ge=1, description="requests in flight at most")
    max_model_len: int | None = Field(
        None, ge=1, description="context length; default: the tokenizer's model_max_length"
    )
    policy_version: int | None = Field(
        None, ge=0, description="the weights' version (the trainer's step), recorded per turn"
    )
    logprob_mode: LogprobMode | None = Field(
        None,
        description="what the server's logprobs are, as it was started: raw (before temperature;"
        " vLLM's default) or processed (after temperature; SGLang's default). Default: the"
        " kind's default",
    )

    _version = field_validator("policy_version", mode="before")(check_version)
    _url = field_validator("url")(check_url)


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
    paused: bool = Field(False, description="its model is paused for a weight update")
    context_limit: int | None = Field(
        None,
        description="tokens a trajectory may reach here: the served max_model_len, less"
        " the server's headroom",
    )
    warnings: list[str] = Field(default_factory=list, description="found at registration")


class PauseRequest(WireModel):
    """``POST /v1/llm/models/{model}/pause``: stop a model's generation for a weight update."""

    mode: PauseMode = Field(
        "wait",
        description="wait: new turns wait, turns in flight finish; abort: turns in flight are"
        " aborted and resumed after the resume",
    )
    admission: bool = Field(False, description="also hold new jobs of the model before init")
    timeout_s: float = Field(
        600.0, ge=0, le=3600, description="how long the call waits for turns in flight to end"
    )


class ResumeRequest(WireModel):
    """``POST /v1/llm/models/{model}/resume``: generation goes on, under new weights."""

    policy_version: int | None = Field(
        None, ge=0, description="the new weights' version: set on every backend of the model"
    )

    _version = field_validator("policy_version", mode="before")(check_version)


class ModelState(BaseModel):
    """A model's pause state, as the pause and resume calls answer it: the pause of this node,
    and the calls in flight on every node of the store."""

    model: str
    paused: bool
    mode: PauseMode | None = None
    admission_paused: bool = False
    policy_version: int | None = Field(None, description="the newest version registered")
    in_flight: int = Field(
        0, description="model calls still running on its backends, on every node of the store"
    )
    nodes_pending: list[str] = Field(
        default_factory=list,
        description="nodes that have not yet taken up the pause or still run calls of the model",
    )
    aborted: int = Field(0, description="calls aborted by this pause, to be resumed")
    paused_s: float = Field(0.0, description="how long the current pause has lasted")
