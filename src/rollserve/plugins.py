"""The plug-in set: every kind of plug-in a node knows, each a registry by name.

A plug-in module has a ``register(plugins)`` function that adds to the set; ``rollserve serve``
loads the modules given with ``--plugins`` and those that installed packages announce in the
``rollserve.plugins`` entry-point group. The node is then built from the set
(:func:`rollserve.node.build_node`): nothing in the core branches on a plug-in's name."""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import cast

from rollserve.agents.base import Agent
from rollserve.errors import InvalidInputError
from rollserve.images.base import ImageSource
from rollserve.llm.kinds import KindFactory
from rollserve.llm.toolcalls import ToolCallParser
from rollserve.registry import Registry
from rollserve.sandbox.base import SandboxBackend
from rollserve.settings import Settings
from rollserve.storage.base import Store
from rollserve.tasks.base import TaskHandler

ENTRY_POINTS = "rollserve.plugins"
"""The entry-point group whose entries name a plug-in module (or its ``register``)."""

SandboxBackendFactory = Callable[[Settings], SandboxBackend]
"""Makes a node's sandbox backend (a backend class taking the settings is one)."""

ImageSourceFactory = Callable[[Settings], ImageSource]
"""Makes a node's image source; sources are asked in registration order to claim a reference."""

StoreFactory = Callable[[str, Settings], Store]
"""Opens the job store at a ``store_url`` of the scheme it is registered under."""

LLMKind = KindFactory
"""Makes an inference backend of one kind (``BackendSpec.kind``) for a registration."""


@dataclass
class Plugins:
    """Every plug-in a node knows, by name."""

    handlers: Registry[TaskHandler]  # task kinds (``task.kind``)
    agents: Registry[Agent]  # ``agent.name``
    parsers: Registry[ToolCallParser]  # tool-call parsers
    sandbox_backends: Registry[SandboxBackendFactory]  # ``task.sandbox.backend``
    image_sources: Registry[ImageSourceFactory]
    stores: Registry[StoreFactory]  # by ``store_url`` scheme
    llm_kinds: Registry[LLMKind]  # inference backend kinds


Register = Callable[[Plugins], None]
"""What a plug-in module provides: adds its plug-ins to the set."""


def add_plugins(
    plugins: Plugins, modules: Iterable[str] = (), *, entry_points: bool = True
) -> Plugins:
    """``plugins`` with those of every module's ``register(plugins)`` added: first the
    installed packages' (the ``rollserve.plugins`` entry points, by name), then ``modules``
    in order. A plug-in that fails to load is an InvalidInputError naming it."""
    found: list[tuple[str, Register]] = []
    if entry_points:
        for entry in sorted(importlib.metadata.entry_points(group=ENTRY_POINTS), key=_name):
            found.append((f"entry point {entry.name} ({entry.value})", _loaded(entry)))
    for name in modules:
        found.append((f"plug-in module {name}", _register_of(name, _imported(name))))
    for what, register in found:
        try:
            register(plugins)
        except ValueError as exc:  # a name registered twice
            raise InvalidInputError(f"{what}: {exc}") from exc
    return plugins


def _name(entry: importlib.metadata.EntryPoint) -> str:
    return entry.name


def _loaded(entry: importlib.metadata.EntryPoint) -> Register:
    """An entry point names a plug-in module, or its register function."""
    try:
        target = entry.load()
    except Exception as exc:  # whatever the package raises on import: say which one it is
        raise InvalidInputError(
            f"plug-in entry point {entry.name} ({entry.value}) does not load: {exc}"
        ) from exc
    if inspect.ismodule(target):
        return _register_of(entry.value, target)
    if not callable(target):
        raise InvalidInputError(
            f"plug-in entry point {entry.name} ({entry.value}) is not a module or a function"
        )
    return cast(Register, target)


def _imported(name: str) -> object:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise InvalidInputError(f"plug-in module {name} cannot be imported: {exc}") from exc


def _register_of(name: str, module: object) -> Register:
    register = getattr(module, "register", None)
    if not callable(register):
        raise InvalidInputError(f"plug-in module {name} has no register(plugins) function")
    return cast(Register, register)
