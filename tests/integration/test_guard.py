"""What every request passes: named tokens (read-only ones may only read), the bound on the
body's size, one error shape for every refusal, every status declared in the OpenAPI
document, and HTTPS when a certificate is given."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from rollserve.client import RolloutClient, wait_ready
from tests.integration.conftest import ROOT, Server
from tests.servers import free_port

FULL = "trainer-token-0123456789"
READER = "dashboard-token-0123456789"
JOB = {
    "task": {"task_id": "g", "kind": "echo", "prompt": "x"},
    "agent": {"name": "submit", "submission": "x"},
}


def _tokens(tmp_path: Path) -> str:
    secret = tmp_path / "reader.token"
    secret.write_text(READER + "\n")
    return json.dumps(
        [
            {"name": "trainer", "token": FULL},
            {"name": "dashboard", "token_file": str(secret), "read_only": True},
        ]
    )


def _error(answer: httpx.Response) -> dict[str, object]:
    body = answer.json()
    assert set(body) == {"error"} and {"code", "message", "details"} <= set(body["error"])
    error: dict[str, object] = body["error"]
    return error


def test_named_tokens_and_read_only_ones(
    server_factory: Callable[..., Server], tmp_path: Path
) -> None:
    server = server_factory(api_tokens=_tokens(tmp_path))
    server.start()
    full = {"Authorization": f"Bearer {FULL}"}
    reader = {"Authorization": f"Bearer {READER}"}
    accepted = httpx.post(f"{server.url}/v1/jobs", json={**JOB, "job_id": "t1"}, headers=full)
    assert accepted.status_code == 202
    assert httpx.get(f"{server.url}/v1/jobs/t1", headers=reader).status_code == 200
    assert httpx.get(f"{server.url}/metrics", headers=reader).status_code == 200
    refused = httpx.post(f"{server.url}/v1/jobs", json=JOB, headers=reader)
    assert refused.status_code == 403 and _error(refused)["code"] == "forbidden"
    assert "dashboard" in str(_error(refused)["message"])
    cancel = httpx.delete(f"{server.url}/v1/jobs/t1", headers=reader)
    assert cancel.status_code == 403
    for headers in (
        {},
        {"Authorization": "Bearer wrong-token-0123456789"},
        {"Authorization": FULL},
    ):
        denied = httpx.get(f"{server.url}/v1/status", headers=headers)
        assert denied.status_code == 401 and _error(denied)["code"] == "unauthorized"
    # a refusal comes before the body is even read: no 400 or 422 to an unknown caller
    assert httpx.post(f"{server.url}/v1/jobs", content=b"{not json").status_code == 401
    assert httpx.get(f"{server.url}/healthz").status_code == 200  # probes stay open
    assert httpx.get(f"{server.url}/openapi.json").status_code == 200
    log = (server.data_dir.parent / "server.log").read_text()
    assert "refused GET /v1/status" in log and "refused POST /v1/jobs" in log
    assert FULL not in log and READER not in log and "wrong-token" not in log


def test_a_token_file_that_cannot_be_read_stops_the_server(tmp_path: Path) -> None:
    tokens = json.dumps([{"name": "t", "token_file": str(tmp_path / "missing")}])
    done = subprocess.run(
        [sys.executable, "-m", "rollserve.cli.app", "serve", "--data-dir", str(tmp_path / "d")],
        env={**os.environ, "ROLLSERVE_API_TOKENS": tokens},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode != 0
    assert "token 't': cannot read" in done.stderr and str(tmp_path / "missing") in done.stderr


def test_bodies_over_the_bound_and_big_batches_are_refused(
    server_factory: Callable[..., Server],
) -> None:
    server = server_factory(max_request_mb="0.01", max_batch_jobs="3")  # 10 KiB, 3 jobs
    server.start()
    big = {**JOB, "metadata": {"pad": "x" * 20_000}}
    answer = httpx.post(f"{server.url}/v1/jobs", json=big)
    assert answer.status_code == 413 and _error(answer)["code"] == "request_too_large"

    def chunks() -> object:  # no Content-Length: counted as it arrives
        for _ in range(20):
            yield b"x" * 1024

    streamed = httpx.post(f"{server.url}/v1/jobs", content=chunks())  # type: ignore[arg-type]
    assert streamed.status_code == 413
    batch = httpx.post(f"{server.url}/v1/jobs/batch", json={"jobs": [JOB] * 4})
    assert batch.status_code == 422 and "max_batch_jobs" in str(_error(batch)["message"])
    assert httpx.post(f"{server.url}/v1/jobs/batch", json={"jobs": [JOB] * 3}).status_code == 202


def test_every_refusal_has_the_one_shape(server_factory: Callable[..., Server]) -> None:
    server = server_factory()
    server.start()
    unparsable = httpx.post(
        f"{server.url}/v1/jobs", content=b"{nope", headers={"content-type": "application/json"}
    )
    assert unparsable.status_code == 400 and _error(unparsable)["code"] == "invalid_json"
    missing = httpx.get(f"{server.url}/v1/nothing-here")
    assert missing.status_code == 404 and _error(missing)["code"] == "not_found"
    wrong_method = httpx.request("PUT", f"{server.url}/v1/jobs/x")
    assert wrong_method.status_code == 405 and _error(wrong_method)["code"] == "method_not_allowed"
    assert wrong_method.headers["allow"] == "DELETE, GET"  # every method of the path
    batch = httpx.request("OPTIONS", f"{server.url}/v1/jobs/batch")
    assert batch.status_code == 405 and batch.headers["allow"] == "POST"  # not a job id
    for spec, field in (
        ({"url": "http://", "model": "m"}, "url"),
        ({"url": "http://h\x02:80/v1", "model": "m"}, "url"),
        ({"url": "http://h:80/v1", "model": "m", "weight": True}, "weight"),
    ):
        refused = httpx.post(f"{server.url}/v1/llm/backends", json=spec)
        assert refused.status_code == 422, refused.text
        assert field in str(_error(refused)["message"])
    for wrong in ({"timeout_s": False}, {"admission": 0}, {"admission": "yes"}):
        pause = httpx.post(f"{server.url}/v1/llm/models/m/pause", json=wrong)
        assert pause.status_code == 422 and next(iter(wrong)) in pause.text
    resume = httpx.post(f"{server.url}/v1/llm/models/m/resume", json={"policy_version": 3.0})
    assert resume.status_code == 200  # 3.0 is the integer 3


def test_the_openapi_document_declares_what_routes_answer(
    server_factory: Callable[..., Server],
) -> None:
    server = server_factory()
    server.start()
    paths = httpx.get(f"{server.url}/openapi.json").json()["paths"]
    assert {"400", "401", "403", "409", "413", "422", "429", "503"} <= set(
        paths["/v1/jobs"]["post"]["responses"]
    )
    assert "404" in paths["/v1/jobs/{job_id}"]["get"]["responses"]
    assert "404" in paths["/v1/llm/backends/{backend_id}"]["delete"]["responses"]
    assert "text/plain" in paths["/metrics"]["get"]["responses"]["200"]["content"]
    error = paths["/v1/jobs"]["post"]["responses"]["429"]["content"]["application/json"]
    assert error["schema"]["$ref"].endswith("/ErrorBody")


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl makes the test certificate")
def test_https_with_a_certificate_of_its_own(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "rollserve.cli.app", "serve", "--port", str(port),
         "--data-dir", str(tmp_path / "data"), "--plugins", "rollserve.testing.plugin",
         "--ssl-certfile", str(cert),
         "--ssl-keyfile", str(key)],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        url = f"https://127.0.0.1:{port}"
        assert wait_ready(url, 30, verify=str(cert))
        with RolloutClient(url, verify=str(cert)) as client:
            done = client.wait(client.submit(JOB).job_id, timeout=60)
        assert done.status == "completed"
        with pytest.raises(httpx.ConnectError):  # an unknown certificate is not trusted
            httpx.get(f"{url}/healthz")
        with pytest.raises(httpx.RemoteProtocolError):  # and no plain HTTP on that port
            httpx.get(f"http://127.0.0.1:{port}/healthz")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
