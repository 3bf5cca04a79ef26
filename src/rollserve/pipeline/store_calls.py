"""How a node's scheduler calls the job store: off the event loop, the heartbeat's calls on a
thread of their own, and a finished stage's calls tried again while the store is away."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from rollserve.errors import StoreUnavailableError

log = logging.getLogger(__name__)
T = TypeVar("T")


class StoreCalls:
    """The store calls of one node, for leases of ``lease_s``."""

    def __init__(self, lease_s: float) -> None:
        self._lease_s = lease_s
        self._leases: ThreadPoolExecutor | None = None

    def open(self) -> None:
        self._leases = ThreadPoolExecutor(1, thread_name_prefix="rollserve-leases")

    async def close(self) -> None:
        if self._leases is not None:
            await asyncio.to_thread(self._leases.shutdown)
            self._leases = None

    async def on_lease_thread(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run a store call on the lease thread: no other work can make a heartbeat late."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._leases, functools.partial(fn, *args, **kwargs))

    async def retried(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """A store call off the event loop; while the store does not answer it is tried again
        for up to a lease (the job's work is done: keep it), then the error stands."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self._lease_s
        while True:
            try:
                return await asyncio.to_thread(fn, *args, **kwargs)
            except StoreUnavailableError as exc:
                if loop.time() >= give_up:
                    raise
                log.warning("the store does not answer (%s); trying again", exc.message)
                await asyncio.sleep(min(1.0, self._lease_s / 10))
