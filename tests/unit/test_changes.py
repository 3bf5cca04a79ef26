"""Long-poll wake-ups: a change after a waiter looked at the store still wakes it."""

from __future__ import annotations

import asyncio

from rollserve.pipeline.changes import Changes


async def test_notify_wakes_watchers_taken_before_it() -> None:
    changes = Changes()
    watched = changes.watch()
    waiter = asyncio.create_task(Changes.wait(watched, 30))
    await asyncio.sleep(0)
    assert not waiter.done()
    changes.notify()
    await asyncio.wait_for(waiter, 5)
    assert watched.is_set()
    assert not changes.watch().is_set()  # a later watcher waits for the next change


async def test_wait_ends_at_its_timeout_without_a_change() -> None:
    changes = Changes()
    watched = changes.watch()
    await Changes.wait(watched, 0.01)
    assert not watched.is_set()
