"""Harbor task directories (terminal-bench 2, SkyRL, the datasets in Harbor's registry format)
turned into ``harbor`` tasks: ``instruction.md`` is the prompt, ``task.toml``'s timeouts and
resources become the job's limits, and the image is the task's prebuilt ``docker_image`` or one
named by a template (Dockerfiles are not built here)."""

from __future__ import annotations

import json
import re
import string
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from rollserve.errors import InvalidInputError
from rollserve.schema.jobs import SandboxRef, Task
from rollserve.schema.sandbox import SandboxLimits
from rollserve.tasks.base import jsonable
from rollserve.tasks.harbor import HarborHandler

_PLACEHOLDERS = {"name", "dir"}
_SCHEMES = ("docker://", "oci-archive:", "docker-archive:", "oci:", "/")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*$", re.IGNORECASE)
_MB = {"": 1 / (1024 * 1024), "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}
BUILD_HINT = (
    "build its environment/Dockerfile and push the image (docker build -t REGISTRY/NAME "
    "environment/ && docker push REGISTRY/NAME) or save it (docker save -o DIR/NAME.tar), then "
    "name it with --image-template, e.g. 'docker://REGISTRY/{dir}:latest' or "
    "'docker-archive:/images/{dir}.tar'"
)


class DirReport(BaseModel):
    """One task directory: the task it became, or why it could not be used."""

    dir: str
    task_id: str | None = None
    valid: bool = False
    image: str | None = None
    reason: str | None = None
    notes: list[str] = Field(default_factory=list)


def task_dirs(paths: list[Path]) -> list[Path]:
    """Each path that is a task directory (it holds task.toml), and the task directories
    directly inside each one that is not (a data set's directory)."""
    found: list[Path] = []
    for path in paths:
        if not path.is_dir():
            raise InvalidInputError(f"{path} is not a directory", path=str(path))
        if (path / "task.toml").is_file():
            found.append(path.resolve())
            continue
        inside = sorted(p.resolve() for p in path.iterdir() if (p / "task.toml").is_file())
        if not inside:
            raise InvalidInputError(
                f"{path} holds no task.toml, nor do the directories in it", path=str(path)
            )
        found += inside
    return found


def harbor_task(folder: Path, template: str | None) -> tuple[Task, list[str]]:
    """The task of one directory and notes on what of task.toml it does not enforce;
    ValueError naming what is wrong."""
    try:
        config = tomllib.loads((folder / "task.toml").read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"task.toml is not TOML: {exc}") from None
    if config.get("steps"):
        raise ValueError("multi-step tasks ([[steps]]) are not supported")
    instruction = folder / "instruction.md"
    if not instruction.is_file():
        raise ValueError("instruction.md is missing")
    if not (folder / "tests" / "test.sh").is_file():
        raise ValueError("tests/test.sh is missing")
    task_table, environment = _table(config, "task"), _table(config, "environment")
    verifier, agent = _table(config, "verifier"), _table(config, "agent")
    name = str(task_table.get("name") or folder.name)
    notes: list[str] = []
    image = _image(environment, name, folder.name, template)
    limits: dict[str, Any] = {}
    if (memory := _mb(environment, "memory_mb", "memory")) is not None:
        limits["memory_mb"] = memory
    if (storage := _mb(environment, "storage_mb", "storage")) is not None:
        limits["disk_mb"] = storage
    if environment.get("gpus"):
        notes.append(f"asks for {environment['gpus']} GPUs, which rollserve's sandboxes lack")
    if environment.get("cpus") is not None:
        notes.append(f"cpus = {environment['cpus']} is not enforced (no CPU limit)")
    # Off unless the task turns it on (Harbor's own default is on; rollserve's is off).
    network = bool(environment.get("allow_internet", False)) or environment.get(
        "network_mode", "no-network"
    ) not in ("no-network", "none")
    fields: dict[str, Any] = {
        "task_dir": str(folder),
        "verifier_timeout_s": float(verifier.get("timeout_sec", 600.0)),
        "verifier_env": _env(verifier),
        "solution_env": _env(_table(config, "solution")),
        "env": _env(environment),
    }
    if agent.get("timeout_sec") is not None:
        fields["agent_timeout_s"] = float(agent["timeout_sec"])
    if environment.get("cpus") is not None:
        fields["cpus"] = float(environment["cpus"])
    metadata = {
        "source": "harbor",
        "task_dir": str(folder),
        **{k: v for k, v in _table(config, "metadata").items() if jsonable(v)},
    }
    task = Task(
        task_id=name,
        kind="harbor",
        prompt=instruction.read_text(),
        sandbox=SandboxRef(
            image=image, network=network, limits=SandboxLimits(**limits) if limits else None
        ),
        metadata=metadata,
        **fields,
    )
    return task, notes


def import_dirs(paths: list[Path], out: Path, template: str | None = None) -> list[DirReport]:
    """Write ``out/tasks.jsonl`` (one task per usable directory) and ``out/report.json``."""
    if template is not None:
        check_template(template)
    handler = HarborHandler()
    reports: list[DirReport] = []
    tasks: list[Task] = []
    seen: set[str] = set()
    for folder in task_dirs(paths):
        report = DirReport(dir=str(folder))
        reports.append(report)
        try:
            task, report.notes = harbor_task(folder, template)
            handler.validate(task)
        except ValueError as exc:
            report.reason = str(exc)
            continue
        except InvalidInputError as exc:
            report.reason = exc.message
            continue
        report.task_id = task.task_id
        if task.task_id in seen:
            report.reason = f"task name {task.task_id!r} repeats an earlier directory's"
            continue
        seen.add(task.task_id)
        report.valid, report.image = True, task.sandbox.image if task.sandbox else None
        tasks.append(task)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tasks.jsonl").write_text("".join(t.model_dump_json() + "\n" for t in tasks))
    body = {"image_template": template, "tasks": [r.model_dump(mode="json") for r in reports]}
    (out / "report.json").write_text(json.dumps(body, indent=2) + "\n")
    return reports


def check_template(template: str) -> None:
    """The image template names only known placeholders."""
    names = {n for _, n, _, _ in string.Formatter().parse(template) if n is not None}
    if names - _PLACEHOLDERS:
        raise InvalidInputError(
            f"image template {template!r} names unknown placeholders "
            f"{sorted(names - _PLACEHOLDERS)} (known: {', '.join(sorted(_PLACEHOLDERS))})",
            template=template,
        )


def _image(environment: dict[str, Any], name: str, folder: str, template: str | None) -> str:
    if template is not None:
        return template.format(name=name, dir=folder)
    image = environment.get("docker_image")
    if isinstance(image, str) and image.strip():
        return image if image.startswith(_SCHEMES) else f"docker://{image}"
    raise ValueError(f"task.toml names no prebuilt image (docker_image): {BUILD_HINT}")


def _table(config: dict[str, Any], name: str) -> dict[str, Any]:
    value = config.get(name, {})
    if not isinstance(value, dict):
        raise ValueError(f"[{name}] in task.toml is not a table")
    return value


def _env(table: dict[str, Any]) -> dict[str, str]:
    env = table.get("env", {})
    if not isinstance(env, dict):
        raise ValueError("an env in task.toml is not a table")
    return {str(k): str(v) for k, v in env.items()}


def _mb(environment: dict[str, Any], plain: str, sized: str) -> int | None:
    """A size in MB from ``memory_mb = 2048`` or ``memory = "2G"``."""
    if environment.get(plain) is not None:
        return int(environment[plain])
    value = environment.get(sized)
    if value is None:
        return None
    match = _SIZE.match(str(value))
    if match is None:
        raise ValueError(f"[environment] {sized} = {value!r} is not a size like '4G'")
    return max(1, round(float(match.group(1)) * _MB[match.group(2).upper()]))
