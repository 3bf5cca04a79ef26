"""Registered inference backends, checked on registration (``GET {url}/models`` answers)."""

from __future__ import annotations

import hashlib
import time

import httpx

from rollserve.errors import BackendNotFoundError, InvalidInputError
from rollserve.schema.backends import BackendSpec, BackendView


class BackendDirectory:
    """The backends a trainer registered on this node."""

    def __init__(self) -> None:
        self._backends: dict[str, BackendView] = {}

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
        self._backends[backend_id] = backend
        return backend

    def list(self) -> list[BackendView]:
        return list(self._backends.values())

    def remove(self, backend_id: str) -> None:
        if self._backends.pop(backend_id, None) is None:
            raise BackendNotFoundError(f"no backend {backend_id!r}", backend_id=backend_id)
