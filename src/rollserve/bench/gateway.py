"""``rollserve bench gateway``: what the gateway adds to each model call of an agent, against
the agent calling the backend directly, side by side in one run.

Three processes: the backend (one precomputed tool-calling turn, from its chat endpoint for
the direct calls and its token endpoint behind the gateway, at the same cost), a gateway node
(routes, router, one job and key per agent) and this driver. At each concurrency, that many
agents each hold a conversation of ``turns`` calls (a tool call answered, then the next call),
first straight to the backend's ``chat/completions``, then through their keys (token mode: the
template rendered, prefix matched, the tool call parsed). A call's latency is from its request
to its parsed answer.

The backend answers each call after ``generation_ms``, as a real server takes a while to
generate, and the agents start at times spread over one such period, as real ones are not in
step: they then call at the rate real ones do, and the figures are the gateway's cost per
call at that load. With 0 every agent calls again the moment it is answered: the node
runs flat out and the figures measure its capacity (queueing) more than a call's cost."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from rich.table import Table

from rollserve.bench.stats import quantile
from rollserve.schema.bench import GatewayBenchResult, GatewayBenchRow

_SYSTEM = {"role": "system", "content": "You are a careful agent. Use the bash tool."}
_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a command.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]


def _start(args: list[str], port_file: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    with log.open("ab") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rollserve.bench.gateway_node", *args],
            stdout=subprocess.DEVNULL,
            stderr=sink,
        )
    deadline = time.monotonic() + 120
    while not port_file.exists() or not port_file.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"bench gateway: {args[0]} did not start:\n{log.read_text()}")
        time.sleep(0.05)
    time.sleep(0.05)  # the file is written whole before anyone reads it
    return proc, port_file.read_text()


class _Connection:
    """One agent's keep-alive HTTP/1.1 connection, as lean as a client can be: the driver's
    own cost per call stays far below what it measures."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host, self.port, self.path = parts.hostname or "", parts.port or 80, parts.path
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def post(self, body: dict[str, Any]) -> dict[str, Any]:
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        assert self._reader is not None
        data = json.dumps(body).encode()
        head = (
            f"POST {self.path} HTTP/1.1\r\nHost: {self.host}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
        )
        self._writer.write(head.encode() + data)
        status = await self._reader.readline()
        length = 0
        while (line := await self._reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
        answer = await self._reader.readexactly(length)
        if b" 200 " not in status:
            raise RuntimeError(f"bench gateway: {status.decode().strip()}: {answer[:300]!r}")
        found: dict[str, Any] = json.loads(answer)
        return found

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


async def _conversation(
    url: str, turns: int, index: int, latencies: list[float], start_s: float
) -> None:
    messages: list[dict[str, Any]] = [_SYSTEM, {"role": "user", "content": f"Task {index}."}]
    connection = _Connection(url)
    await asyncio.sleep(start_s)
    try:
        for turn in range(turns + 1):  # the first call opens the connection: not counted
            body = {"model": "bench", "messages": messages, "tools": _TOOLS}
            began = time.perf_counter()
            message = (await connection.post(body))["choices"][0]["message"]
            if turn:
                latencies.append((time.perf_counter() - began) * 1000)
            messages.append(message)
            calls = message.get("tool_calls") or [{"id": "none"}]
            messages.append({"role": "tool", "tool_call_id": calls[0]["id"], "content": "a\nb\n"})
    finally:
        connection.close()


async def _level(urls: list[str], turns: int, spread_s: float) -> list[float]:
    """The latencies of ``turns`` calls of each agent, the agents' starts spread evenly over
    ``spread_s`` (agents do not call in step: each began at its own time)."""
    latencies: list[float] = []
    starts = [spread_s * i / len(urls) for i in range(len(urls))]
    await asyncio.gather(
        *(_conversation(u, turns, i, latencies, starts[i]) for i, u in enumerate(urls))
    )
    return latencies


def bench_gateway(
    levels: tuple[int, ...] = (1, 100, 500),
    turns: int = 4,
    tokenizer: Path | None = None,
    generation_ms: float = 1000.0,
) -> GatewayBenchResult:
    from rollserve.llm.local.tiny_model import tiny_model_dir

    work = Path(tempfile.mkdtemp(prefix="rollserve-bench-gateway-"))
    model = tokenizer or tiny_model_dir(work / "model")
    agents = sum(levels)
    backend, backend_url = _start(
        ["backend", str(model), str(generation_ms), str(work / "backend")],
        work / "backend",
        work / "backend.log",
    )
    node = None
    try:
        node, found = _start(
            ["node", backend_url, str(model), str(agents), str(work / "node")],
            work / "node",
            work / "node.log",
        )
        gateway = json.loads(found)
        keys: list[str] = gateway["keys"]
        rows = []
        used = 0
        for level in levels:
            spread = generation_ms / 1000
            direct_urls = [f"{backend_url}/v1/chat/completions"] * level
            direct = asyncio.run(_level(direct_urls, turns, spread))
            mine = keys[used : used + level]
            used += level
            urls = [f"{gateway['url']}/v1/gateway/{k}/v1/chat/completions" for k in mine]
            through = asyncio.run(_level(urls, turns, spread))
            d50, d99 = quantile(direct, 0.5), quantile(direct, 0.99)
            g50, g99 = quantile(through, 0.5), quantile(through, 0.99)
            rows.append(
                GatewayBenchRow(
                    concurrency=level,
                    calls=len(through),
                    direct_p50_ms=round(d50, 3),
                    direct_p99_ms=round(d99, 3),
                    gateway_p50_ms=round(g50, 3),
                    gateway_p99_ms=round(g99, 3),
                    overhead_p50_ms=round(g50 - d50, 3),
                    overhead_p99_ms=round(g99 - d99, 3),
                )
            )
    finally:
        for proc in (node, backend):
            if proc is not None:
                proc.kill()
                proc.wait()
        shutil.rmtree(work, ignore_errors=True)
    return GatewayBenchResult(
        turns=turns, generation_ms=generation_ms, results=rows, goal_overhead_p50_ms=1.0
    )


def gateway_table(result: GatewayBenchResult) -> Table:
    title = f"gateway overhead per call ({result.turns} calls per agent, "
    table = Table(title=f"{title}backend {result.generation_ms:g} ms a call)")
    for name in ("agents", "direct p50", "gateway p50", "overhead p50", "overhead p99"):
        table.add_column(name, justify="right")
    for row in result.results:
        table.add_row(
            str(row.concurrency),
            f"{row.direct_p50_ms:.2f} ms",
            f"{row.gateway_p50_ms:.2f} ms",
            f"{row.overhead_p50_ms:.2f} ms",
            f"{row.overhead_p99_ms:.2f} ms",
        )
    return table
