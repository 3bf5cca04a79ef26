"""A running episode's turns, appended to the job store as they end: whoever watches the job
(the web viewer) sees it turn by turn before it has a result."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from rollserve.agents.base import TurnHook
from rollserve.errors import StoreUnavailableError
from rollserve.schema.trajectory import TurnLog
from rollserve.storage.base import JobRecord, JobStore

log = logging.getLogger(__name__)


def turn_recorder(store: JobStore, job: JobRecord) -> TurnHook:
    """The hook that appends ``job``'s turns (of its current attempt) to ``store``; a store
    that does not answer loses the event, never the job."""

    async def told(turn: int, messages: list[dict[str, Any]], entry: TurnLog | None) -> None:
        data = {"messages": messages, "log": entry.model_dump(mode="json") if entry else None}
        try:
            await asyncio.to_thread(store.append_event, job.job_id, job.attempts, turn, data)
        except StoreUnavailableError as exc:
            log.warning("job %s: turn %d not recorded: %s", job.job_id, turn, exc.message)

    return told
