"""A loopback port for a harness's model calls, carried to the gateway's Unix socket: SDKs
that take only a base URL (litellm, the OpenAI SDK) reach the job's gateway through it."""

from __future__ import annotations

import asyncio
import contextlib
import threading


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            writer.write_eof()


class LoopbackRelay:
    """127.0.0.1 on a free port, in a thread of its own, relayed to ``socket``."""

    def __init__(self, socket: str) -> None:
        self.socket = socket
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="rollserve-relay", daemon=True)

    def start(self) -> LoopbackRelay:
        self._thread.start()
        self._ready.wait(10)
        if not self.port:
            raise RuntimeError("the loopback relay did not start")
        return self

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._carry, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _carry(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(self.socket)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        for each in (writer, up_writer):
            each.close()
