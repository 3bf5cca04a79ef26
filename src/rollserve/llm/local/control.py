"""The local server's control routes, as vLLM and SGLang have them: pause and resume around a
weight update (vLLM's ``/pause?mode=abort|wait|keep``, ``/resume``, ``/is_paused``), SGLang's
``/abort_request`` and ``/update_weights_from_disk``, and ``/server_info``."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any, Literal

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict

from rollserve.errors import InvalidInputError, RollserveError
from rollserve.llm.local.engine import LocalEngine

PauseMode = Literal["abort", "wait", "keep"]


class ServerPausedError(RollserveError):
    """A generation request refused because the server is paused (vLLM answers 503)."""

    code = "server_paused"
    http_status = 503


class Control:
    """Pause, abort and weight-version state shared by the generation endpoints. ``gate``
    is polled by the engine thread before each token."""

    def __init__(self) -> None:
        self.epoch = 0  # an abort ends every request that started before it
        self.mode: PauseMode | None = None
        self.running = 0
        self.weight_version = "default"
        self.idle = asyncio.Condition()
        self._thawed = threading.Event()
        self._thawed.set()

    def admit(self) -> int:
        """A new request's ticket; refused while paused in ``abort`` or ``wait`` mode."""
        if self.mode in ("abort", "wait"):
            raise ServerPausedError(f"the server is paused ({self.mode}); resume it first")
        return self.epoch

    def gate(self, ticket: int) -> Callable[[], bool]:
        """Whether the request holding ``ticket`` is aborted; blocks while frozen (``keep``)."""

        def aborted() -> bool:
            while not self._thawed.wait(0.1):
                pass
            return self.epoch != ticket

        return aborted

    def abort_all(self) -> None:
        self.epoch += 1

    async def pause(self, mode: PauseMode) -> None:
        self.mode = mode
        if mode == "keep":
            self._thawed.clear()
            return
        if mode == "abort":
            self.abort_all()
        async with self.idle:  # abort and wait: the call returns once nothing runs
            await self.idle.wait_for(lambda: self.running == 0)

    def resume(self) -> None:
        self.mode = None
        self._thawed.set()

    async def finished(self) -> None:
        async with self.idle:
            self.running -= 1
            self.idle.notify_all()


class AbortRequest(BaseModel):
    """SGLang's ``/abort_request`` body (only ``abort_all`` is honoured here)."""

    model_config = ConfigDict(extra="ignore")
    rid: str = ""
    abort_all: bool = False


class UpdateWeights(BaseModel):
    """SGLang's ``/update_weights_from_disk`` body."""

    model_config = ConfigDict(extra="ignore")
    model_path: str
    weight_version: str | None = None
    abort_all_requests: bool = False


def add_control_routes(
    app: FastAPI, engine: LocalEngine, control: Control, lock: asyncio.Lock
) -> None:
    """Mount the control routes on the local server's app."""

    @app.post("/pause")
    async def pause(mode: PauseMode = "abort") -> dict[str, str]:
        await control.pause(mode)
        return {"status": "paused"}

    @app.post("/resume")
    async def resume() -> dict[str, str]:
        control.resume()
        return {"status": "resumed"}

    @app.get("/is_paused")
    async def is_paused() -> dict[str, bool]:
        return {"is_paused": control.mode is not None}

    @app.post("/abort_request")
    async def abort_request(body: AbortRequest) -> dict[str, Any]:
        if not body.abort_all:
            raise InvalidInputError("this server aborts only with abort_all", field="abort_all")
        control.abort_all()
        return {}

    @app.post("/update_weights_from_disk")
    async def update_weights(body: UpdateWeights) -> dict[str, Any]:
        if body.abort_all_requests:
            control.abort_all()
        async with lock:
            await asyncio.to_thread(engine.load_weights, body.model_path)
        if body.weight_version is not None:
            control.weight_version = body.weight_version
        return {"success": True, "message": f"loaded {body.model_path}", "num_paused_requests": 0}

    async def server_info() -> dict[str, Any]:
        # Seeds are always honoured here, as in SGLang's deterministic mode.
        return {
            "model_path": engine.model_name,
            "enable_deterministic_inference": True,
            "weight_version": control.weight_version,
            "context_length": engine.max_model_len,
        }

    app.add_api_route("/server_info", server_info, methods=["GET"])
    app.add_api_route("/get_server_info", server_info, methods=["GET"])
