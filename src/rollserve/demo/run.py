"""The steps of ``rollserve demo`` once its requirements are met: the model server, the
token-mode tokenizer, the SWE task, the service and its backend, the GRPO groups with live
progress, the summary and the trajectories. Whatever it started is stopped on every path."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from rollserve.client import AsyncRolloutClient, RolloutClient
from rollserve.demo.checks import ModelSource, Requirements
from rollserve.demo.jobs import (
    FAST,
    FAST_LIMITS,
    FULL,
    FULL_LIMITS,
    SWE,
    Pick,
    group_id,
    job_requests,
    load_task,
    prepared_swe,
)
from rollserve.demo.model import ModelServer, run_prepare
from rollserve.demo.report import Board, summary_tables, throughput, write_trajectories
from rollserve.demo.service import fresh_store, local_service
from rollserve.schema.backends import BackendSpec, BackendView
from rollserve.schema.jobs import JobRequest, JobView, Task
from rollserve.settings import Settings
from rollserve.tasks.swe.prepare import prepare_specs

_MODEL_LOAD_TIMEOUT_S = 600.0
_POLL_S = 0.5


def _register(url: str, spec: BackendSpec) -> BackendView:
    with RolloutClient(url) as client:
        return client.register_backend(spec)


class DemoRun:
    """One run of the demo over met ``requirements``."""

    def __init__(
        self,
        settings: Settings,
        demo_dir: Path,
        samples: int,
        requirements: Requirements,
        console: Console,
    ) -> None:
        assert requirements.model is not None and requirements.examples is not None
        self.settings = settings  # the service's (its data_dir is under demo_dir)
        self.demo_dir = demo_dir
        self.samples = samples
        self.model: ModelSource = requirements.model
        self.examples: Path = requirements.examples
        self.console = console
        self.fast = self.model.tiny
        self.picks = list(FAST if self.fast else FULL)
        self.limits = FAST_LIMITS if self.fast else FULL_LIMITS
        self.logs = demo_dir / "logs"
        self.step = 1

    def say(self, title: str, explanation: str = "") -> None:
        self.step += 1
        self.console.print(f"\n[bold]{self.step}. {title}[/bold]")
        if explanation:
            self.console.print(f"[dim]{explanation}[/dim]")

    async def run(self) -> int:
        started = time.monotonic()
        async with contextlib.AsyncExitStack() as stack:
            server = await self.start_model(stack)
            tokenizer = await self.export_tokenizer()
            tasks = await self.load_tasks()
            context = await self.wait_model(server)
            self.say(
                "The rollserve service",
                "The same HTTP service as `rollserve serve`, on a free port: three worker pools "
                "(init, run, eval), a SQLite job store, bwrap sandboxes; then the model server "
                "is registered as a vLLM-compatible backend in token mode.",
            )
            fresh_store(self.settings)
            stack.callback(self.check_no_sandbox_left)  # runs once the service has stopped
            url = await stack.enter_async_context(local_service(self.settings))
            client = await stack.enter_async_context(AsyncRolloutClient(url))
            await self.register(url, server, tokenizer, context)
            board = await self.submit(client, tasks, stack)
            await self.follow(client, board, server)
            failed = self.report(board, tasks)
        self.console.print(f"\ndemo finished in {time.monotonic() - started:.0f} s")
        return 1 if failed else 0

    async def start_model(self, stack: contextlib.AsyncExitStack) -> ModelServer:
        self.say(
            "The model server",
            "rollserve's CPU inference server (`rollserve llm serve`) speaks vLLM's and SGLang's "
            "HTTP APIs: token ids in, token ids and logprobs out. It loads in the background "
            "while the next steps run.",
        )
        source = self.model
        if source.tiny:
            with self.console.status("building the tiny test model"):
                answer = await run_prepare(
                    self.logs / "prepare.log", "tiny", "--cache", str(source.directory)
                )
            source = self.model = dataclasses.replace(source, directory=Path(answer["model_dir"]))
        server = ModelServer(source, self.logs / "model-server.log")
        stack.push_async_callback(self.stop_model, server)
        await server.start()
        self.console.print(
            f"serving {source.label} as {source.name!r} at {server.url} "
            f"(model server pid {server.pid}; log {server.log})"
        )
        return server

    async def stop_model(self, server: ModelServer) -> None:
        if server.pid is not None:
            await server.stop()
            self.console.print(f"model server stopped (pid {server.pid})")

    async def export_tokenizer(self) -> Path:
        self.say(
            "The tokenizer for token mode",
            "In token mode rollserve renders each conversation with the model's chat template "
            "itself and sends token ids, so trajectories are exactly what the model saw and "
            "generated. It needs the tokenizer as a Hugging Face directory: exported once.",
        )
        out = self.demo_dir / "tokenizers" / self.model.name
        args = ["tokenizer", "--source", str(self.model.directory), "--out", str(out)]
        if self.model.gguf_file:
            args += ["--gguf-file", self.model.gguf_file]
        with self.console.status("exporting the tokenizer (model loading in the background)"):
            answer = await run_prepare(self.logs / "prepare.log", *args)
        notes = {
            "own": "its own chat template renders the tool schemas",
            "chatml-tools": "its chat template (ChatML) has no tool section, so the exported one "
            "adds Qwen2.5's: the tool schemas and the <tool_call> format go into the system "
            "prompt, after the task family's instructions",
            "own-without-tools": "its chat template cannot show tools: the model sees only the "
            "task family's instructions",
        }
        cached = "already exported" if answer["cached"] else "exported"
        self.console.print(f"{cached} to {out}; {notes[answer['template']]}")
        return out

    async def load_tasks(self) -> list[tuple[Pick, Task]]:
        tasks = [
            (pick, load_task(self.examples / pick.path, pick.task_id))
            for pick in self.picks
            if pick.path != SWE
        ]
        swe = [pick for pick in self.picks if pick.path == SWE]
        if swe:
            self.say(
                "The SWE task",
                "`rollserve tasks prepare-swe` turns a spec (a release on PyPI, a test patch, "
                "a gold patch, test ids) into a git repository and a Python environment, and "
                "validates it in sandboxes: the hidden tests fail before the fix, pass after.",
            )
        for pick in swe:
            task = await self.prepare_swe(pick)
            if task is not None:
                tasks.append((pick, task))
        return tasks

    async def prepare_swe(self, pick: Pick) -> Task | None:
        out = self.demo_dir / "swe-tasks"
        task = prepared_swe(out, pick.task_id)
        if task is not None:
            self.console.print(f"{pick.task_id}: already prepared in {out}")
            return task
        specs = self.examples / "swe" / "specs.jsonl"
        with self.console.status(f"preparing {specs} (fetches the sources and pytest from PyPI)"):
            reports = await prepare_specs(specs, out, self.settings)
        for report in reports:
            verdict = "valid" if report.valid else f"invalid: {report.reason}"
            self.console.print(f"{report.task_id}: {verdict} ({report.seconds:.0f} s)")
        task = prepared_swe(out, pick.task_id)
        if task is None:
            self.console.print(f"[yellow]{pick.task_id} is not ready: going on without it")
        return task

    async def wait_model(self, server: ModelServer) -> int:
        with self.console.status(f"waiting for the model server to load {self.model.label}"):
            context = await server.wait_ready(_MODEL_LOAD_TIMEOUT_S)
        waited = time.monotonic() - server.started
        self.console.print(f"model server ready {waited:.0f} s after its start (context {context})")
        return context

    async def register(self, url: str, server: ModelServer, tokenizer: Path, context: int) -> None:
        spec = BackendSpec(
            id=f"demo-{self.model.name}",
            kind="vllm",
            url=server.url,
            model=self.model.name,
            tokenizer=str(tokenizer),
            max_model_len=context,
            policy_version=0,
        )
        with self.console.status("registering the backend (rollserve checks it end to end)"):
            view = await asyncio.to_thread(_register, url, spec)
        self.console.print(
            f"service at {url}; backend {view.id!r}: kind {view.kind}, model {view.model!r}, "
            f"token mode (tokenizer {view.tokenizer}), policy_version {view.policy_version}"
        )

    async def submit(
        self,
        client: AsyncRolloutClient,
        tasks: list[tuple[Pick, Task]],
        stack: contextlib.AsyncExitStack,
    ) -> Board:
        limits = self.limits
        jobs = job_requests(tasks, self.samples, self.model.name, limits)
        samples = f"{self.samples} sample{'s' if self.samples > 1 else ''}"
        self.say(
            f"{len(jobs)} rollouts in {len(tasks)} GRPO groups",
            f"One group per task, {samples} each (temperature {limits.temperature}, a seed per"
            f" sample). Limits: {limits.max_turns} turns, {limits.turn_tokens} tokens per turn,"
            f" {limits.context_tokens} tokens per trajectory. A reply without a tool call is"
            " answered with a request to call one, so episodes go on for several turns.",
        )
        table = Table("group", "family", "task")
        for pick, task in tasks:
            table.add_row(group_id(pick.task_id), pick.family, task.prompt.strip().splitlines()[0])
        self.console.print(table)
        requests: list[JobRequest | dict[str, Any]] = list(jobs)
        accepted = await client.submit_batch(requests)
        board = Board([a.job_id for a in accepted])
        groups = sorted({job.group_id for job in jobs if job.group_id})
        stack.push_async_callback(self.cancel_left, client, board, groups)
        return board

    async def cancel_left(
        self, client: AsyncRolloutClient, board: Board, groups: list[str]
    ) -> None:
        left = board.pending
        if left:
            for group in groups:
                await client.cancel_group(group)
            self.console.print(f"cancelled {len(left)} unfinished jobs")

    async def follow(self, client: AsyncRolloutClient, board: Board, server: ModelServer) -> None:
        """Poll the jobs until all have finished (a dead model server ends the wait)."""
        terminal = self.console.is_terminal
        with (
            Live(board.render(), console=self.console, refresh_per_second=4)
            if terminal
            else (contextlib.nullcontext()) as live
        ):
            while board.pending:
                server.check_alive()
                views = await asyncio.gather(*(client.get(j) for j in board.pending))
                board.stages = (await client.status()).stages
                for view in views:
                    line = board.update(view)
                    if line and not terminal:
                        self.console.print(line, soft_wrap=True)
                if live is not None:
                    live.update(board.render())
                if board.pending:
                    await asyncio.sleep(_POLL_S)

    def report(self, board: Board, tasks: list[tuple[Pick, Task]]) -> int:
        """Summary, throughput and trajectories; how many jobs did not complete."""
        views = [board.views[j] for j in board.job_ids]
        groups: list[tuple[str, str, list[JobView]]] = []
        for pick, _ in tasks:
            group = group_id(pick.task_id)
            groups.append((group, pick.family, [v for v in views if v.group_id == group]))
        self.console.print()
        self.console.print(summary_tables(groups))
        self.console.print(throughput(board))
        path = self.demo_dir / "trajectories.jsonl"
        write_trajectories(path, views)
        self.console.print(
            f"trajectories (full JobViews, token ids included): {path}", soft_wrap=True
        )
        for view in views:
            if view.error is not None:
                self.console.print(f"[red]{view.job_id}: {view.error.code}: {view.error.message}")
        return sum(v.status != "completed" for v in views)

    def check_no_sandbox_left(self) -> None:
        state = self.settings.state_dir
        left = sorted(p.name for p in state.iterdir()) if state.is_dir() else []
        if left:
            self.console.print(
                f"[red]sandboxes left under {state}: {', '.join(left)}", soft_wrap=True
            )
        else:
            self.console.print(f"service stopped; no sandbox left under {state}", soft_wrap=True)
