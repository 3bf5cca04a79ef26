"""Modules that moved: their old names keep working for a while, with a DeprecationWarning that
says where the thing is now."""

from __future__ import annotations

import importlib
import runpy
import warnings
from collections.abc import Callable
from typing import Any


def moved(old: str, new: str) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``old``: every name is ``new``'s, with a warning."""

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        warnings.warn(f"{old} is deprecated: use {new}.{name}", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(new), name)

    return __getattr__


def run_moved(old: str, new: str) -> None:
    """``python -m old``: runs ``new`` as the main module, with a warning."""
    warnings.warn(
        f"python -m {old} is deprecated: use python -m {new}", DeprecationWarning, stacklevel=2
    )
    runpy.run_module(new, run_name="__main__", alter_sys=True)
