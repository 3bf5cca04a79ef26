"""A scripted LLM server for deterministic agent tests: replays given assistant turns over real
HTTP as OpenAI chat completions, vLLM token completions and SGLang's native ``/generate``."""

from __future__ import annotations

import asyncio
import itertools
import json
import secrets
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, Self, cast

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rollserve.errors import InvalidInputError
from rollserve.llm.toolcalls import HermesParser, ToolCall
from rollserve.testing.threaded import ThreadedServer


class ScriptedCall(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)


class ScriptedTurn(BaseModel):
    """One assistant turn to replay: prose and the tool calls it makes."""

    model_config = ConfigDict(extra="forbid")
    content: str = ""
    tool_calls: list[ScriptedCall] = Field(default_factory=list)


class TokenizerLike(Protocol):
    """What the token endpoints need of a Hugging Face tokenizer."""

    @property
    def eos_token_id(self) -> Any: ...

    def encode(self, text: str, *, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, token_ids: list[int], *, skip_special_tokens: bool = ...) -> Any: ...


class _Refusal(Exception):
    """A request answered with an error status instead of a turn."""

    def __init__(self, status: int, message: str, kind: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status, self.kind = status, kind

    def response(self) -> JSONResponse:
        error = {"message": str(self), "type": self.kind, "param": None, "code": self.status}
        return JSONResponse({"error": error}, status_code=self.status)


@dataclass(frozen=True)
class RawAnswer:
    """A fault a rewrite can return: this body sent as it is, not as JSON (a proxy's HTML
    error page with status 200, a cut-off body)."""

    body: str
    status: int = 200
    media_type: str = "text/html"


@dataclass(frozen=True)
class Stall:
    """A fault a rewrite can return: the answer is held back ``seconds`` while the server
    keeps serving other requests (a server that hangs past its client's timeout)."""

    seconds: float


@dataclass(frozen=True)
class Hold:
    """A fault a rewrite can return: the answer is held back until ``release`` is set (at most
    ``timeout_s``, or until the server stops) while the server keeps serving other requests (a
    generation that ends when the test says so, however slow or fast the machine is)."""

    release: threading.Event
    timeout_s: float = 300.0


@dataclass(frozen=True)
class Trickle:
    """A fault a rewrite can return: the answer is sent at once with its headers, then its
    body a byte every ``interval_s`` (a server too slow for any single read to time out)."""

    interval_s: float


@dataclass(frozen=True)
class Drop:
    """A fault a rewrite can return: the connection is reset with no answer at all (a server
    process that dies while generating)."""


Fault = RawAnswer | Stall | Hold | Trickle | Drop
Handler = Callable[[dict[str, Any], list[int], ScriptedTurn, int], dict[str, Any]]
Rewrite = Callable[[str, dict[str, Any], dict[str, Any]], "dict[str, Any] | int | Fault"]
"""``(path, request body, answer) → answer``, an HTTP status to refuse with, or a Fault:
makes the server behave like a given server version (quirks, aborts, errors) or a broken one."""


class ScriptedLLMServer:
    """Replays ``turns`` (``{"content": str, "tool_calls": [{"name", "arguments"}]}``) in order,
    one per generation request, on 127.0.0.1 and a free port; records every request body.

    ``tokenizer`` (a local Hugging Face tokenizer directory, or a loaded tokenizer) enables the
    token endpoints; ``delay_s`` is how long each generation request takes; with
    ``native_tool_calls`` chat completions return OpenAI ``tool_calls``, otherwise the calls are
    written into ``content`` in the hermes format. ``/v1/models`` and ``/health`` are never
    delayed or failed; ``max_model_len`` is listed in ``/v1/models`` when given;
    ``server_info`` is what ``/server_info`` answers (404 when None); ``rewrite`` changes each
    generation answer, or answers with a fault (:class:`RawAnswer`, :class:`Stall`,
    :class:`Hold`, :class:`Trickle`, :class:`Drop`).

    Every route lives under a path prefix of its own (in ``base_url`` and ``url``): a client
    still aimed at an earlier server whose port this one now has gets 404s, never its turns."""

    def __init__(
        self,
        turns: Iterable[Mapping[str, Any]] = (),
        *,
        model: str = "scripted",
        tokenizer: str | Path | TokenizerLike | None = None,
        delay_s: float = 0.0,
        native_tool_calls: bool = False,
        logprob: float = -0.25,
        max_model_len: int | None = None,
        server_info: dict[str, Any] | None = None,
        rewrite: Rewrite | None = None,
    ) -> None:
        self.model, self.delay_s, self.native_tool_calls = model, delay_s, native_tool_calls
        self.logprob = logprob
        self.max_model_len, self.server_info, self.rewrite = max_model_len, server_info, rewrite
        if isinstance(tokenizer, str | Path):
            from transformers import AutoTokenizer

            tokenizer = cast(TokenizerLike, AutoTokenizer.from_pretrained(str(tokenizer)))
        self.tokenizer = tokenizer
        self._lock = threading.Lock()
        self._turns: deque[ScriptedTurn] = deque()
        self._served = 0
        self._failures = 0
        self._requests: list[tuple[str, dict[str, Any]]] = []
        self._ids = itertools.count()
        self._held: set[threading.Event] = set()  # answers held back: released on stop
        self.add_turns(turns)
        self._runner = ThreadedServer("scripted-llm")
        self.port = 0
        self.prefix = f"/scripted-{secrets.token_hex(4)}"

    def add_turns(self, turns: Iterable[Mapping[str, Any]]) -> None:
        """Append turns to the script."""
        parsed = []
        for index, turn in enumerate(turns):
            try:
                parsed.append(ScriptedTurn.model_validate(turn))
            except ValidationError as exc:
                raise InvalidInputError(f"scripted turn {index}: {exc}", field="turns") from None
        with self._lock:
            self._turns.extend(parsed)

    def fail_next(self, n: int = 1) -> None:
        """Answer the next ``n`` generation requests with HTTP 503 (no turn is used)."""
        with self._lock:
            self._failures += n

    @property
    def served(self) -> int:
        """How many generation requests were answered with a turn of the script."""
        with self._lock:
            return self._served

    @property
    def requests(self) -> list[tuple[str, dict[str, Any]]]:
        """Every request received so far, as ``(path, body)``, oldest first."""
        with self._lock:
            return list(self._requests)

    @property
    def turns_left(self) -> int:
        with self._lock:
            return len(self._turns)

    @property
    def base_url(self) -> str:
        """The server root (SGLang's ``/generate`` lives here)."""
        return f"http://127.0.0.1:{self.port}{self.prefix}"

    @property
    def url(self) -> str:
        """The OpenAI-compatible base URL, ending in ``/v1``."""
        return f"{self.base_url}/v1"

    def turn_text(self, turn: ScriptedTurn) -> str:
        """A turn as the model would write it: prose, then hermes-format tool calls."""
        calls = [ToolCall(c.name, c.arguments, "") for c in turn.tool_calls]
        return "\n".join(part for part in (turn.content, HermesParser().format(calls)) if part)

    def start(self) -> Self:
        """Serve in a background thread; returns once the port accepts connections."""
        self.port = self._runner.start(self._app())
        return self

    def stop(self) -> None:
        """Shut down gracefully: requests in flight are answered first (held ones at once)."""
        with self._lock:
            for release in self._held:
                release.set()
        self._runner.stop()

    def kill(self) -> None:
        """Stop at once, like a crashed backend: open connections are reset unanswered."""
        self._runner.kill()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _app(self) -> FastAPI:
        app = FastAPI(title="rollserve scripted LLM server")
        routes = APIRouter(prefix=self.prefix)

        @routes.get("/v1/models")
        async def models() -> dict[str, Any]:
            card = {"id": self.model, "object": "model", "owned_by": "scripted", "created": 0}
            if self.max_model_len is not None:
                card["max_model_len"] = self.max_model_len
            return {"object": "list", "data": [card]}

        @routes.get("/server_info")
        async def server_info() -> Any:
            if self.server_info is None:
                return _Refusal(404, "Not Found", "NotFoundError").response()
            return self.server_info

        @routes.get("/health")
        async def health() -> dict[str, Any]:
            return {}

        handlers: dict[str, Handler] = {
            "/v1/chat/completions": self._chat,
            "/v1/completions": self._completions,
            "/generate": self._generate,
        }
        for path, handler in handlers.items():
            routes.add_api_route(path, self._endpoint(path, handler), methods=["POST"])
        app.include_router(routes)
        return app

    def _endpoint(self, path: str, handler: Handler) -> Callable[[Request], Awaitable[Any]]:
        async def endpoint(request: Request) -> Any:
            try:
                body = await request.json()
            except json.JSONDecodeError as exc:
                return _Refusal(400, f"the body is not valid JSON: {exc}").response()
            if not isinstance(body, dict):
                return _Refusal(400, "the body must be a JSON object").response()
            with self._lock:
                self._requests.append((path, body))
            if self.delay_s > 0:
                await asyncio.sleep(self.delay_s)
            try:
                prompt_ids = self._check(path, body)
                with self._lock:
                    if self._failures > 0:
                        self._failures -= 1
                        raise _Refusal(503, "injected failure", "ServiceUnavailableError")
                    if not self._turns:
                        message = f"the script has no turn left ({self._served} served)"
                        raise _Refusal(500, message, "APIError")
                    turn, index = self._turns.popleft(), self._served
                    self._served += 1
            except _Refusal as refusal:
                return refusal.response()
            answer = handler(body, prompt_ids, turn, index)
            if self.rewrite is None:
                return answer
            changed = self.rewrite(path, body, answer)
            if isinstance(changed, Stall):
                await asyncio.sleep(changed.seconds)
                return answer
            if isinstance(changed, Hold):
                with self._lock:
                    self._held.add(changed.release)
                await asyncio.to_thread(changed.release.wait, changed.timeout_s)
                return answer
            if isinstance(changed, Trickle):
                return StreamingResponse(
                    _drip(json.dumps(answer).encode(), changed.interval_s),
                    media_type="application/json",
                )
            if isinstance(changed, Drop):
                self._runner.drop(request.client)
                await asyncio.sleep(0.01)  # the reset lands before anything could be sent
                return None
            if isinstance(changed, RawAnswer):
                return Response(changed.body, changed.status, media_type=changed.media_type)
            if isinstance(changed, int):
                return _Refusal(changed, "refused by the script", "APIError").response()
            return changed

        return endpoint

    def _check(self, path: str, body: dict[str, Any]) -> list[int]:
        """Refuse what a real server would refuse, before a turn is used; the prompt's ids."""
        if body.get("stream"):
            raise _Refusal(400, "the scripted server does not stream")
        model = body.get("model")
        if path != "/generate" and model and model != self.model:
            raise _Refusal(404, f"The model `{model}` does not exist.", "NotFoundError")
        if path == "/v1/chat/completions":
            return []
        if self.tokenizer is None:
            raise _Refusal(400, f"{path} needs the scripted server to have a tokenizer")
        native = path == "/generate"
        ids, text = (
            (body.get("input_ids"), body.get("text")) if native else (body.get("prompt"),) * 2
        )
        if isinstance(ids, list) and ids and all(type(i) is int for i in ids):
            return ids
        if isinstance(text, str) and text:
            return self.tokenizer.encode(text, add_special_tokens=False)
        raise _Refusal(400, "the prompt must be a non-empty list of token ids, or a string")

    def _tokens(self, turn: ScriptedTurn, limit: Any) -> tuple[list[int], str, bool]:
        """The turn's token ids ending in eos, cut to ``limit``; their text; whether cut."""
        assert self.tokenizer is not None
        ids = self.tokenizer.encode(self.turn_text(turn), add_special_tokens=False)
        ids.append(int(self.tokenizer.eos_token_id))
        cut = isinstance(limit, int) and 0 < limit < len(ids)
        ids = ids[:limit] if cut else ids
        return ids, str(self.tokenizer.decode(ids, skip_special_tokens=True)), cut

    def _count(self, text: str) -> int:
        if self.tokenizer is not None:
            return len(self.tokenizer.encode(text, add_special_tokens=False))
        return len(text.split())

    def _envelope(
        self, prefix: str, kind: str, choice: dict[str, Any], usage: dict[str, int]
    ) -> dict[str, Any]:
        return {
            "id": f"{prefix}-scripted-{next(self._ids)}",
            "object": kind,
            "created": int(time.time()),
            "model": self.model,
            "choices": [choice],
            "usage": usage,
        }

    def _chat(
        self, body: dict[str, Any], prompt_ids: list[int], turn: ScriptedTurn, index: int
    ) -> dict[str, Any]:
        text = self.turn_text(turn)
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if self.native_tool_calls and turn.tool_calls:
            message["content"] = turn.content or None
            message["tool_calls"] = [
                ToolCall(c.name, c.arguments, f"call_{index}_{i}").to_openai()
                for i, c in enumerate(turn.tool_calls)
            ]
        finish = "tool_calls" if "tool_calls" in message else "stop"
        prompt = " ".join(str(m.get("content") or "") for m in body.get("messages", []))
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
        usage = _usage(self._count(prompt), self._count(text))
        return self._envelope("chatcmpl", "chat.completion", choice, usage)

    def _completions(
        self, body: dict[str, Any], prompt_ids: list[int], turn: ScriptedTurn, index: int
    ) -> dict[str, Any]:
        assert self.tokenizer is not None
        ids, text, cut = self._tokens(turn, body.get("max_tokens"))
        with_ids = bool(body.get("return_token_ids"))
        choice: dict[str, Any] = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": "length" if cut else "stop",
            "stop_reason": None,
            "token_ids": ids if with_ids else None,
            "prompt_token_ids": prompt_ids if with_ids else None,
            "prompt_logprobs": None,
        }
        if body.get("logprobs") is not None:
            as_ids = body.get("return_tokens_as_token_ids")
            tokens = [f"token_id:{i}" if as_ids else str(self.tokenizer.decode([i])) for i in ids]
            choice["logprobs"] = {
                "text_offset": list(itertools.accumulate(map(len, tokens[:-1]), initial=0)),
                "token_logprobs": [self.logprob] * len(ids),
                "tokens": tokens,
                "top_logprobs": [{token: self.logprob} for token in tokens],
            }
        usage = _usage(len(prompt_ids), len(ids))
        return self._envelope("cmpl", "text_completion", choice, usage)

    def _generate(
        self, body: dict[str, Any], prompt_ids: list[int], turn: ScriptedTurn, index: int
    ) -> dict[str, Any]:
        limit = (body.get("sampling_params") or {}).get("max_new_tokens")
        ids, text, cut = self._tokens(turn, limit)
        meta: dict[str, Any] = {
            "id": f"scripted-{next(self._ids)}",
            "finish_reason": {"type": "length", "length": limit}
            if cut
            else {"type": "stop", "matched": ids[-1]},
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": len(ids),
            "cached_tokens": 0,
            "e2e_latency": self.delay_s,
        }
        if body.get("return_logprob"):
            meta["output_token_logprobs"] = [[self.logprob, i, None] for i in ids]
        return {"text": text, "output_ids": ids, "meta_info": meta}


async def _drip(data: bytes, interval_s: float) -> AsyncIterator[bytes]:
    for byte in data:
        yield bytes([byte])
        await asyncio.sleep(interval_s)


def _usage(prompt: int, completion: int) -> dict[str, int]:
    total = prompt + completion
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": total}
