"""``deploy/slurm/rollserve.sbatch`` on a real (one-machine) Slurm cluster with a PostgreSQL
store: sbatch starts a node per host that announces its URL and runs jobs; scancel stops it
cleanly — no process or sandbox left, the job it was running handed back to the store at once
(leases of 10 minutes: only the hand-over frees it in time) and finished by another node."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from rollserve.storage.postgres import PostgresJobStore
from rollserve.testing.scripted import ScriptedLLMServer
from tests.cluster import TempSlurm, slurm_missing
from tests.integration.conftest import Server
from tests.missing import missing
from tests.servers import ROOT, free_port

SBATCH = ROOT / "deploy" / "slurm" / "rollserve.sbatch"


@pytest.fixture
def slurm() -> Iterator[TempSlurm]:
    absent = slurm_missing()
    if absent:
        missing(f"Slurm is not installed (missing {absent}; make setup installs it)")
    cluster = TempSlurm().start()
    yield cluster
    cluster.close()


def _until(check: Callable[[], bool], timeout: float = 60, what: str = "") -> None:
    end = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < end, f"timed out: {what}"
        time.sleep(0.2)


def _rollserve_processes(data_root: Path) -> list[str]:
    found = subprocess.run(["pgrep", "-af", str(data_root)], capture_output=True, text=True)
    return [line for line in found.stdout.splitlines() if "pgrep" not in line]


def test_sbatch_starts_a_node_and_scancel_hands_its_jobs_over(
    slurm: TempSlurm, pg_url: str, tmp_path: Path, server_factory: Callable[..., Server]
) -> None:
    endpoints = tmp_path / "endpoints"
    data_root = tmp_path / "nodes"
    env = {
        **slurm.env,
        "ROLLSERVE": f"{sys.executable} -m rollserve.cli.app",
        "ROLLSERVE_STORE_URL": pg_url,
        "ROLLSERVE_PORT": str(free_port()),
        "ROLLSERVE_DATA_ROOT": str(data_root),
        "ROLLSERVE_ENDPOINTS": str(endpoints),
        "ROLLSERVE_LEASE_S": "600",
    }
    submitted = subprocess.run(
        ["sbatch", "--parsable", f"--output={tmp_path}/slurm-%j.out", str(SBATCH)],
        env=env, cwd=tmp_path, capture_output=True, text=True, check=True,
    )  # fmt: skip
    job = submitted.stdout.strip().split(";")[0]
    _until(
        lambda: endpoints.exists() and endpoints.read_text().strip() != "",
        what=f"the node's announcement\n{slurm.logs()}",
    )
    [url] = endpoints.read_text().split()
    assert url.endswith(f":{env['ROLLSERVE_PORT']}")
    node = url.replace(url.split("//")[1].split(":")[0], "127.0.0.1")
    status = httpx.get(f"{node}/v1/status").json()
    assert [n["node_id"] for n in status["nodes"]] == [slurm.host]

    math = {"task_id": "m", "kind": "math", "prompt": "What is 6*7?", "answer": "42"}
    quick = {"job_id": "quick", "task": math, "agent": {"name": "submit", "submission": "42"}}
    assert httpx.post(f"{node}/v1/jobs", json=quick).status_code == 202
    done = httpx.get(f"{node}/v1/jobs/quick", params={"wait": 60}, timeout=70).json()
    assert done["status"] == "completed" and done["result"]["reward"] == 1.0

    llm = ScriptedLLMServer([{"content": "thinking"}] * 4, delay_s=600).start()
    try:
        register_backend_at(node, llm.url)
        slow = {"job_id": "slow", "task": math, "model": "scripted", "agent": {"name": "tool"}}
        httpx.post(f"{node}/v1/jobs", json=slow)
        _until(lambda: len(llm.requests) == 1, what="the slow job's model call")
        subprocess.run(["scancel", job], env=slurm.env, check=True)
        _until(lambda: not _rollserve_processes(data_root), timeout=60, what="the node's exit")
        store = PostgresJobStore(pg_url)
        try:
            record = store.get("slow")
            assert record is not None and record.status.value == "queued"  # handed back now
            assert record.lease_owner is None and store.nodes() == []
        finally:
            store.close()
        sandboxes = list(data_root.glob("*/sandboxes/*"))
        assert sandboxes == []

        other = server_factory(store_url=pg_url)
        other.start()  # another node takes the job over
        _until(lambda: len(llm.requests) == 2, what="the job running on the other node")
        assert httpx.get(f"{other.url}/v1/jobs/slow").json()["status"] == "running"

    finally:
        llm.kill()  # its answers are still on their way: no graceful stop


def register_backend_at(url: str, llm_url: str) -> None:
    spec = {"id": "s", "kind": "openai", "url": llm_url, "model": "scripted"}
    assert httpx.post(f"{url}/v1/llm/backends", json=spec, timeout=60).status_code == 201
