"""The tiny model in this process, and a real ``rollserve llm serve`` process over it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rollserve.llm.local.engine import LocalEngine
from tests.servers import LlmServer


@pytest.fixture(scope="session")
def tiny_engine(tiny_model: Path) -> LocalEngine:
    """The same model in this process, to recompute what the server answered."""
    return LocalEngine(tiny_model)


@pytest.fixture(scope="session")
def local_llm_server(
    tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LlmServer]:
    log = tmp_path_factory.mktemp("llm-server") / "server.log"
    server = LlmServer(tiny_model, tiny_model.name, log)
    yield server
    server.stop()
