"""docs/architecture.md is the code's: every module and path it names exists, and the imports
point the way it says (layers, the client and schema on their own, no cycles)."""

from __future__ import annotations

import ast
import functools
import importlib
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
SRC = ROOT / "src"
DOC = ROOT / "docs" / "architecture.md"

# docs/architecture.md's layers, top first (its table); a package may import its own layer's
# and those below.
LAYERS = [
    ["cli", "server"],
    ["node", "validation"],
    ["pipeline"],
    ["plugins"],
    ["agents", "gateway"],
    ["tasks", "shell"],
    ["sandbox", "llm"],
    ["storage", "images"],
    ["schema", "errors", "settings", "registry", "ports", "trees", "deprecation", "__init__"],
]
SIDE = {"demo", "learn", "bench", "testing", "fixtures", "llm.local"}
CLIENT = "client"


def _package(module: str) -> str:
    parts = module.split(".")
    if parts[1:3] == ["llm", "local"]:
        return "llm.local"
    return parts[1] if len(parts) > 1 else "__init__"


@functools.cache
def _modules() -> dict[str, Path]:
    found = {}
    for path in (SRC / "rollserve").rglob("*.py"):
        name = ".".join(path.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__")
        found[name] = path
    return found


def _imports(path: Path, *, top_only: bool) -> Iterator[str]:
    """The rollserve modules ``path`` imports (at module level only, with ``top_only``):
    ``from package import module`` is the module's import, not the package's."""
    modules = _modules()
    nodes = list(ast.parse(path.read_text()).body)
    while nodes:
        node = nodes.pop()
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rollserve"):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                yield full if full in modules else node.module
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.startswith("rollserve"))
        elif isinstance(node, ast.If | ast.Try):
            nodes += [*node.body, *getattr(node, "orelse", [])]
        elif not top_only:
            nodes += list(ast.iter_child_nodes(node))


def _rank(package: str) -> int | None:
    for rank, layer in enumerate(LAYERS):
        if package in layer:
            return rank
    return None


def _resolves(name: str) -> bool:
    """``name`` is a module of rollserve, or a module's attribute (a class's, a method)."""
    modules = _modules()
    module, rest = name, []
    while module not in modules:
        if "." not in module:
            return False
        module, _, last = module.rpartition(".")
        rest.insert(0, last)
    if not rest:
        return True
    found: object = importlib.import_module(module)
    for part in rest:
        if not hasattr(found, part):
            return False
        found = getattr(found, part)
    return True


def test_every_module_and_path_the_document_names_exists() -> None:
    text = DOC.read_text()
    names = set(re.findall(r"`(rollserve(?:\.\w+)+)", text))
    assert len(names) > 50
    unverifiable = {"rollserve.client.verl"}  # it imports veRL, absent from the test venv
    groups = {"rollserve.harnesses"}  # entry-point groups, as the code names them
    assert groups == {importlib.import_module("rollserve.harness.__main__").GROUP}
    assert importlib.import_module("rollserve.plugins").ENTRY_POINTS == "rollserve.plugins"
    assert [n for n in sorted(names - unverifiable - groups) if not _resolves(n)] == []
    assert all(n in _modules() for n in unverifiable)
    paths = set(re.findall(r"`((?:tests|src|docs|deploy|examples)/[\w./-]+)`", text))
    assert [p for p in sorted(paths) if not (ROOT / p).exists()] == []


def test_imports_point_down_the_layers() -> None:
    wrong = []
    for name, path in _modules().items():
        here = _package(name)
        mine = _rank(here)
        for target in _imports(path, top_only=False):
            there = _package(target)
            if there == here or target not in _modules():
                continue
            if there in SIDE and here not in SIDE and here != "cli":
                wrong.append(f"{name} imports the side application {target}")
            elif there == CLIENT and mine is not None and mine > 0:
                wrong.append(f"{name} imports the client {target}")
            elif mine is not None and (theirs := _rank(there)) is not None and theirs < mine:
                wrong.append(f"{name} imports {target}, a layer above it")
    assert wrong == []


@pytest.mark.parametrize(
    ("package", "allowed"),
    [("client", {"client", "schema", "errors"}), ("schema", {"schema", "errors"})],
)
def test_the_client_and_the_schema_stand_alone(package: str, allowed: set[str]) -> None:
    wrong = [
        f"{name} imports {target}"
        for name, path in _modules().items()
        if _package(name) == package
        for target in _imports(path, top_only=False)
        if target in _modules() and _package(target) not in allowed
    ]
    assert wrong == []


def test_no_import_cycles() -> None:
    modules = _modules()
    graph = {
        name: {t for t in _imports(path, top_only=True) if t in modules and t != name}
        for name, path in modules.items()
    }
    cycles: list[list[str]] = []
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    assert cycles == []
