"""Fixtures of the router tests: a job store, a factory of fake backends, routers over them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rollserve.llm.router import BackendFactory, Router
from rollserve.registry import Registry
from rollserve.settings import Settings
from rollserve.storage import SqliteJobStore
from rollserve.testing.fake_llm import FakeLLMFactory

MakeRouter = Callable[..., Awaitable[Router]]


def kinds(factory: FakeLLMFactory) -> Registry[BackendFactory]:
    registry: Registry[BackendFactory] = Registry("inference backend kind")
    for kind in ("vllm", "sglang", "openai"):
        registry.register(kind, factory)
    return registry


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteJobStore]:
    db = SqliteJobStore(tmp_path / "jobs.db")
    yield db
    db.close()


@pytest.fixture
def factory() -> FakeLLMFactory:
    return FakeLLMFactory()


@pytest.fixture
async def make_router(
    tmp_path: Path, store: SqliteJobStore, factory: FakeLLMFactory
) -> AsyncIterator[MakeRouter]:
    routers: list[Router] = []

    async def make(**overrides: Any) -> Router:
        values: dict[str, Any] = {"llm_health_interval_s": 3600.0, "llm_wait_s": 5.0}
        settings = Settings(data_dir=tmp_path / "data", **{**values, **overrides})
        router = Router(settings, store, kinds(factory))
        await router.start()
        routers.append(router)
        return router

    yield make
    for router in routers:
        await router.stop()
