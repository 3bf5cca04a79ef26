"""A CPython of another version laid into an image the way Python's own container images lay
it out (``/usr/local``), copied from an interpreter installed on the host: ``pythonX.Y`` on
PATH, or a version beside the running interpreter (pyenv's ``versions`` directory). SWE-bench's
older instances need it: django 3.0's tests name themselves as Python 3.6 prints them."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from rollserve.errors import InvalidInputError

PREFIX = "/usr/local"
LIBRARY_DIR = "/usr/lib/x86_64-linux-gnu"  # on the loader's default path: no ld.so.cache needed
# Parts of the standard library that no test run needs.
_SKIPPED = ("test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "site-packages")


def image_python(rootfs: Path) -> str | None:
    """The MAJOR.MINOR of ``rootfs``'s /usr/bin/python3, None when it has none."""
    link = rootfs / "usr/bin/python3"
    if not link.is_symlink() and not link.exists():
        return None
    name = link.readlink().name if link.is_symlink() else link.name
    version = name.removeprefix("python")
    return version if version.count(".") == 1 else None


def host_interpreter(version: str) -> Path:
    """The prefix of a host CPython ``version`` (MAJOR.MINOR); InvalidInputError if none."""
    candidates: list[Path] = []
    if found := shutil.which(f"python{version}"):
        candidates.append(Path(found).resolve().parent.parent)
    versions = Path(sys.base_prefix).parent  # pyenv keeps each version beside the others
    candidates += sorted(versions.glob(f"{version}.*"), reverse=True)
    for prefix in candidates:
        binary = prefix / "bin" / f"python{version}"
        if binary.is_file() and (prefix / "lib" / f"python{version}" / "os.py").is_file():
            return prefix
    raise InvalidInputError(
        f"no CPython {version} on this machine (looked for python{version} on PATH and in "
        f"{versions}): install one (pyenv install {version}) to build this image",
        python=version,
    )


def lay_out(version: str, stage: Path) -> Path:
    """Copy the host's CPython ``version`` into ``stage`` under /usr/local, its shared
    library where the loader finds it; returns the interpreter's path inside the image."""
    source = host_interpreter(version)
    prefix = stage / PREFIX.lstrip("/")
    (prefix / "bin").mkdir(parents=True, exist_ok=True)
    shutil.copy2(source / "bin" / f"python{version}", prefix / "bin" / f"python{version}")
    (prefix / "bin" / f"python{version[0]}").symlink_to(f"python{version}")
    stdlib = f"lib/python{version}"
    shutil.copytree(
        source / stdlib,
        prefix / stdlib,
        symlinks=True,
        ignore=lambda folder, names: [
            n for n in names
            if (Path(folder) == source / stdlib and (n in _SKIPPED or n.startswith("config-")))
            or n == "__pycache__"
        ],
    )  # fmt: skip
    libraries = stage / LIBRARY_DIR.lstrip("/")
    libraries.mkdir(parents=True, exist_ok=True)
    for library in sorted((source / "lib").glob("libpython*.so*")):
        shutil.copy2(library, libraries / library.name, follow_symlinks=False)
    interpreter = f"{PREFIX}/bin/python{version}"
    _check(stage, interpreter, version)
    return Path(interpreter)


def _check(stage: Path, interpreter: str, version: str) -> None:
    """The laid-out interpreter needs only the C library beyond what was copied."""
    binary = stage / interpreter.lstrip("/")
    done = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=False)
    needed = [line.split()[0] for line in done.stdout.splitlines() if "=>" in line]
    foreign = [
        name for name in needed
        if not name.startswith(("libc.so", "libm.so", "libpthread", "libdl", "libutil", "librt",
                                "libpython"))
    ]  # fmt: skip
    if foreign:
        raise InvalidInputError(
            f"the host's CPython {version} needs {', '.join(foreign)}, which the image may lack",
            python=version,
        )
