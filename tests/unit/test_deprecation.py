"""Modules that moved keep their old names for a while: same objects, with a warning."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

MOVED = [
    ("rollserve.testing.tiny_model", "rollserve.llm.local.tiny_model", "build_tiny_model"),
    (
        "rollserve.testing.swebench_image",
        "rollserve.fixtures.swebench_image",
        "build_instance_image",
    ),
    ("rollserve.testing.oci", "rollserve.fixtures.oci", "build_image"),
    ("rollserve.testing.postgres", "rollserve.fixtures.postgres", "TempPostgres"),
    ("rollserve.testing.users", "rollserve.fixtures.users", "ensure_user"),
    ("rollserve.llm.engine", "rollserve.llm.local.engine", "LocalEngine"),
    ("rollserve.llm.server", "rollserve.llm.local.server", "create_llm_app"),
]


@pytest.mark.parametrize(("old", "new", "name"), MOVED)
def test_an_old_module_name_gives_the_same_object_with_a_warning(
    old: str, new: str, name: str
) -> None:
    with pytest.warns(DeprecationWarning, match=f"{old} is deprecated: use {new}.{name}"):
        found = getattr(importlib.import_module(old), name)
    assert found is getattr(importlib.import_module(new), name)


def test_an_old_module_name_does_not_invent_names() -> None:
    module = importlib.import_module("rollserve.testing.oci")
    with pytest.warns(DeprecationWarning, match="no_such_thing"), pytest.raises(AttributeError):
        module.no_such_thing  # noqa: B018


def test_python_m_of_an_old_name_runs_the_new_module() -> None:
    done = subprocess.run(
        [sys.executable, "-W", "default", "-m", "rollserve.testing.users"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "python -m rollserve.testing.users is deprecated" in done.stderr
    assert "usage: python -m rollserve.fixtures.users" in done.stderr


def test_names_plug_ins_import_stay_where_they_were() -> None:
    from rollserve.pipeline import stages
    from rollserve.plugins import Plugins
    from rollserve.schema.run import RunOutput
    from rollserve.tasks import base

    assert base.RunOutput is RunOutput
    assert stages.Plugins is Plugins
    with pytest.warns(DeprecationWarning, match="rollserve.node.default_plugins"):
        from rollserve.pipeline.plugins import default_plugins
    assert "math" in default_plugins().handlers
