"""rollserve's local CPU inference server: a LocalEngine behind the HTTP APIs of vLLM
(``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``) and of SGLang (``/generate``)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any, cast

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from jinja2 import TemplateError
from pydantic import BaseModel, ConfigDict, Field

from rollserve.errors import InvalidInputError, NotFoundError, RollserveError
from rollserve.llm.base import LOGPROB_FLOOR
from rollserve.llm.local.control import Control, add_control_routes
from rollserve.llm.local.engine import Generation, LocalEngine

MAX_LOGPROBS = 20  # vLLM's default --max-logprobs


class _Body(BaseModel):
    # Like vLLM and SGLang, fields this server does not know are ignored.
    model_config = ConfigDict(extra="ignore")


class _Sampling(_Body):
    """The sampling fields both APIs share; penalties are accepted at their neutral values."""

    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(-1, ge=-1)
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    repetition_penalty: float = Field(1.0, gt=0)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    stop_token_ids: list[int] = Field(default_factory=list)
    stop: str | list[str] | None = None

    def engine_args(self) -> dict[str, Any]:
        """The engine's sampling arguments (besides the seed)."""
        penalties = {
            "repetition_penalty": self.repetition_penalty != 1.0,
            "presence_penalty": self.presence_penalty != 0.0,
            "frequency_penalty": self.frequency_penalty != 0.0,
        }
        _unsupported(stop=bool(self.stop), **penalties)
        fields = ("temperature", "top_p", "top_k", "min_p", "stop_token_ids")
        return {f: getattr(self, f) for f in fields}


class _OpenAIBody(_Sampling):
    model: str | None = None
    seed: int | None = None
    return_token_ids: bool = False
    return_weight_versions: bool = False
    n: int = 1
    stream: bool = False

    def sampling(self) -> dict[str, Any]:
        """The engine's sampling arguments."""
        return {**self.engine_args(), "seed": self.seed}


class CompletionRequest(_OpenAIBody):
    """vLLM's ``/v1/completions`` body, the fields this server honours."""

    prompt: str | list[int]
    max_tokens: int = Field(16, ge=1)
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False


class ChatRequest(_OpenAIBody):
    """vLLM's ``/v1/chat/completions`` body, the fields this server honours."""

    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)


class SGLangSampling(_Sampling):
    """SGLang's ``sampling_params``."""

    max_new_tokens: int = Field(128, ge=0)
    sampling_seed: int | None = None


class GenerateRequest(_Body):
    """SGLang's native ``/generate`` body (one request, not a batch)."""

    text: str | None = None
    input_ids: list[int] | None = None
    sampling_params: SGLangSampling = Field(default_factory=SGLangSampling)
    return_logprob: bool = False
    top_logprobs_num: int = Field(0, ge=0, le=MAX_LOGPROBS)
    return_text_in_logprobs: bool = False
    stream: bool = False


def create_llm_app(engine: LocalEngine, model_name: str | None = None) -> FastAPI:
    """The HTTP app over ``engine``; requests are served one at a time, off the event loop.
    ``/v1/completions`` returns raw logprobs (vLLM's default), ``/generate`` logprobs after
    temperature (SGLang's)."""
    name = model_name or engine.model_name
    tokenizer = engine.tokenizer
    limit = engine.max_model_len
    lock = asyncio.Lock()
    control = Control()
    app = FastAPI(title="rollserve local LLM server")
    add_control_routes(app, engine, control, lock)

    async def generate(prompt: list[int], max_tokens: int, **kwargs: Any) -> Generation:
        ticket = control.admit()
        control.running += 1
        try:
            async with lock:
                return await asyncio.to_thread(
                    engine.generate,
                    prompt,
                    max_tokens=max_tokens,
                    aborted=control.gate(ticket),
                    **kwargs,
                )
        finally:
            await control.finished()

    async def openai_generate(
        body: _OpenAIBody, prompt: list[int], max_tokens: int, top_logprobs: int = 0
    ) -> Generation:
        if body.model is not None and body.model != name:
            raise NotFoundError(f"The model `{body.model}` does not exist.", field="model")
        _unsupported(n=body.n != 1, stream=body.stream)
        if len(prompt) + max_tokens > limit:
            raise InvalidInputError(
                f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This"
                f" model's maximum context length is {limit} tokens and your request has"
                f" {len(prompt)} input tokens ({max_tokens} > {limit} - {len(prompt)}).",
                field="max_tokens",
            )
        return await generate(prompt, max_tokens, top_logprobs=top_logprobs, **body.sampling())

    def text_of(out: Generation) -> str:
        # Like vLLM and SGLang: the ending id stays in the ids but not in the text.
        ids = out.token_ids[:-1] if out.finish_reason == "stop" else out.token_ids
        return str(tokenizer.decode(ids, skip_special_tokens=True))

    def answer(
        body: _OpenAIBody, kind: str, choice: dict[str, Any], prompt: list[int], out: Generation
    ) -> dict[str, Any]:
        prefix = "cmpl" if kind == "text_completion" else "chatcmpl"
        n_out = len(out.token_ids)
        choice |= {"finish_reason": out.finish_reason, "stop_reason": _stop_reason(engine, out)}
        if body.return_weight_versions:
            choice["weight_versions"] = [
                {"version": control.weight_version, "start": 0, "end": len(out.token_ids)}
            ]
        return {
            "id": f"{prefix}-{uuid.uuid4().hex}",
            "object": kind,
            "created": int(time.time()),
            "model": name,
            "choices": [choice],
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": n_out,
                "total_tokens": len(prompt) + n_out,
            },
        }

    @app.exception_handler(RollserveError)
    async def rollserve_error(_: Request, exc: RollserveError) -> JSONResponse:
        status = 400 if isinstance(exc, InvalidInputError) else exc.http_status
        return _error(status, exc.message, exc.details.get("field"))

    @app.exception_handler(RequestValidationError)
    async def invalid_body(_: Request, exc: RequestValidationError) -> JSONResponse:
        problems = list(exc.errors())
        fields = [".".join(str(p) for p in e["loc"][1:]) or "body" for e in problems]
        message = "; ".join(f"{f}: {e['msg']}" for f, e in zip(fields, problems, strict=True))
        return _error(400, message, fields[0].split(".")[0] if fields else None)

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {"id": name, "object": "model", "created": int(time.time()), "owned_by": "rollserve"}
        card |= {"root": name, "parent": None, "max_model_len": limit}
        return {"object": "list", "data": [card]}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest) -> dict[str, Any]:
        _unsupported(echo=body.echo)
        prompt = body.prompt if isinstance(body.prompt, list) else tokenizer.encode(body.prompt)
        out = await openai_generate(body, prompt, body.max_tokens, body.logprobs or 0)
        logprobs = None if body.logprobs is None else _completion_logprobs(engine, out)
        choice: dict[str, Any] = {"index": 0, "text": text_of(out), "logprobs": logprobs}
        if body.return_token_ids:
            choice |= {"prompt_token_ids": list(prompt), "token_ids": out.token_ids}
        return answer(body, "text_completion", choice, prompt, out)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatRequest) -> dict[str, Any]:
        tools = cast("list[dict[Any, Any] | Callable[..., Any]] | None", body.tools)
        try:
            rendered = tokenizer.apply_chat_template(
                body.messages, tools=tools, tokenize=False, add_generation_prompt=True
            )
        except (TemplateError, TypeError, ValueError) as exc:  # the messages don't fit it
            raise InvalidInputError(f"cannot render the messages: {exc}", field="messages") from exc
        prompt = tokenizer.encode(str(rendered), add_special_tokens=False)
        max_tokens = body.max_completion_tokens or body.max_tokens or max(1, limit - len(prompt))
        out = await openai_generate(body, prompt, max_tokens)
        message = {"role": "assistant", "content": text_of(out)}
        choice: dict[str, Any] = {"index": 0, "message": message, "logprobs": None}
        result = answer(body, "chat.completion", choice, prompt, out)
        if body.return_token_ids:
            choice["token_ids"] = out.token_ids
            result["prompt_token_ids"] = prompt
        return result

    @app.post("/generate")
    async def sglang_generate(body: GenerateRequest) -> dict[str, Any]:
        params = body.sampling_params
        _unsupported(stream=body.stream)
        if body.input_ids is not None and body.text is None:
            prompt = body.input_ids
        elif body.text is not None and body.input_ids is None:
            prompt = tokenizer.encode(body.text)
        else:
            raise InvalidInputError("give exactly one of input_ids and text", field="input_ids")
        if len(prompt) + params.max_new_tokens >= limit:
            raise InvalidInputError(
                "Requested token count exceeds the model's maximum context length of"
                f" {limit} tokens. You requested a total of {len(prompt) + params.max_new_tokens}"
                f" tokens: {len(prompt)} tokens from the input messages and"
                f" {params.max_new_tokens} tokens for the completion. Please reduce the number"
                " of tokens in the input messages or the completion to fit within the limit.",
                field="sampling_params.max_new_tokens",
            )
        out = await generate(
            prompt,
            params.max_new_tokens,
            seed=params.sampling_seed,
            top_logprobs=body.top_logprobs_num,
            processed_logprobs=True,
            **params.engine_args(),
        )
        meta: dict[str, Any] = {
            "id": uuid.uuid4().hex,
            "finish_reason": _sglang_finish(out, params.max_new_tokens),
            "prompt_tokens": len(prompt),
            "completion_tokens": len(out.token_ids),
            "cached_tokens": 0,
            "weight_version": control.weight_version,
        }
        if body.return_logprob:
            piece = (lambda i: _piece(engine, i)) if body.return_text_in_logprobs else None
            meta["output_token_logprobs"] = [
                [_floor(lp), tok, piece(tok) if piece else None]
                for lp, tok in zip(out.logprobs, out.token_ids, strict=True)
            ]
            if body.top_logprobs_num:
                meta["output_top_logprobs"] = [
                    [[_floor(lp), tok, piece(tok) if piece else None] for tok, lp in step]
                    for step in out.top_logprobs
                ]
        return {"text": text_of(out), "output_ids": out.token_ids, "meta_info": meta}

    return app


def _sglang_finish(out: Generation, max_new_tokens: int) -> dict[str, Any]:
    if out.finish_reason == "stop":
        return {"type": "stop", "matched": out.stop_token_id}
    if out.finish_reason == "abort":
        return {"type": "abort", "message": "Abort by the server"}
    return {"type": "length", "length": max_new_tokens}


def _error(status: int, message: str, param: Any) -> JSONResponse:
    kind = {400: "BadRequestError", 404: "NotFoundError", 503: "ServiceUnavailableError"}.get(
        status, "InternalServerError"
    )
    body = {"message": message, "type": kind, "param": param, "code": status}
    return JSONResponse({"error": body}, status_code=status)


def _unsupported(**flags: bool) -> None:
    for field, used in flags.items():
        if used:
            raise InvalidInputError(f"{field}: not supported by this server", field=field)


def _floor(logprob: float) -> float:
    return max(logprob, LOGPROB_FLOOR)


def _piece(engine: LocalEngine, token: int) -> str:
    return str(engine.tokenizer.decode([token]))


def _stop_reason(engine: LocalEngine, out: Generation) -> int | None:
    # vLLM: None when an end-of-sequence id ended it, the id when a stop_token_ids id did.
    if out.stop_token_id is None or out.stop_token_id in engine.eos_token_ids:
        return None
    return out.stop_token_id


def _completion_logprobs(engine: LocalEngine, out: Generation) -> dict[str, Any]:
    """vLLM's completion logprobs: the sampled token first in each top dict, then the top k."""
    tokens = [_piece(engine, t) for t in out.token_ids]
    offsets, at = [], 0
    for piece in tokens:
        offsets.append(at)
        at += len(piece)
    tops: list[dict[str, float] | None] = []
    for i, logprob in enumerate(out.logprobs):
        top = {tokens[i]: _floor(logprob)}
        for tok, lp in out.top_logprobs[i] if out.top_logprobs else []:
            top.setdefault(_piece(engine, tok), _floor(lp))
        tops.append(top)
    return {
        "tokens": tokens,
        "token_logprobs": [_floor(lp) for lp in out.logprobs],
        "top_logprobs": tops,
        "text_offset": offsets,
    }
