"""The processes of ``rollserve bench gateway`` besides its driver: the backend (the scripted
model server, token and chat endpoints) and a gateway node (the gateway's routes, router and
per-job sessions, with one open key per emulated agent), each in its own process so that
neither shares the driver's cores' event loop.

  python -m rollserve.bench.gateway_node backend TOKENIZER GENERATION_MS PORT_FILE
  python -m rollserve.bench.gateway_node node BACKEND_URL TOKENIZER AGENTS PORT_FILE"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI

from rollserve.bench.router import MemoryBackendStore
from rollserve.gateway.job import GatewayJob
from rollserve.gateway.keys import Gateway
from rollserve.llm.kinds import default_kinds
from rollserve.llm.parsers import default_parsers, parser_for_template
from rollserve.llm.router import Router
from rollserve.llm.session import Models
from rollserve.llm.templates import TemplateCache
from rollserve.ports import free_port
from rollserve.schema.backends import BackendSpec
from rollserve.schema.jobs import AgentConfig
from rollserve.server.gateway import gateway_routes
from rollserve.settings import Settings

MODEL = "bench"


def backend(tokenizer: str, generation_ms: float, port_file: Path) -> None:
    """A backend whose every answer is the same tool-calling turn, precomputed, given after
    ``generation_ms`` (the time a real server generates, spent waiting, not computing): its
    token endpoint (vLLM's ``/completions``) and its chat endpoint cost it the same, so that
    the difference between the two paths is the gateway's."""
    from transformers import AutoTokenizer

    from rollserve.llm.toolcalls import HermesParser, ToolCall

    loaded = AutoTokenizer.from_pretrained(tokenizer)
    call = ToolCall("bash", {"command": "ls"}, "call_0")
    text = "Next.\n" + HermesParser().format([call])
    ids = [*loaded.encode(text, add_special_tokens=False), int(loaded.eos_token_id)]
    completions = json.dumps(
        {
            "id": "cmpl-bench",
            "object": "text_completion",
            "model": MODEL,
            "choices": [
                {
                    "index": 0,
                    "text": text,
                    "finish_reason": "stop",
                    "token_ids": ids,
                    "logprobs": {"token_logprobs": [-0.25] * len(ids)},
                }
            ],
            "usage": {"prompt_tokens": 0, "completion_tokens": len(ids), "total_tokens": len(ids)},
        }
    ).encode()
    message = {"role": "assistant", "content": "Next.", "tool_calls": [call.to_openai()]}
    chat = json.dumps(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "model": MODEL,
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
            "usage": {"prompt_tokens": 0, "completion_tokens": len(ids), "total_tokens": len(ids)},
        }
    ).encode()
    models = json.dumps(
        {"object": "list", "data": [{"id": MODEL, "object": "model", "max_model_len": 1_000_000}]}
    ).encode()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        chunks = []
        while True:
            event = await receive()
            chunks.append(event.get("body", b""))
            if not event.get("more_body"):
                break
        path = scope["path"]
        if path.endswith("/completions") and scope["method"] == "POST":
            json.loads(b"".join(chunks))  # read as a server reads it, on both paths
            if generation_ms:
                await asyncio.sleep(generation_ms / 1000)
            answer = chat if path.endswith("/chat/completions") else completions
        else:
            answer = models
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(answer)).encode()),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": answer})

    port = free_port()
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", access_log=False, lifespan="off"
    )
    server = uvicorn.Server(config)

    async def serve() -> None:
        task = asyncio.create_task(server.serve())
        await _listening(server, task)
        await asyncio.to_thread(port_file.write_text, f"http://127.0.0.1:{port}")
        await task

    asyncio.run(serve())


async def node(backend_url: str, tokenizer: str, agents: int, port_file: Path) -> None:
    """A gateway with ``agents`` open keys (written to ``port_file`` with the port)."""
    settings = Settings(data_dir=Path(tempfile.mkdtemp()), llm_health_interval_s=3600.0)
    templates = TemplateCache()
    router = Router(settings, MemoryBackendStore(), default_kinds(templates))
    await router.start()
    spec = BackendSpec(
        id="b",
        kind="vllm",
        url=f"{backend_url}/v1",
        model=MODEL,
        tokenizer=tokenizer,
        max_concurrency=None,
    )
    await router.register(spec)
    models = Models(router, templates, settings.llm_abort_resumes)
    gateway = Gateway()
    parsers = default_parsers()
    keys = []
    config = AgentConfig(max_turns=10_000)
    for index in range(agents):
        session = models.session(f"agent-{index}", MODEL)
        await session.open()
        assert session.template is not None
        parser = parsers.get(parser_for_template(session.template.source))
        job = GatewayJob(f"agent-{index}", MODEL, session, parser, config, None)
        keys.append(gateway.open(job))
    app = FastAPI()
    app.include_router(gateway_routes)
    app.state.gateway = gateway
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)
    )
    serving = asyncio.create_task(server.serve())
    await _listening(server, serving)
    listing = json.dumps({"url": f"http://127.0.0.1:{port}", "keys": keys})
    await asyncio.to_thread(port_file.write_text, listing)
    await serving


async def _listening(server: uvicorn.Server, serving: asyncio.Task[None]) -> None:
    """Return once ``server`` listens; raise what stopped it if it never does."""
    while not server.started:
        if serving.done():
            serving.result()
            raise RuntimeError("the server stopped before it listened")
        await asyncio.sleep(0.01)


if __name__ == "__main__":
    role, *rest = sys.argv[1:]
    if role == "backend":
        backend(rest[0], float(rest[1]), Path(rest[2]))
    else:
        asyncio.run(node(rest[0], rest[1], int(rest[2]), Path(rest[3])))
