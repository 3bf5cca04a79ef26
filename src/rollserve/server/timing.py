"""``Server-Timing: app;dur=MS`` on every answer: how long the server took, from the request's
arrival to the start of its answer, as browsers' developer tools and benchmarks read it."""

from __future__ import annotations

import time

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class ServerTiming:
    """ASGI middleware; outermost, so that it times the guard and the route alike."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()

        async def timed(message: Message) -> None:
            if message["type"] == "http.response.start":
                spent = (time.perf_counter() - started) * 1000
                MutableHeaders(scope=message).append("Server-Timing", f"app;dur={spent:.2f}")
            await send(message)

        await self.app(scope, receive, timed)
