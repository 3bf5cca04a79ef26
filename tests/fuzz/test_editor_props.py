"""Properties of the ``editor`` tool's path handling: whatever path a model writes (``..``,
symlinks leading out, absolute paths, odd unicode, NUL bytes), the editor never reads or writes
outside the workspace, and a path it refuses is named in its error.

The sandbox is the ``local`` backend, which has no isolation of its own: everything outside the
workspace is the host's, so the editor's own checks are all that stands in the way."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rollserve.agents.editor import Editor
from rollserve.sandbox import SandboxInstance, SandboxManager, spec_for
from tests.conformance.conftest import require

SECRET = "TOP-SECRET-3f9a"


def snapshot(root: Path) -> dict[str, bytes | str]:
    """Every entry under ``root``: file contents, link targets, directories."""
    entries: dict[str, bytes | str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            key = str(path.relative_to(root))
            if path.is_symlink():
                entries[key] = "-> " + os.readlink(path)
            elif path.is_file():
                entries[key] = path.read_bytes()
            else:
                entries[key] = "dir"
    return entries


class World:
    """A workspace with symlinks leading out to a directory of secrets beside it."""

    def __init__(self, box: SandboxInstance, outside: Path) -> None:
        self.box = box
        self.workspace = Path(box.guest_workspace)
        self.outside = outside
        self.editor = Editor(box)
        self.before = snapshot(outside)
        self.around = around(self.workspace.parent)


def around(sandbox_dir: Path) -> dict[str, dict[str, bytes | str]]:
    """What the sandbox's directory holds beside the workspace (its own records left out)."""
    names = set(os.listdir(sandbox_dir)) - {"workspace", "procs", "record.json"}
    return {name: snapshot(sandbox_dir / name) for name in names}


@pytest.fixture
async def world(manager: SandboxManager, tmp_path: Path) -> AsyncIterator[World]:
    require(manager, "local")
    outside = tmp_path / "outside"
    (outside / "dir").mkdir(parents=True)
    (outside / "secret.txt").write_text(f"{SECRET}\nline two\n")
    (outside / "dir" / "nested.txt").write_text(f"{SECRET} nested\n")
    box = await manager.start(spec_for("local"))
    workspace = Path(box.guest_workspace)
    (workspace / "sub").mkdir()
    (workspace / "sub" / "inside.txt").write_text("inside\n")
    links = {
        "out_dir": outside,
        "out_file": outside / "secret.txt",
        "dangling": outside / "new.txt",
        "up": Path(".."),
        "in_link": Path("sub"),
        "loop": Path("loop"),
    }
    for name, target in links.items():
        (workspace / name).symlink_to(target)
    (workspace / "sub" / "back_out").symlink_to("../../../outside")
    yield World(box, outside)
    await manager.close(box)


def segments(world_names: list[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(["..", ".", "", " ", "sub", "inside.txt", "new.txt", "secret.txt"]),
        st.sampled_from(world_names),
        st.text(st.characters(codec=None, categories=None), min_size=1, max_size=8),
        st.sampled_from(["\x00", "a\x00b", "\udcff", "\ud800", "é\u202e", "\n", "x" * 300]),
    )


LINK_NAMES = ["out_dir", "out_file", "dangling", "up", "in_link", "loop", "back_out", "dir"]
roots = st.sampled_from(["", "/", "WORKSPACE/", "OUTSIDE/", "/../", "WORKSPACE/../"])


@st.composite
def paths(draw: st.DrawFn) -> str:
    parts = draw(st.lists(segments(LINK_NAMES), min_size=1, max_size=5))
    return draw(roots) + "/".join(parts)


arguments = st.one_of(
    st.builds(lambda: {"command": "view"}),
    st.builds(lambda t: {"command": "create", "file_text": t}, st.text(max_size=20)),
    st.builds(
        lambda old, new: {"command": "str_replace", "old_str": old, "new_str": new},
        st.sampled_from(["inside", SECRET, "line"]),
        st.text(max_size=10),
    ),
    st.builds(
        lambda n, t: {"command": "insert", "insert_line": n, "new_str": t},
        st.integers(0, 2),
        st.text(min_size=1, max_size=10),
    ),
    st.builds(lambda: {"command": "undo_edit"}),
)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(path=paths(), args=arguments)
@example(path="dangling", args={"command": "create", "file_text": "escaped"})
@example(path="out_dir/new.txt", args={"command": "create", "file_text": "escaped"})
@example(path="sub/back_out/secret.txt", args={"command": "view"})
@example(path="a\x00b", args={"command": "view"})
@example(path="sub/\ud800.txt", args={"command": "create", "file_text": "x"})
@example(path="sub/ok.txt", args={"command": "create", "file_text": "lone \udc80 \ud800"})
@example(
    path="sub/inside.txt", args={"command": "str_replace", "old_str": "inside", "new_str": "\ud800"}
)
async def test_paths_never_lead_out(world: World, path: str, args: dict[str, Any]) -> None:
    path = path.replace("WORKSPACE", str(world.workspace)).replace("OUTSIDE", str(world.outside))
    result = await world.editor.run({**args, "path": path})
    assert SECRET not in result.output
    assert snapshot(world.outside) == world.before
    assert around(world.workspace.parent) == world.around
    if (
        result.error
        and path.strip()
        and any(
            words in result.output
            for words in ("outside the workspace", "cannot resolve", "the path ")
        )
    ):
        named = (path, path.strip(), repr(path), repr(path.strip()))
        assert any(name in result.output for name in named), result.output
