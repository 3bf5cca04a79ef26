"""SWE-bench instance images built offline, without Docker: a row's repository made from its
project's PyPI sdist at /testbed, and a Python environment laid out as conda's
``/opt/miniconda3/envs/testbed``, so that the row's own harness eval script runs unchanged.
The environment uses the base image's Python, or, when the recipe asks for another version,
one copied in from the host (``python_layer``)."""

from __future__ import annotations

import configparser
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rollserve.errors import InvalidInputError, RollserveError
from rollserve.testing import python_layer
from rollserve.testing.oci import LayerSpec, build_image

TESTBED = "/testbed"
CONDA_ROOT = "/opt/miniconda3"
ENV_NAME = "testbed"
ENV_PREFIX = f"{CONDA_ROOT}/envs/{ENV_NAME}"
IMAGE_PATH = (
    f"{ENV_PREFIX}/bin:{CONDA_ROOT}/bin:"
    + "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)
# Wheels for the image's glibc (Debian 12: 2.36); pip takes any of these tags.
PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_28_x86_64", "manylinux_2_34_x86_64")

# Sourced by the eval script: `conda activate NAME` puts that environment first on PATH.
ACTIVATE = """\
# rollserve: a stand-in for conda's activate script (no conda in this image). It defines a
# `conda` shell function that knows `activate NAME` and `deactivate`, and nothing else.
conda() {
    case "${1:-}" in
    activate)
        _conda_name="${2:-base}"
        if [ "$_conda_name" = base ]; then
            _conda_prefix=/opt/miniconda3
        else
            _conda_prefix="/opt/miniconda3/envs/$_conda_name"
        fi
        if [ ! -d "$_conda_prefix" ]; then
            echo "EnvironmentNameNotFound: Could not find conda environment: $_conda_name" >&2
            return 1
        fi
        conda deactivate
        PATH="$_conda_prefix/bin:$(_conda_drop "$_conda_prefix/bin")"
        CONDA_DEFAULT_ENV="$_conda_name"
        CONDA_PREFIX="$_conda_prefix"
        export PATH CONDA_DEFAULT_ENV CONDA_PREFIX
        ;;
    deactivate)
        if [ -n "${CONDA_PREFIX:-}" ]; then
            PATH=$(_conda_drop "$CONDA_PREFIX/bin")
            export PATH
            unset CONDA_DEFAULT_ENV CONDA_PREFIX
        fi
        ;;
    *)
        echo "conda: this image's conda knows only 'activate NAME' and 'deactivate'" >&2
        return 1
        ;;
    esac
}
_conda_drop() {  # PATH without the directory $1
    printf '%s' ":$PATH:" | sed -e "s#:$1:#:#g" -e "s#:$1:#:#g" -e 's#^:##' -e 's#:$##'
}
if [ $# -gt 0 ]; then
    conda activate "$1"
fi
"""

CONSOLE_SCRIPT = """\
#!{python}
import re
import sys
from {module} import {name}
if __name__ == "__main__":
    sys.argv[0] = re.sub(r"(-script\\.pyw|\\.exe)?$", "", sys.argv[0])
    sys.exit({call}())
"""


class Recipe(BaseModel):
    """How one row's image is made: the sdist that becomes /testbed, and its environment."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sdist: str = Field(description="the project's sdist as NAME==VERSION")
    sdist_sha256: str = Field(description="its expected sha256")
    wheels: list[str] = Field(
        default_factory=list, description="pinned NAME==VERSION, installed without dependencies"
    )
    python: str = Field("3.11", description="the image's Python, MAJOR.MINOR")
    files: dict[str, str] = Field(
        default_factory=dict, description="files (path: text) committed with the sdist"
    )
    editable_path: str = Field(".", description="what `pip install -e .` puts on sys.path")

    @property
    def name(self) -> str:
        """The project's name."""
        return self.sdist.partition("==")[0]

    @property
    def version(self) -> str:
        """The project's version."""
        return self.sdist.partition("==")[2]


def load_recipe(path: Path, instance_id: str) -> Recipe:
    """The recipe of ``instance_id`` in a JSON file mapping instance ids to recipes."""
    recipes = json.loads(path.read_text())
    if instance_id not in recipes:
        raise InvalidInputError(
            f"no image recipe for {instance_id} in {path}; known: {', '.join(sorted(recipes))}",
            instance_id=instance_id,
        )
    return Recipe.model_validate(recipes[instance_id])


def build_instance_image(
    row: dict[str, Any], out: Path, *, base_rootfs: Path, work: Path, recipe: Recipe
) -> str:
    """Write ``row``'s instance image to ``out`` (an OCI archive); returns its reference.

    ``base_rootfs`` is a root filesystem with bash, git and a /usr/bin/python3; when that is
    not Python ``recipe.python``, the host's is copied in. ``work`` keeps the downloads (reused
    by later builds) and the staged tree.
    """
    work.mkdir(parents=True, exist_ok=True)
    sdist = download_sdist(recipe, work / "downloads")
    stage = work / "root"
    if stage.exists():
        shutil.rmtree(stage)
    head = make_repository(sdist, stage / TESTBED.lstrip("/"), recipe)
    if head != row["base_commit"]:
        raise InvalidInputError(
            f"{row['instance_id']}: the repository made from {sdist.name} has HEAD {head}, "
            f"but the row's base_commit is {row['base_commit']}: the row was made from "
            "another tree (sdist, recipe files) or another commit recipe",
            instance_id=row["instance_id"],
            head=head,
            base_commit=row["base_commit"],
        )
    interpreter = "/usr/bin/python3"
    if python_layer.image_python(base_rootfs) != recipe.python:
        interpreter = str(python_layer.lay_out(recipe.python, stage))
    make_environment(
        recipe, stage / ENV_PREFIX.lstrip("/"), stage / TESTBED.lstrip("/"), interpreter
    )
    activate = stage / CONDA_ROOT.lstrip("/") / "bin" / "activate"
    activate.parent.mkdir(parents=True)
    activate.write_text(ACTIVATE)
    activate.chmod(0o755)
    for folder in (stage, stage / "opt"):
        folder.chmod(0o755)
    return build_image(
        out,
        [LayerSpec(base_rootfs), LayerSpec(stage, gzip=True)],
        env={"PATH": IMAGE_PATH},
        workdir=TESTBED,
    )


def download_sdist(recipe: Recipe, downloads: Path) -> Path:
    """The recipe's sdist, downloaded with pip (kept in ``downloads``), its sha256 checked."""
    folder = downloads / f"sdist-{recipe.name}-{recipe.version}"
    if not folder.is_dir() or not any(folder.iterdir()):
        folder.mkdir(parents=True, exist_ok=True)
        _pip("download", "--no-deps", "--no-binary=:all:", "-d", str(folder), recipe.sdist)
    [path] = list(folder.iterdir())
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != recipe.sdist_sha256:
        raise InvalidInputError(
            f"{path.name} has sha256 {digest}, the recipe expects {recipe.sdist_sha256}",
            sdist=recipe.sdist,
        )
    return path


def make_repository(sdist: Path, testbed: Path, recipe: Recipe) -> str:
    """Unpack ``sdist`` at ``testbed`` as a git repository; returns its HEAD.

    The history is fixed (author, dates): the sdist's tree with ``recipe.files`` as the root
    commit, then an empty commit, so that `git show` prints a few lines, not the whole tree.
    """
    testbed.parent.mkdir(parents=True, exist_ok=True)
    with (
        tempfile.TemporaryDirectory(dir=testbed.parent) as scratch,
        tarfile.open(sdist) as archive,
    ):
        archive.extractall(scratch, filter="data")
        [top] = list(Path(scratch).iterdir())
        shutil.move(top, testbed)
    testbed.chmod(0o755)
    for relative, text in recipe.files.items():
        target = testbed / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        target.chmod(0o755 if text.startswith("#!") else 0o644)
    _git(testbed, "init", "-q", "-b", "main")
    _git(testbed, "add", "-A", "-f")
    _git(testbed, "commit", "-q", "-m", f"{sdist.name}, unpacked")
    _git(testbed, "commit", "-q", "--allow-empty", "-m", "SWE-bench base commit")
    _git(testbed, "gc", "-q")
    return _git(testbed, "rev-parse", "HEAD").strip()


def make_environment(
    recipe: Recipe, env: Path, testbed: Path, interpreter: str = "/usr/bin/python3"
) -> None:
    """Lay out a virtual environment of the image's ``interpreter`` at ``env``: the recipe's
    wheels, the repository installed as by `pip install -e .`, and their console scripts."""
    python = f"python{recipe.python}"
    site = env / "lib" / python / "site-packages"
    site.mkdir(parents=True)
    (env / "pyvenv.cfg").write_text(
        f"home = {os.path.dirname(interpreter)}\ninclude-system-site-packages = false\n"
        f"version = {recipe.python}\n"
    )
    bin_dir = env / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(interpreter)
    for alias in ("python3", python):
        (bin_dir / alias).symlink_to("python")
    if recipe.wheels:
        platforms = [f"--platform={platform}" for platform in PLATFORMS]
        major, minor = (int(part) for part in recipe.python.split("."))
        abi = f"cp{major}{minor}" + ("m" if (major, minor) < (3, 8) else "")  # pymalloc tag
        _pip(
            "install", "--no-deps", "--only-binary=:all:", "--no-compile", "--target", str(site),
            f"--python-version={recipe.python}", "--implementation=cp", f"--abi={abi}",
            *platforms, *recipe.wheels,
        )  # fmt: skip
    shutil.rmtree(site / "bin", ignore_errors=True)  # pip's scripts, for the host's python
    _install_editable(recipe, site, testbed)
    for dist_info in sorted(site.glob("*.dist-info")):
        _write_console_scripts(dist_info / "entry_points.txt", bin_dir)
    if sys.version_info[:2] == tuple(int(part) for part in recipe.python.split(".")):
        # Byte-compiled here: the image's site-packages is read-only in a sandbox.
        _run([sys.executable, "-m", "compileall", "-qq", "-j0", "--invalidation-mode",
              "unchecked-hash", str(site)], check=False)  # fmt: skip


def _install_editable(recipe: Recipe, site: Path, testbed: Path) -> None:
    """What `pip install -e .` leaves in site-packages: a .pth file naming the repository,
    and the project's dist-info (metadata and entry points from the sdist's egg-info)."""
    name, version = recipe.name, recipe.version
    path = os.path.normpath(f"{TESTBED}/{recipe.editable_path}")
    (site / f"__editable__.{name}-{version}.pth").write_text(path + "\n")
    dist_info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text((testbed / "PKG-INFO").read_text())
    (dist_info / "INSTALLER").write_text("rollserve\n")
    url = {"url": f"file://{TESTBED}", "dir_info": {"editable": True}}
    (dist_info / "direct_url.json").write_text(json.dumps(url))
    egg_infos = [*sorted(testbed.glob("*.egg-info")), *sorted(testbed.glob("src/*.egg-info"))]
    if egg_infos and (egg_infos[0] / "entry_points.txt").is_file():
        shutil.copy(egg_infos[0] / "entry_points.txt", dist_info / "entry_points.txt")
    files = sorted(p.name for p in dist_info.iterdir())
    (dist_info / "RECORD").write_text("".join(f"{dist_info.name}/{f},,\n" for f in files))


def _write_console_scripts(entry_points: Path, bin_dir: Path) -> None:
    """The ``console_scripts`` of one distribution, as scripts run by the environment."""
    if not entry_points.is_file():
        return
    parser = configparser.ConfigParser(delimiters=("=",), interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(entry_points.read_text())
    if not parser.has_section("console_scripts"):
        return
    for script, target in parser.items("console_scripts"):
        module, _, call = target.partition("[")[0].strip().partition(":")
        text = CONSOLE_SCRIPT.format(
            python=f"{ENV_PREFIX}/bin/python", module=module, name=call.split(".")[0], call=call
        )
        path = bin_dir / script
        path.write_text(text)
        path.chmod(0o755)


def _git(repository: Path, *args: str) -> str:
    """Run git in ``repository`` with a fixed identity and date and no user configuration."""
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    for who in ("AUTHOR", "COMMITTER"):
        env[f"GIT_{who}_NAME"] = "SWE-bench sdist"
        env[f"GIT_{who}_EMAIL"] = "sdist@rollserve.invalid"
        env[f"GIT_{who}_DATE"] = "2000-01-01T00:00:00Z"
    # No automatic gc: on a large tree it detaches and races the explicit one.
    return _run(["git", "-c", "gc.auto=0", "-C", str(repository), *args], env=env)


def _pip(*args: str) -> str:
    """Run the host's pip (this interpreter's) quietly."""
    return _run([sys.executable, "-m", "pip", "-q", "--disable-pip-version-check", *args])


def _run(argv: list[str], *, env: dict[str, str] | None = None, check: bool = True) -> str:
    """Run ``argv``; its stdout, or an error carrying the end of its output."""
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        tail = (done.stdout + done.stderr)[-4000:]
        raise RollserveError(f"{argv[0]} {argv[1:3]} failed ({done.returncode}):\n{tail}")
    return done.stdout
