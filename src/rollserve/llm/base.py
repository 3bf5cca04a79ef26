"""The inference backend Protocol: one server (vLLM, SGLang, any OpenAI-compatible endpoint)
that generates either from token ids (token mode) or from chat messages (text mode)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from rollserve.schema.backends import BackendView


@dataclass(frozen=True)
class SamplingParams:
    """What a turn asks of the backend; ``max_tokens`` is already cut to the context budget.
    Every field is sent (neutral values included), so the server's defaults never apply."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()  # strings an agent asked to stop at (the gateway)

    def fields(self) -> dict[str, Any]:
        """The sampling fields as recorded with a turn (the stop ids are the template's); the
        stop strings only when there are some (none is every server's default)."""
        values = asdict(self)
        del values["stop_token_ids"]
        if self.stop:
            values["stop"] = list(self.stop)
        else:
            del values["stop"]
        return values


# How a token-mode generation ended: ``stop`` (an end or stop token: the turn is complete),
# ``length`` (its max_tokens), ``repetition`` (the server cut a repetition loop: vLLM 0.34),
# ``abort`` (cut before its end, e.g. a weight update: resumed from the tokens it has).
FINISH_REASONS = frozenset({"stop", "length", "repetition", "abort"})

LOGPROB_FLOOR = -9999.0  # vLLM's floor for -inf (JSON has none); also stands for a null entry


@dataclass
class TokenCompletion:
    """A token-mode generation: exactly the ids the backend produced, with their logprobs."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # one of FINISH_REASONS
    weight_version: str | None = None  # what the server reported (SGLang's meta_info)


@dataclass
class ChatCompletion:
    """A text-mode generation: the assistant message in OpenAI chat format."""

    content: str
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # OpenAI tool_calls
    finish_reason: str = "stop"
    usage: dict[str, int] = field(default_factory=dict)


class LLMBackend(Protocol):
    """One registered inference server. Network failures, timeouts and broken answers (not
    JSON, the wrong shape, ids outside the vocabulary, logprobs that do not match the ids)
    raise BackendUnavailable (the router then fails the turn over to another backend); a
    refused request raises InvalidInputError or BackendRequestError with what the server
    said."""

    view: BackendView

    @property
    def token_mode(self) -> bool:
        """Whether ``complete_tokens`` works (vllm/sglang with a tokenizer)."""
        ...

    async def check(self) -> None:
        """Raise BackendUnavailable unless the server answers (health)."""
        ...

    async def verify(self) -> None:
        """Registration check: the server answers, is the declared kind, serves the model, and
        the tokenizer (if any) loads and has a chat template; raises InvalidInputError naming
        the field."""
        ...

    async def complete_tokens(
        self, prompt_ids: list[int], sampling: SamplingParams
    ) -> TokenCompletion: ...

    async def chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        sampling: SamplingParams,
    ) -> ChatCompletion: ...

    async def aclose(self) -> None: ...
