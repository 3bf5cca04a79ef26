"""The deployment files: the Kubernetes manifest is valid against the Kubernetes schema (strict:
no unknown fields) and wires the store URL, the secret and the probes; the sbatch script is
valid bash that refuses to start without a PostgreSQL store."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.servers import ROOT

DEPLOY = ROOT / "deploy"


def _documents() -> list[dict[str, Any]]:
    text = (DEPLOY / "kubernetes" / "rollserve.yaml").read_text()
    return [doc for doc in yaml.safe_load_all(text) if doc]


def test_the_manifest_is_valid_kubernetes() -> None:
    documents = _documents()
    assert [d["kind"] for d in documents] == ["Secret", "Deployment", "Service"]
    for document in documents:
        kubernetes_validate.validate(document, "1.30.0", strict=True)


def test_the_manifest_wires_the_store_the_secret_and_the_probes() -> None:
    secret, deployment, service = _documents()
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["ROLLSERVE_STORE_URL"]["value"].startswith("postgresql://")
    for name, key in (
        ("ROLLSERVE_API_TOKEN", "api-token"),
        ("ROLLSERVE_STORE_PASSWORD", "store-password"),
    ):
        ref = env[name]["valueFrom"]["secretKeyRef"]
        assert ref["name"] == secret["metadata"]["name"] and key in secret["stringData"]
    assert env["ROLLSERVE_NODE_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["args"][0] == "serve"
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]


def test_a_broken_manifest_is_caught() -> None:
    """The validation has teeth: a misspelt field fails it."""
    deployment = _documents()[1]
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError, match="readinesProbe"):
        kubernetes_validate.validate(deployment, "1.30.0", strict=True)


def test_the_sbatch_script_needs_a_postgresql_store(tmp_path: Path) -> None:
    script = DEPLOY / "slurm" / "rollserve.sbatch"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLSERVE_")}
    missing = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert missing.returncode != 0 and "ROLLSERVE_STORE_URL" in missing.stderr
    env["ROLLSERVE_STORE_URL"] = f"sqlite://{tmp_path}/jobs.db"
    sqlite = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert sqlite.returncode == 2 and "must be a postgresql:// URL" in sqlite.stderr
