"""schemathesis over rollserve's own OpenAPI document, against a real server: every route,
with the bearer token (no 5xx, every answer as the document declares it: status, media type,
body) and without it (401 in the error shape everywhere but the open paths). Bounded here;
``rollserve``'s README gives the longer run (schemathesis' CLI, stateful phase included)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from tests.integration.conftest import Server

TOKEN = "fuzz-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
OPEN = {"/healthz", "/readyz", "/openapi.json"}
EXAMPLES = 75  # per route at most: about 800 requests with the token


@pytest.fixture(scope="module")
def api_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    base = tmp_path_factory.mktemp("fuzz")
    env = {
        "ROLLSERVE_API_TOKEN": TOKEN,
        "ROLLSERVE_LLM_REQUEST_TIMEOUT_S": "2",  # registrations of made-up URLs fail fast
        "ROLLSERVE_INIT_WORKERS": "1",
        "ROLLSERVE_RUN_WORKERS": "2",
        "ROLLSERVE_EVAL_WORKERS": "1",
    }
    server = Server(base / "data", env)
    server.data_dir.mkdir(parents=True)
    server.start()
    yield server
    server.stop()


def _operations(server: Server) -> list[Any]:
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    return [result.ok() for result in schema.get_all_operations()]


def _short(case: Any) -> None:
    """Long-polls end at once: the document allows 600 s, the test has no time for it."""
    if case.query and "wait" in case.query:
        case.query["wait"] = 0


def _fuzz(operation: Any, examples: int, check: Callable[[Any], None]) -> str | None:
    """``check`` on ``examples`` cases of one route; the first failure, shrunk, as text."""

    @given(operation.as_strategy())
    @settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    def run(case: Any) -> None:
        _short(case)
        check(case)

    try:
        run()
    except (Exception, ExceptionGroup) as exc:  # every failure is reported; the next route goes on
        return f"{operation.label}: {type(exc).__name__}: {exc}"[:3000]
    return None


def test_every_route_answers_as_documented(api_server: Server) -> None:
    """With the token: no 5xx, and status, media type and body as the document says.
    positive_data_acceptance is left out: it takes any schema-valid body for one the server
    must accept, and a task kind or model that is not registered is valid JSON yet refused."""

    sent = []

    def check(case: Any) -> None:
        sent.append(case.operation.label)
        case.call_and_validate(
            base_url=api_server.url,
            headers=AUTH,
            excluded_checks=[positive_data_acceptance],
            timeout=30,
        )

    operations = _operations(api_server)
    failures = [_fuzz(op, EXAMPLES, check) for op in operations]
    assert [f for f in failures if f] == []
    assert set(sent) == {op.label for op in operations}  # every route was called
    assert len(sent) >= 10 * len(operations)


def test_no_route_answers_without_the_token(api_server: Server) -> None:
    def check(case: Any) -> None:
        answer = case.call(base_url=api_server.url, timeout=30)
        if case.path in OPEN:
            assert answer.status_code in (200, 503)
            return
        if case.path.startswith("/v1/gateway/"):  # a job's key is the secret: no job has this
            assert answer.status_code in (404, 422), (case.method, case.path, answer.text)
            if answer.status_code == 404:
                assert answer.json()["error"]["code"] == "unknown_key"
            return
        assert answer.status_code == 401, (case.method, case.path, answer.text)
        assert answer.json()["error"]["code"] == "unauthorized"

    failures = [_fuzz(op, 10, check) for op in _operations(api_server)]
    assert [f for f in failures if f] == []


def test_the_server_still_answers_after_the_fuzzing(api_server: Server) -> None:
    answer = httpx.get(f"{api_server.url}/v1/status", headers=AUTH, timeout=10)
    assert answer.status_code == 200
    log = (Path(api_server.data_dir).parent / "server.log").read_text()
    assert "Traceback" not in log and TOKEN not in log
