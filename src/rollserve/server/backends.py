"""Registered inference backends, checked on registration (``GET {url}/models`` answers) and
kept in the store, so that they outlive a restart."""

from __future__ import annotations

import asyncio
import hashlib
import time

import httpx

from rollserve.errors import BackendNotFoundError, InvalidInputError
from rollserve.schema.backends import BackendSpec, BackendView
from rollserve.storage import BackendStore


class BackendDirectory:
    """The backends a trainer registered, as the store holds them."""

    def __init__(self, store: BackendStore) -> None:
        self._store = store

    async def register(self, spec: BackendSpec) -> BackendView:
        url = spec.url.rstrip("/")
        try:
            async with httpx.AsyncClient(timeout=10) as client:
                answer = await client.get(f"{url}/models")
        except httpx.HTTPError as exc:
            raise InvalidInputError(
                f"backend {url} did not answer GET /models: {exc}", field="url"
            ) from exc
        if answer.status_code != 200:
            raise InvalidInputError(
                f"backend {url} answered GET /models with HTTP {answer.status_code}", field="url"
            )
        backend_id = spec.id or hashlib.sha1(f"{url}|{spec.model}".encode()).hexdigest()[:12]
        backend = BackendView(
            **{**spec.model_dump(), "id": backend_id, "url": url}, registered_at=time.time()
        )
        await asyncio.to_thread(
            self._store.save_backend, backend_id, backend.model_dump(mode="json")
        )
        return backend

    async def list(self) -> list[BackendView]:
        stored = await asyncio.to_thread(self._store.load_backends)
        return [BackendView.model_validate(spec) for spec in stored]

    async def remove(self, backend_id: str) -> None:
        if not await asyncio.to_thread(self._store.delete_backend, backend_id):
            raise BackendNotFoundError(f"no backend {backend_id!r}", backend_id=backend_id)
