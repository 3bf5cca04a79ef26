"""The trainer-side client of rollserve's HTTP API (httpx + pydantic + schema only)."""

from rollserve.client.http import AsyncRolloutClient, RolloutClient, wait_ready

__all__ = ["AsyncRolloutClient", "RolloutClient", "wait_ready"]
