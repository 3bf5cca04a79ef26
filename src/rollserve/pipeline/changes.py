"""Wake-ups for long-polls: a waiter sleeps until a job changes state on this node, instead of
polling the store in a tight loop (changes made by other nodes are seen by a slower poll)."""

from __future__ import annotations

import asyncio
import contextlib


class Changes:
    """A broadcast signal: ``notify`` wakes everyone watching since the last notify."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def watch(self) -> asyncio.Event:
        """Take this before reading the store: a change after the read then still wakes."""
        return self._event

    def notify(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    @staticmethod
    async def wait(watched: asyncio.Event, timeout: float) -> None:
        """Until ``watched`` is set or ``timeout`` seconds pass."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0.0, timeout)):  # not wait_for: see scheduler._next
                await watched.wait()
