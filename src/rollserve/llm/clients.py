"""Connections to one backend for hundreds of calls in flight at once.

One ``httpx.AsyncClient`` pools every connection it holds, and its pool walks them all each
time a call starts or ends (httpcore's ``_assign_requests_to_connections``, encode/httpcore
#1035): with 500 calls in flight that bookkeeping took over half of a node's CPU and held the
gateway to ~60 calls a second. Here each client holds at most ``per_client`` calls; a call
goes to the least busy client, and another client opens when every one is full."""

from __future__ import annotations

import httpx


class ClientSet:
    """``httpx.AsyncClient`` s enough for every call in flight, ``per_client`` each."""

    def __init__(self, timeout: httpx.Timeout, per_client: int = 16) -> None:
        self._timeout = timeout
        self._per_client = per_client
        self._clients: list[httpx.AsyncClient] = []
        self._busy: list[int] = []  # calls in flight, per client

    def _client(self) -> int:
        """The index of the least busy client, a new one when all are full."""
        if self._busy:
            index = min(range(len(self._busy)), key=self._busy.__getitem__)
            if self._busy[index] < self._per_client:
                return index
        # No cap within a client: each call in flight holds a connection, kept for the next.
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        self._clients.append(httpx.AsyncClient(timeout=self._timeout, limits=limits))
        self._busy.append(0)
        return len(self._clients) - 1

    async def request(self, method: str, url: str, body: object = None) -> httpx.Response:
        index = self._client()
        self._busy[index] += 1
        try:
            return await self._clients[index].request(method, url, json=body)
        finally:
            self._busy[index] -= 1

    @property
    def clients(self) -> int:
        return len(self._clients)

    async def aclose(self) -> None:
        clients, self._clients, self._busy = self._clients, [], []
        for client in clients:
            await client.aclose()
