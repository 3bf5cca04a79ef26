"""Plug-ins: a module of another package adds a sandbox backend (with a spec field of its own)
and a job store without any change to rollserve, loaded from ``--plugins`` or from the
``rollserve.plugins`` entry points of installed packages."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from rollserve.errors import InvalidInputError, UnknownNameError
from rollserve.node import build_node, default_plugins
from rollserve.plugins import add_plugins
from rollserve.settings import Settings
from rollserve.storage import SqliteJobStore
from tests.integration.conftest import Server
from tests.plugins.sample import GreetingSpec


def _installed(tmp_path: Path, value: str) -> Path:
    """A directory for sys.path where a package announces plug-in ``value``."""
    site = tmp_path / "site"
    info = site / "sample_plugin-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sample-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[rollserve.plugins]\nsample = {value}\n")
    return site


def test_a_plugin_adds_a_sandbox_backend_and_a_store(tmp_path: Path) -> None:
    plugins = add_plugins(default_plugins(), ["tests.plugins.sample"], entry_points=False)
    settings = Settings(data_dir=tmp_path / "data", store_url="scratch://jobs.db")
    node = build_node(settings, plugins)
    try:
        assert isinstance(node.store, SqliteJobStore)
        assert (tmp_path / "data" / "jobs.db").exists()
        spec = node.sandboxes.spec_for("greeting", greeting="hi", network=True)
        assert isinstance(spec, GreetingSpec) and (spec.greeting, spec.network) == ("hi", True)
        with pytest.raises(UnknownNameError, match="known: apptainer, bwrap, greeting, local"):
            node.sandboxes.spec_for("docker")
    finally:
        node.store.close()


def test_installed_packages_announce_plugins_by_entry_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert "greeting" not in add_plugins(default_plugins()).sandbox_backends
    monkeypatch.syspath_prepend(str(_installed(tmp_path, "tests.plugins.sample")))
    plugins = add_plugins(default_plugins())
    assert "greeting" in plugins.sandbox_backends and "scratch" in plugins.stores
    assert "greeting" not in add_plugins(default_plugins(), entry_points=False).sandbox_backends


def test_a_plugin_that_cannot_register_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def load(*modules: str) -> object:
        return add_plugins(default_plugins(), modules, entry_points=False)

    with pytest.raises(InvalidInputError, match=r"tests\.plugins\.broken has no register"):
        load("tests.plugins.broken")
    with pytest.raises(InvalidInputError, match=r"tests\.plugins\.nowhere cannot be imported"):
        load("tests.plugins.nowhere")
    with pytest.raises(InvalidInputError, match="'greeting' is already registered"):
        load("tests.plugins.sample", "tests.plugins.sample")
    monkeypatch.syspath_prepend(str(_installed(tmp_path, "tests.plugins.nowhere")))
    with pytest.raises(InvalidInputError, match=r"entry point sample \(tests.plugins.nowhere\)"):
        add_plugins(default_plugins())


def test_a_job_runs_in_a_plugins_sandbox_on_its_store_through_the_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server_factory: Callable[..., Server]
) -> None:
    site = _installed(tmp_path, "tests.plugins.sample")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    server = server_factory(store_url="scratch://plugged.db")
    server.start()
    job: dict[str, Any] = {
        "job_id": "greeted",
        "task": {
            "task_id": "greeted",
            "kind": "echo",
            "prompt": "hello",
            "sandbox": {"backend": "greeting"},
        },
        "agent": {"name": "script", "commands": ['printf %s "$GREETING" > answer.txt']},
    }
    assert httpx.post(f"{server.url}/v1/jobs", json=job).status_code == 202
    view = httpx.get(f"{server.url}/v1/jobs/greeted", params={"wait": 60}, timeout=70).json()
    assert view["status"] == "completed", view
    assert view["result"]["reward"] == 1.0
    assert (server.data_dir / "plugged.db").exists()
    refused = httpx.post(
        f"{server.url}/v1/jobs",
        json={**job, "job_id": "x", "task": {**job["task"], "sandbox": {"backend": "docker"}}},
    )
    assert refused.status_code == 400
    assert "known: apptainer, bwrap, greeting, local" in refused.json()["error"]["message"]
