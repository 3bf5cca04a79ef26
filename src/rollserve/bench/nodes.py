"""``rollserve bench nodes``: one light workload through 1, 2 and 4 node processes sharing a
PostgreSQL store on this machine, and through one node on SQLite.

Each configuration starts its nodes (``rollserve serve`` processes with the test plug-in) and
a fresh database, registers one emulated model with the first node (the others take it from
the store), submits the rollouts through every node in turn and reads the results feed. A
rollout is ``bench scale``'s: an ``echo`` task in a bwrap sandbox, the tool agent, ``turns``
model calls of ``model_ms`` each (every one but the last runs a command in the sandbox's
shell), an evaluation in a fresh sandbox. The model is emulated over HTTP in this process and
notes when each call arrives and is answered: the time between turns is, per rollout, from
one answer to the next call (rollserve's own cost of a turn: parsing, the command, the next
prompt, waiting for a worker).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from rich.table import Table

from rollserve.bench.serve import start_node, stop_node
from rollserve.bench.stats import quantile
from rollserve.client import RolloutClient, wait_ready
from rollserve.ports import free_port
from rollserve.schema.bench import NodesBenchResult, NodesStep
from rollserve.schema.jobs import JobRequest
from rollserve.testing.threaded import ThreadedServer

CONFIGS = (("sqlite", 1), ("postgresql", 1), ("postgresql", 2), ("postgresql", 4))


class EmulatedModel:
    """An OpenAI-compatible chat server whose every call takes ``model_ms``: a bash call per
    turn, then submit. It keeps each rollout's call times, keyed by the task's prompt."""

    def __init__(self, turns: int, model_ms: float) -> None:
        self.turns, self.delay = turns, model_ms / 1000
        self.lock = threading.Lock()
        self.calls: dict[str, list[tuple[float, float]]] = defaultdict(list)
        self._server = ThreadedServer("bench-model")
        app = FastAPI()
        app.get("/v1/models")(self._models)
        app.post("/v1/chat/completions")(self._chat)
        self.url = f"http://127.0.0.1:{self._server.start(app)}/v1"

    async def _models(self) -> dict[str, Any]:
        return {"object": "list", "data": [{"id": "bench", "object": "model"}]}

    async def _chat(self, request: Request) -> dict[str, Any]:
        arrived = time.monotonic()
        body = await request.json()
        messages = body["messages"]
        key = next(m["content"] for m in messages if m["role"] == "user")
        done = sum(1 for m in messages if m["role"] == "assistant")
        await asyncio.sleep(self.delay)
        if done + 1 >= self.turns:
            name, arguments = "submit", {}
        else:
            name, arguments = "bash", {"command": f"printf %s {json.dumps(key)} > answer.txt"}
        with self.lock:
            self.calls[key].append((arrived, time.monotonic()))
        call = {
            "id": f"call_{uuid.uuid4().hex[:8]}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)},
        }
        message = {"role": "assistant", "content": "", "tool_calls": [call]}
        return {
            "id": "bench",
            "object": "chat.completion",
            "model": "bench",
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }

    def close(self) -> None:
        self._server.kill()


def _start_nodes(
    count: int, store_url: str, base: Path, run_workers: int, stack: ExitStack
) -> list[str]:
    """``count`` node processes on ``store_url`` (stopped when ``stack`` closes); their URLs
    once every one is ready."""
    urls = []
    for index in range(count):
        port = free_port()
        data = base / f"node-{index}"
        data.mkdir(parents=True)
        flags = [f"--store-url={store_url}", f"--node-id=bench-{index}"]
        flags += [f"--run-workers={run_workers}", "--init-workers=16", "--eval-workers=16"]
        node = start_node(port, data, base / f"node-{index}.log", *flags)
        stack.callback(stop_node, node)
        urls.append(f"http://127.0.0.1:{port}")
    deadline = time.monotonic() + 120
    for url in urls:
        if not wait_ready(url, deadline - time.monotonic()):
            raise RuntimeError(f"node {url} did not become ready (logs in {base})")
    return urls


def _step(
    store: str, count: int, store_url: str, base: Path, model: EmulatedModel, rollouts: int
) -> NodesStep:
    with ExitStack() as nodes:
        urls = _start_nodes(count, store_url, base, max(8, rollouts // count), nodes)
        with RolloutClient(urls, timeout=60) as client:
            client.register_backend(
                {"id": "bench", "kind": "openai", "url": model.url, "model": "bench"}
            )
            time.sleep(1.5)  # the other nodes take the registration from the store
            tag = uuid.uuid4().hex[:6]
            cursor = client.status().results_cursor
            jobs: list[JobRequest | dict[str, Any]] = [
                {
                    "job_id": f"{tag}-{i}",
                    "task": {"task_id": f"t{i}", "kind": "echo", "prompt": f"{tag}-{i}"},
                    "model": "bench",
                    "agent": {"name": "tool", "max_turns": model.turns},
                }
                for i in range(rollouts)
            ]
            started = time.monotonic()
            for i, url in enumerate(urls):  # every node takes submits
                with RolloutClient(url, timeout=60) as one:
                    one.submit_batch(jobs[i::count])
            finished = list(client.iter_results(cursor, stop_after=rollouts))
            seconds = time.monotonic() - started
    calls = {key: len(v) for key, v in model.calls.items() if key.startswith(tag)}
    return NodesStep(
        store=store,
        nodes=count,
        rollouts=rollouts,
        completed=sum(1 for v in finished if v.status == "completed"),
        errors=sum(1 for v in finished if v.status != "completed"),
        duplicate_runs=sum(1 for n in calls.values() if n > model.turns),
        retried=sum(1 for v in finished if v.attempts > 1),
        seconds=round(seconds, 2),
        rollouts_per_s=round(rollouts / seconds, 2),
        turn_gap_p50_ms=round(quantile(_gaps(model, tag), 0.5) * 1000, 1),
        turn_gap_p99_ms=round(quantile(_gaps(model, tag), 0.99) * 1000, 1),
    )


def _gaps(model: EmulatedModel, tag: str) -> list[float]:
    with model.lock:
        rollouts = [v for key, v in model.calls.items() if key.startswith(tag)]
    return [b[0] - a[1] for calls in rollouts for a, b in itertools.pairwise(calls)]


def bench_nodes(
    rollouts: int = 200, turns: int = 4, model_ms: float = 500.0, store_url: str | None = None
) -> NodesBenchResult:
    """Every configuration of CONFIGS in turn, on one emulated model."""
    from rollserve.fixtures.postgres import TempPostgres

    steps = []
    with ExitStack() as stack:
        model = EmulatedModel(turns, model_ms)
        stack.callback(model.close)
        base = Path(tempfile.mkdtemp(prefix="rollserve-bench-nodes-"))
        server = None
        for store, count in CONFIGS:
            where = base / f"{store}-{count}"
            if store == "sqlite":
                url = f"sqlite://{where / 'jobs.db'}"
            elif store_url is not None:
                url = store_url
            else:
                if server is None:
                    server = TempPostgres().start()
                    stack.callback(server.close)
                url = server.create(f"bench_{count}")
            steps.append(_step(store, count, url, where, model, rollouts))
    shutil.rmtree(base, ignore_errors=True)  # kept, with the nodes' logs, when a step failed
    return NodesBenchResult(
        rollouts=rollouts,
        turns=turns,
        model_ms=model_ms,
        cpus=os.cpu_count() or 1,
        steps=steps,
    )


def nodes_table(result: NodesBenchResult) -> Table:
    table = Table(
        title=f"{result.rollouts} rollouts of {result.turns} turns, model {result.model_ms:.0f} ms,"
        f" {result.cpus} CPUs"
    )
    columns = ("store", "nodes", "rollouts/s", "turn gap p50 ms", "p99 ms", "errors", "duplicates")
    for column in columns:
        table.add_column(column, justify="right")
    for s in result.steps:
        table.add_row(
            s.store,
            str(s.nodes),
            f"{s.rollouts_per_s:.1f}",
            f"{s.turn_gap_p50_ms:.0f}",
            f"{s.turn_gap_p99_ms:.0f}",
            str(s.errors),
            str(s.duplicate_runs),
        )
    return table
