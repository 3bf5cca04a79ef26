"""The backend's connections: calls in flight spread over clients of at most ``per_client``
calls each, against a real HTTP server on loopback that holds every call until told."""

from __future__ import annotations

import asyncio

import httpx

from rollserve.llm.clients import ClientSet


async def test_calls_in_flight_spread_over_bounded_clients() -> None:
    held, all_arrived = asyncio.Event(), asyncio.Event()
    arrived = 0
    peers: set[tuple[str, int]] = set()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal arrived
        peers.add(writer.get_extra_info("peername"))
        try:
            while await reader.readuntil(b"\r\n\r\n"):
                arrived += 1
                if arrived == 10:
                    all_arrived.set()
                await held.wait()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()  # the client closed its connection

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    clients = ClientSet(httpx.Timeout(10), per_client=4)
    url = f"http://127.0.0.1:{port}/v1/models"
    try:
        calls = [asyncio.create_task(clients.request("GET", url)) for _ in range(10)]
        async with asyncio.timeout(10):
            await all_arrived.wait()
        assert clients.clients == 3  # 4 + 4 + 2
        held.set()
        answers = await asyncio.gather(*calls)
        assert [a.json() for a in answers] == [{}] * 10
        assert len(peers) == 10  # one connection per call in flight
        # The next calls reuse what is open: no new client, no new connection.
        again = await asyncio.gather(*(clients.request("GET", url) for _ in range(8)))
        assert all(a.status_code == 200 for a in again)
        assert clients.clients == 3 and len(peers) == 10
    finally:
        await clients.aclose()
        server.close()
        await server.wait_closed()
    assert clients.clients == 0
