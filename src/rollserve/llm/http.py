"""What every HTTP inference backend shares: the OpenAI-style ``/models`` and
``/chat/completions`` endpoints, and the mapping of network failures to rollserve errors."""

from __future__ import annotations

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
from rollserve.llm.templates import TemplateCache
from rollserve.schema.backends import BackendView
from rollserve.schema.tokens import LogprobMode
from rollserve.settings import Settings


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
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(settings.llm_request_timeout_s, connect=10.0)
        )

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
        """One HTTP call: network failures and 5xx → BackendUnavailableError (fail over);
        other refusals → BackendRequestError with what the server said."""
        try:
            answer = await self._http.request(method, url, json=body)
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
            raise BackendUnavailableError(
                f"backend {self.view.id} ({url}) answered something that is not JSON",
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
        }
        if tools:
            body["tools"] = tools
        answer = await self.request("POST", f"{self.view.url}/chat/completions", body)
        try:
            choice = answer["choices"][0]
            message = choice["message"]
            calls = [
                {
                    "id": call.get("id") or f"call_{i}",
                    "name": call["function"]["name"],
                    "arguments": call["function"].get("arguments") or "{}",
                }
                for i, call in enumerate(message.get("tool_calls") or [])
            ]
            return ChatCompletion(
                content=message.get("content") or "",
                tool_calls=calls,
                finish_reason=choice.get("finish_reason") or "stop",
                usage=answer.get("usage") or {},
            )
        except (KeyError, IndexError, TypeError) as exc:
            raise BackendRequestError(
                f"backend {self.view.id}: unexpected chat completion {str(answer)[:300]}",
                backend_id=self.view.id,
            ) from exc


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
