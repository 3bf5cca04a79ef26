"""Settings come from the environment (ROLLSERVE_*) and nowhere else."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollserve.settings import Settings


def test_environment_is_read(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ROLLSERVE_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("CI", "true")
    settings = Settings()
    assert settings.data_dir == tmp_path
    assert settings.state_dir == tmp_path / "sandboxes"
    assert settings.ci is True


def test_images_default_under_tools_dir() -> None:
    settings = Settings(tools_dir=Path("/x"))
    assert settings.image_dir == Path("/x/images")
