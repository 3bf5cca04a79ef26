"""A pytest plugin that records each test's CPU time, to find what makes the suite slow:
``pytest --cpu-log DIR`` writes one JSON line per test (its id, wall
seconds, CPU seconds of the test process and of the children it waited for: servers,
sandboxes, trainers) into ``DIR/cpu-PID.jsonl``, a file per test worker."""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Iterator
from pathlib import Path

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--cpu-log", type=Path, help="directory for each test's CPU time")


def _cpu() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    folder: Path | None = item.config.getoption("--cpu-log")
    if folder is None:
        return (yield)
    start, (own, children) = time.monotonic(), _cpu()
    try:
        return (yield)
    finally:
        own_after, children_after = _cpu()
        line = {
            "id": item.nodeid,
            "wall": round(time.monotonic() - start, 3),
            "self": round(own_after - own, 3),
            "children": round(children_after - children, 3),
        }
        folder.mkdir(parents=True, exist_ok=True)
        with (folder / f"cpu-{os.getpid()}.jsonl").open("a") as log:
            log.write(json.dumps(line) + "\n")
