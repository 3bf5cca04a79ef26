"""Settings come from the environment (ROLLSERVE_*) and nowhere else."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollserve.errors import InvalidInputError
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


def test_flags_beat_environment_beats_config_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = tmp_path / "rollserve.toml"
    config.write_text('run_workers = 3\neval_workers = 2\ndata_dir = "/from/file"\n')
    monkeypatch.setenv("ROLLSERVE_EVAL_WORKERS", "5")
    monkeypatch.setenv("ROLLSERVE_DATA_DIR", "/from/env")
    settings = Settings.load(config, data_dir=tmp_path / "flag", init_workers=None)
    assert settings.run_workers == 3  # the file
    assert settings.eval_workers == 5  # the environment over the file
    assert settings.data_dir == tmp_path / "flag"  # the flag over both
    assert settings.init_workers == 8  # a flag not given leaves the default
    assert type(settings) is Settings


def test_yaml_config_and_its_errors(tmp_path: Path) -> None:
    good = tmp_path / "rollserve.yaml"
    good.write_text("eval_timeout_s: 60\napi_token: t\n")
    settings = Settings.load(good)
    assert settings.eval_timeout_s == 60 and settings.api_token == "t"
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("eval_workerz: 2\n")
    with pytest.raises(InvalidInputError, match="eval_workerz"):
        Settings.load(unknown)
    invalid = tmp_path / "invalid.toml"
    invalid.write_text("run_workers = 0\n")
    with pytest.raises(InvalidInputError, match="run_workers"):
        Settings.load(invalid)
    broken = tmp_path / "broken.toml"
    broken.write_text("run_workers = \n")
    with pytest.raises(InvalidInputError, match="cannot read settings file"):
        Settings.load(broken)
    with pytest.raises(InvalidInputError, match="cannot read settings file"):
        Settings.load(tmp_path / "absent.toml")
