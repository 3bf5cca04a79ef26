"""What every HTTP inference backend shares: the OpenAI-style ``/models`` and
``/chat/completions`` endpoints, and the mapping of network failures to rollserve errors."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx

from rollserve.errors import (
    BackendRequestError,
    BackendUnavailableError,
    InvalidInputError,
    RollserveError,
)
from rollserve.llm.base import ChatCompletion, SamplingParams
from rollserve.llm.clients import ClientSet
from rollserve.llm.templates import TemplateCache
from rollserve.schema.backends import BackendView
from rollserve.schema.tokens import LogprobMode
from rollserve.settings import Settings

_CONNECT_S = 10.0  # connecting to a backend at most


class HttpBackend:
    """The OpenAI-compatible part of a backend; token mode is added by the vllm and sglang
    kinds. Subclasses set ``supports_tokens``."""

    supports_tokens = False
    default_logprob_mode: LogprobMode | None = None
    context_headroom = 0  # tokens the server needs beyond prompt + generation
    # The sampling fields a chat request carries: OpenAI's own; vLLM and SGLang take them all.
    chat_fields: tuple[str, ...] = (
        "temperature",
        "top_p",
        "presence_penalty",
        "frequency_penalty",
        "seed",
    )

    def __init__(self, view: BackendView, settings: Settings, templates: TemplateCache) -> None:
        if view.logprob_mode is None and self.default_logprob_mode is not None:
            view = view.model_copy(update={"logprob_mode": self.default_logprob_mode})
        self.view = view
        self.templates = templates
        self._timeout_s = settings.llm_request_timeout_s
        self._http = ClientSet(httpx.Timeout(self._timeout_s, connect=_CONNECT_S))

    @property
    def token_mode(self) -> bool:
        return self.supports_tokens and self.view.tokenizer is not None

    @property
    def root(self) -> str:
        """The server's root: the base URL without its ``/v1``."""
        url = self.view.url
        return url[: -len("/v1")] if url.endswith("/v1") else url

    async def aclose(self) -> None:
        await self._http.aclose()

    async def request(self, method: str, url: str, body: dict[str, Any] | None = None) -> Any:
        """One HTTP call of at most ``llm_request_timeout_s`` in all: network failures, a
        timeout, 5xx and an answer that is not JSON → BackendUnavailableError (fail over);
        other refusals → BackendRequestError with what the server said."""
        try:
            async with asyncio.timeout(self._timeout_s):  # httpx bounds each read, not the call
                answer = await self._http.request(method, url, body)
        except (TimeoutError, httpx.TimeoutException) as exc:
            bound = (
                f"could not connect within {_CONNECT_S:g}s"
                if isinstance(exc, httpx.ConnectTimeout)
                else f"no complete answer within {self._timeout_s:g}s (llm_request_timeout_s)"
            )
            raise BackendUnavailableError(
                f"backend {self.view.id} ({url}): {bound}", backend_id=self.view.id
            ) from exc
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            raise BackendUnavailableError(
                f"backend {self.view.id} ({url}): {type(exc).__name__}: {exc}",
                backend_id=self.view.id,
            ) from exc
        if answer.status_code >= 500:
            raise BackendUnavailableError(
                f"backend {self.view.id} ({url}) answered HTTP {answer.status_code}: "
                f"{_excerpt(answer)}",
                backend_id=self.view.id,
            )
        if answer.status_code >= 400:
            raise BackendRequestError(
                f"backend {self.view.id} ({url}) refused the request with HTTP "
                f"{answer.status_code}: {_excerpt(answer)}",
                backend_id=self.view.id,
                status=answer.status_code,
            )
        try:
            return answer.json()
        except json.JSONDecodeError as exc:
            kind = answer.headers.get("content-type", "no content type")
            raise BackendUnavailableError(
                f"backend {self.view.id} ({url}) answered HTTP {answer.status_code} with "
                f"something that is not JSON ({kind}): {answer.text[:200]!r}",
                backend_id=self.view.id,
            ) from exc

    async def check(self) -> None:
        await self.request("GET", f"{self.view.url}/models")

    async def verify(self) -> None:
        """Registration: the server answers ``GET /models`` and serves the model; a tokenizer
        loads and has a chat template; then the kind's own probe."""
        try:
            listing = await self.request("GET", f"{self.view.url}/models")
        except RollserveError as exc:
            raise InvalidInputError(
                f"backend {self.view.url} did not answer GET /models: {exc.message}", field="url"
            ) from exc
        served = [m.get("id") for m in listing.get("data", []) if isinstance(m, dict)]
        if not isinstance(listing, dict) or not served:
            raise InvalidInputError(
                f"backend {self.view.url}: GET /models listed no models", field="url"
            )
        if self.view.model not in served:
            raise InvalidInputError(
                f"backend {self.view.url} does not serve {self.view.model!r}; it serves: "
                + ", ".join(str(s) for s in served),
                field="model",
            )
        if self.view.tokenizer is not None:
            if not self.supports_tokens:
                raise InvalidInputError(
                    f"kind {self.view.kind!r} has no token mode; a tokenizer needs vllm or sglang",
                    field="tokenizer",
                )
            await self.templates.aget(self.view.tokenizer)
        card = next(m for m in listing["data"] if m.get("id") == self.view.model)
        self.view = self.view.model_copy(update={"context_limit": self._context(card)})
        if self.view.tokenizer is not None:
            await self.probe_tokens()
        self.view = self.view.model_copy(update={"warnings": await self.warnings()})

    def _context(self, card: dict[str, Any]) -> int | None:
        """The tokens a trajectory may reach: the context length the server reports (both
        vLLM and SGLang list ``max_model_len``), else the registration's, else the
        tokenizer's; a registered ``max_model_len`` below the served one caps it; less the
        server's headroom."""
        served = card.get("max_model_len")
        limits = [n for n in (served, self.view.max_model_len) if isinstance(n, int) and n > 0]
        if not limits and self.view.tokenizer is not None:
            length = self.templates.get(self.view.tokenizer).max_length
            limits = [length] if length else []
        return min(limits) - self.context_headroom if limits else None

    async def probe_tokens(self) -> None:
        """Check that the server generates from token ids (the kind's protocol)."""

    async def warnings(self) -> list[str]:
        """What registration found that limits the backend without making it unusable."""
        return []

    async def chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        sampling: SamplingParams,
    ) -> ChatCompletion:
        fields = sampling.fields()
        body: dict[str, Any] = {
            "model": self.view.model,
            "messages": messages,
            "max_tokens": sampling.max_tokens,
            **{name: fields[name] for name in self.chat_fields if fields[name] is not None},
            **({"stop": fields["stop"]} if "stop" in fields else {}),
        }
        if tools:
            body["tools"] = tools
        answer = await self.request("POST", f"{self.view.url}/chat/completions", body)
        try:
            return _chat_completion(answer)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            raise BackendUnavailableError(
                f"backend {self.view.id} answered a malformed chat completion "
                f"({type(exc).__name__}: {exc}): {str(answer)[:300]}",
                backend_id=self.view.id,
            ) from exc


def _chat_completion(answer: Any) -> ChatCompletion:
    """An OpenAI chat completion as rollserve keeps it; raises (KeyError, TypeError, …) on
    anything else, so that no part of a broken answer reaches a trajectory."""
    choice = answer["choices"][0]
    message = choice["message"]
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise TypeError("the message's content is not text")
    calls = []
    for i, call in enumerate(message.get("tool_calls") or []):
        name, arguments = call["function"]["name"], call["function"].get("arguments") or "{}"
        if isinstance(arguments, dict):  # some servers send the object itself
            arguments = json.dumps(arguments)
        if not isinstance(name, str) or not isinstance(arguments, str):
            raise TypeError(f"tool call {i + 1} has no name or arguments as text")
        calls.append({"id": call.get("id") or f"call_{i}", "name": name, "arguments": arguments})
    finish = choice.get("finish_reason") or "stop"
    usage = answer.get("usage") or {}
    if not isinstance(finish, str) or not isinstance(usage, dict):
        raise TypeError("the finish reason is not text or the usage not an object")
    return ChatCompletion(
        content=content or "",
        tool_calls=calls,
        finish_reason=finish,
        usage={k: v for k, v in usage.items() if type(v) is int},
    )


def _excerpt(answer: httpx.Response) -> str:
    try:
        body = answer.json()
        if isinstance(body, dict) and isinstance(body.get("error"), dict):
            return str(body["error"].get("message", body["error"]))[:500]
        if isinstance(body, dict) and "detail" in body:
            return str(body["detail"])[:500]
    except json.JSONDecodeError:
        pass
    return answer.text[:500]
