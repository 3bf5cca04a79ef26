"""The ``editor`` tool in real bwrap sandboxes: every command, its refusals, and the paths it
must never reach outside the workspace."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from rollserve.agents.editor import Editor, EditorResult
from rollserve.agents.tools import Toolbox, tool_schemas
from rollserve.llm.toolcalls import ToolCall
from rollserve.sandbox import SandboxInstance, SandboxManager, spec_for
from tests.conformance.conftest import require


@pytest.fixture
async def sandbox(manager: SandboxManager) -> AsyncIterator[SandboxInstance]:
    require(manager, "bwrap")
    box = await manager.start(spec_for("bwrap"))
    yield box
    await manager.close(box)


@pytest.fixture
def editor(sandbox: SandboxInstance) -> Editor:
    return Editor(sandbox)


async def edit(editor: Editor, command: str, path: str, **arguments: object) -> EditorResult:
    return await editor.run({"command": command, "path": path, **arguments})


async def ok(editor: Editor, command: str, path: str, **arguments: object) -> str:
    result = await edit(editor, command, path, **arguments)
    assert not result.error, result.output
    return result.output


async def refused(editor: Editor, command: str, path: str, **arguments: object) -> str:
    result = await edit(editor, command, path, **arguments)
    assert result.error, result.output
    return result.output


async def content(sandbox: SandboxInstance, path: str) -> str:
    return (await sandbox.read_file(path)).decode()


async def test_create_then_view_numbers_lines(editor: Editor, sandbox: SandboxInstance) -> None:
    out = await ok(editor, "create", "pkg/sub/mod.py", file_text="a = 1\nb = 2\n")
    assert "pkg/sub/mod.py" in out
    assert await content(sandbox, "pkg/sub/mod.py") == "a = 1\nb = 2\n"
    assert await ok(editor, "view", "pkg/sub/mod.py") == "     1\ta = 1\n     2\tb = 2"
    assert await ok(editor, "view", "/workspace/pkg/sub/mod.py") == ("     1\ta = 1\n     2\tb = 2")


async def test_view_range(editor: Editor, sandbox: SandboxInstance) -> None:
    await sandbox.write_file("f.txt", "".join(f"line {i}\n" for i in range(1, 11)).encode())
    assert await ok(editor, "view", "f.txt", view_range=[3, 4]) == "     3\tline 3\n     4\tline 4"
    assert (await ok(editor, "view", "f.txt", view_range=[9, -1])).splitlines() == [
        "     9\tline 9",
        "    10\tline 10",
    ]
    for bad in ([0, 3], [11, -1], [5, 11], [5, 4]):
        out = await refused(editor, "view", "f.txt", view_range=bad)
        assert "10 lines" in out
    assert "two integers" in await refused(editor, "view", "f.txt", view_range=[1])
    assert "two integers" in await refused(editor, "view", "f.txt", view_range="1-2")


async def test_long_file_is_cut_with_a_note(editor: Editor, sandbox: SandboxInstance) -> None:
    await sandbox.write_file("long.txt", "".join(f"{i}\n" for i in range(1, 1001)).encode())
    lines = (await ok(editor, "view", "long.txt")).splitlines()
    assert lines[399] == "   400\t400"
    assert "1000" in lines[400] and "[401, 800]" in lines[400]
    assert len(lines) == 401


async def test_directory_view(editor: Editor, sandbox: SandboxInstance) -> None:
    await sandbox.write_file("a.txt", b"x")
    await sandbox.write_file("src/b.py", b"x")
    await sandbox.write_file("src/deep/c.py", b"x")
    await sandbox.write_file(".hidden/d.txt", b"x")
    await sandbox.write_file("src/.secret", b"x")
    for path in (".", "/workspace"):
        out = await ok(editor, "view", path)
        entries = out.splitlines()[1:]
        assert entries == ["a.txt", "src/", "src/b.py", "src/deep/"], out
    assert "directory" in await refused(editor, "view", "src", view_range=[1, 2])


async def test_create_refuses_an_existing_file(editor: Editor, sandbox: SandboxInstance) -> None:
    await sandbox.write_file("here.txt", b"old\n")
    out = await refused(editor, "create", "here.txt", file_text="new\n")
    assert "already exists" in out and "str_replace" in out
    assert "already exists" in await refused(editor, "create", ".", file_text="x")
    assert await content(sandbox, "here.txt") == "old\n"
    assert "file_text" in await refused(editor, "create", "new.txt")


async def test_str_replace(editor: Editor, sandbox: SandboxInstance) -> None:
    text = "".join(f"row {i}\n" for i in range(1, 21))
    await sandbox.write_file("t.txt", text.encode())
    out = await ok(editor, "str_replace", "t.txt", old_str="row 10\n", new_str="ten\nTEN\n")
    assert "    10\tten\n    11\tTEN\n" in out and "     6\trow 6" in out
    assert await content(sandbox, "t.txt") == text.replace("row 10\n", "ten\nTEN\n")
    # new_str defaults to "": the text is deleted
    await ok(editor, "str_replace", "t.txt", old_str="row 20\n")
    assert not (await content(sandbox, "t.txt")).endswith("row 20\n")


async def test_str_replace_refusals(editor: Editor, sandbox: SandboxInstance) -> None:
    await sandbox.write_file("s.py", b"def f():\n    return 1\n\nx = 1\ny = 2\nx = 1\n")
    out = await refused(editor, "str_replace", "s.py", old_str="x = 1", new_str="z")
    assert "2 times" in out and "4, 6" in out
    out = await refused(editor, "str_replace", "s.py", old_str="nothing", new_str="z")
    assert "does not occur" in out
    out = await refused(editor, "str_replace", "s.py", old_str="def f():\n  return 1", new_str="")
    assert "other whitespace" in out and "line 1" in out
    assert "old_str" in await refused(editor, "str_replace", "s.py", old_str="")
    assert "does not exist" in await refused(editor, "str_replace", "no.py", old_str="a")
    assert await content(sandbox, "s.py") == "def f():\n    return 1\n\nx = 1\ny = 2\nx = 1\n"


async def test_insert(editor: Editor, sandbox: SandboxInstance) -> None:
    await sandbox.write_file("i.txt", b"one\ntwo\n")
    await ok(editor, "insert", "i.txt", insert_line=0, new_str="zero")
    out = await ok(editor, "insert", "i.txt", insert_line=3, new_str="three\nfour\n")
    assert "     4\tthree\n     5\tfour" in out
    await ok(editor, "insert", "i.txt", insert_line=1, new_str="half")
    assert await content(sandbox, "i.txt") == "zero\nhalf\none\ntwo\nthree\nfour\n"
    for line in (-1, 7):
        assert "6 lines" in await refused(editor, "insert", "i.txt", insert_line=line, new_str="x")
    assert "insert_line" in await refused(editor, "insert", "i.txt", new_str="x")
    await sandbox.write_file("empty.txt", b"")
    await ok(editor, "insert", "empty.txt", insert_line=0, new_str="first")
    assert await content(sandbox, "empty.txt") == "first\n"


async def test_undo_after_several_edits(editor: Editor, sandbox: SandboxInstance) -> None:
    await ok(editor, "create", "u.txt", file_text="a\n")
    await ok(editor, "str_replace", "u.txt", old_str="a", new_str="b")
    await ok(editor, "insert", "/workspace/u.txt", insert_line=1, new_str="c")
    assert await content(sandbox, "u.txt") == "b\nc\n"
    await ok(editor, "undo_edit", "u.txt")
    assert await content(sandbox, "u.txt") == "b\n"
    await ok(editor, "undo_edit", "./u.txt")
    assert await content(sandbox, "u.txt") == "a\n"
    assert "removed" in await ok(editor, "undo_edit", "u.txt")
    result = await sandbox.exec("test -e u.txt")
    assert result.exit_code == 1
    assert "No edit" in await refused(editor, "undo_edit", "u.txt")


async def test_undo_with_nothing_to_undo(editor: Editor, sandbox: SandboxInstance) -> None:
    await sandbox.write_file("v.txt", b"v\n")
    assert "No edit" in await refused(editor, "undo_edit", "v.txt")


async def test_unicode(editor: Editor, sandbox: SandboxInstance) -> None:
    text = "π ≈ 3.14159\n日本語\nemoji 🎉\n"
    await ok(editor, "create", "u8.txt", file_text=text)
    assert "     2\t日本語" in await ok(editor, "view", "u8.txt")
    await ok(editor, "str_replace", "u8.txt", old_str="日本語", new_str="中文 ✓")
    assert await content(sandbox, "u8.txt") == text.replace("日本語", "中文 ✓")


async def test_binary_file(editor: Editor, sandbox: SandboxInstance) -> None:
    await sandbox.write_file("b.bin", b"\xff\xfe\x00\x01 binary")
    await sandbox.write_file("nul.txt", b"text\x00more\n")
    for path in ("b.bin", "nul.txt"):
        assert "binary" in await refused(editor, "view", path)
        assert "binary" in await refused(editor, "str_replace", path, old_str="x", new_str="y")


@pytest.mark.parametrize("path", ["../x", "/etc/passwd", "/workspace/../etc/passwd", "/"])
async def test_paths_outside_the_workspace(editor: Editor, path: str) -> None:
    for command, arguments in [
        ("view", {}),
        ("create", {"file_text": "x"}),
        ("str_replace", {"old_str": "root", "new_str": "x"}),
        ("insert", {"insert_line": 0, "new_str": "x"}),
        ("undo_edit", {}),
    ]:
        assert "outside the workspace" in await refused(editor, command, path, **arguments)


async def test_symlinks_leading_out(editor: Editor, sandbox: SandboxInstance) -> None:
    result = await sandbox.exec("ln -s /etc x && ln -s /etc/passwd pw && ln -s x/hostname h")
    assert result.exit_code == 0, result.stderr
    for path in ("x/passwd", "pw", "h", "x"):
        assert "outside the workspace" in await refused(editor, "view", path)
    out = await refused(editor, "create", "x/new.conf", file_text="x")
    assert "outside the workspace" in out
    assert "outside the workspace" in await refused(
        editor, "str_replace", "pw", old_str="root", new_str="x"
    )


async def test_symlink_inside_the_workspace(editor: Editor, sandbox: SandboxInstance) -> None:
    await sandbox.write_file("real/file.txt", b"hello\n")
    assert (await sandbox.exec("ln -s real link")).exit_code == 0
    await ok(editor, "str_replace", "link/file.txt", old_str="hello", new_str="bye")
    assert await content(sandbox, "real/file.txt") == "bye\n"
    await ok(editor, "undo_edit", "real/file.txt")  # the same file: one history
    assert await content(sandbox, "real/file.txt") == "hello\n"


async def test_bad_arguments(editor: Editor) -> None:
    assert "unknown command" in (await editor.run({"command": "delete", "path": "a"})).output
    assert "path" in (await editor.run({"command": "view"})).output
    result = await editor.run({"command": "create", "path": "a", "file_text": 3})
    assert result.error and "string" in result.output


async def test_through_the_toolbox(sandbox: SandboxInstance) -> None:
    names = ["bash", "editor", "submit"]
    schema = tool_schemas(names)[1]["function"]
    assert schema["name"] == "editor"
    assert schema["parameters"]["required"] == ["command", "path"]
    assert set(schema["parameters"]["properties"]) == {
        "command",
        "path",
        "file_text",
        "old_str",
        "new_str",
        "insert_line",
        "view_range",
    }
    toolbox = Toolbox(sandbox, names, command_timeout_s=10.0)
    try:
        args = {"command": "create", "path": "hello.py", "file_text": "print('hi')\n"}
        outcome = await toolbox.call(ToolCall("editor", args, "call_0"))
        assert not outcome.error and not outcome.submitted
        outcome = await toolbox.call(ToolCall("bash", {"command": "cat hello.py"}, "call_1"))
        assert "print('hi')" in outcome.output
        args = {"command": "undo_edit", "path": "hello.py"}
        assert not (await toolbox.call(ToolCall("editor", args, "call_2"))).error
        outcome = await toolbox.call(ToolCall("editor", {"command": "view", "path": "/etc"}, "c"))
        assert outcome.error and "outside the workspace" in outcome.output
        for untypable in ("echo a\x00b", "echo \ud800"):  # a NUL byte, a lone surrogate
            outcome = await toolbox.call(ToolCall("bash", {"command": untypable}, "call_3"))
            assert outcome.error, outcome.output  # an observation for the model, not a crash
        outcome = await toolbox.call(ToolCall("bash", {"command": "echo still here"}, "call_4"))
        assert not outcome.error and "still here" in outcome.output
    finally:
        await toolbox.close()
    without = Toolbox(None, names, command_timeout_s=10.0)
    outcome = await without.call(ToolCall("editor", {"command": "view", "path": "."}, "call_0"))
    assert outcome.error and "no sandbox" in outcome.output
