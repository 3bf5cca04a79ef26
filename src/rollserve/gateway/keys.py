"""The node's gateway: a per-job secret key for each job whose run stage serves an agent
through it, valid only while that stage holds the job."""

from __future__ import annotations

import secrets
from collections import OrderedDict

from rollserve.gateway.base import Refusal
from rollserve.gateway.job import GatewayJob

_ENDED_KEPT = 10_000  # ended keys remembered, to tell a late caller its job ended


class Gateway:
    """Keys → the running jobs they open, on this node."""

    def __init__(self) -> None:
        self._open: dict[str, GatewayJob] = {}
        self._ended: OrderedDict[str, str] = OrderedDict()  # key → "job J ended (reason)"

    def open(self, job: GatewayJob) -> str:
        """A new key for ``job``; valid until :meth:`close`."""
        key = secrets.token_urlsafe(24)
        self._open[key] = job
        return key

    def close(self, key: str, why: str) -> None:
        job = self._open.pop(key, None)
        if job is None:
            return
        self._ended[key] = f"job {job.job_id} is no longer running ({why})"
        while len(self._ended) > _ENDED_KEPT:
            self._ended.popitem(last=False)

    def job(self, key: str) -> GatewayJob:
        """The job ``key`` opens; a Refusal when it opens none (any more)."""
        found = self._open.get(key)
        if found is not None:
            return found
        ended = self._ended.get(key)
        if ended is not None:
            raise Refusal(410, f"{ended}: this gateway key is closed", "job_ended")
        raise Refusal(
            404, "no running job holds this gateway key", "unknown_key", "not_found_error"
        )

    def __len__(self) -> int:
        return len(self._open)
