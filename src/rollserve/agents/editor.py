"""The ``editor`` tool: view, create, str_replace, insert and undo_edit workspace files. Paths
are resolved inside the sandbox (symlinks included) and must stay in the workspace; files are
read and written through the sandbox's symlink-proof calls. What the model gets wrong becomes
an observation (``error=True``); only the sandbox's own failures raise."""

from __future__ import annotations

import contextlib
import functools
import posixpath
import re
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Concatenate, NamedTuple, ParamSpec

from rollserve.errors import InvalidInputError
from rollserve.sandbox.base import Sandbox

COMMANDS = ("view", "create", "str_replace", "insert", "undo_edit")
_VIEW_LINES = 400  # a view without a range shows this many lines at most
_VIEW_CHARS = 40_000  # and never more characters than this
_LIST_ENTRIES = 1000
_CONTEXT_LINES = 4  # around an edit in the snippet shown after it
_EXEC_S = 30.0
_MAX_BYTES = 8 * 1024 * 1024  # larger files are for bash (sed, patch), not for the editor
# argv: workspace, path → "kind\0size\0resolved workspace\0resolved path" (symlinks followed)
_PROBE = r"""root=$(realpath -m -- "$1") && p=$(realpath -m -- "$2") || exit 2
if [ -d "$p" ]; then k=dir; elif [ -f "$p" ]; then k=file; elif [ -e "$p" ]; then k=other
else k=none; fi
printf '%s\0%s\0%s\0%s' "$k" "$(stat -c %s -- "$p" 2>/dev/null || echo 0)" "$root" "$p"
"""
# argv: directory, most entries → one entry a line, directories ending in "/".
_LIST = r"""cd -- "$1" && find . -mindepth 1 -maxdepth 2 -name '.*' -prune \
-o -type d -printf '%P/\n' -o -printf '%P\n' | LC_ALL=C sort | head -n "$2"
"""

_SURROGATE = re.compile("[\ud800-\udfff]")

P = ParamSpec("P")


@dataclass(frozen=True)
class EditorResult:
    """What one editor command tells the model; ``error`` when the command did nothing."""

    output: str
    error: bool = False


class _Target(NamedTuple):
    guest: str  # the absolute path in the sandbox, symlinks resolved
    kind: str  # dir, file, other, none
    size: int


def _observed(
    method: Callable[Concatenate[Editor, P], Awaitable[str]],
) -> Callable[Concatenate[Editor, P], Coroutine[Any, Any, EditorResult]]:
    """A command whose refusals (InvalidInputError) become error observations."""

    @functools.wraps(method)
    async def run(self: Editor, /, *args: P.args, **kwargs: P.kwargs) -> EditorResult:
        try:
            return EditorResult(await method(self, *args, **kwargs))
        except InvalidInputError as exc:
            return EditorResult(exc.message, error=True)

    return run


class Editor:
    """The ``editor`` tool of one episode's sandbox; keeps each file's edits for undo."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox
        self._history: dict[str, list[str | None]] = {}  # None: the edit created the file

    async def run(self, arguments: dict[str, Any]) -> EditorResult:
        """Run a tool call's arguments (the ``editor`` function schema)."""
        command, path, arg = arguments.get("command"), arguments.get("path"), arguments.get
        if command not in COMMANDS:
            listed = ", ".join(COMMANDS)
            return EditorResult(f"editor: unknown command {command!r}; use one of: {listed}", True)
        if not isinstance(path, str) or not path.strip():
            return EditorResult(f"editor {command} needs a non-empty string argument 'path'", True)
        for name in ("file_text", "old_str", "new_str"):
            if (value := arg(name)) is not None and not isinstance(value, str):
                return EditorResult(f"editor: '{name}' must be a string", True)
            if isinstance(value, str) and (bad := _SURROGATE.search(value)):
                return EditorResult(
                    f"editor: '{name}' contains the lone surrogate {bad.group()!r}, which is not "
                    "text: files are written as UTF-8",
                    True,
                )
        if command == "view":
            return await self.view(path, arg("view_range"))
        if command == "create":
            return await self.create(path, arg("file_text"))
        if command == "str_replace":
            return await self.str_replace(path, arg("old_str"), arg("new_str"))
        if command == "insert":
            return await self.insert(path, arg("insert_line"), arg("new_str"))
        return await self.undo_edit(path)

    @_observed
    async def view(self, path: str, view_range: Any = None) -> str:
        """A file with line numbers (``cat -n``), or a directory's entries two levels deep."""
        target = await self._resolve(path)
        if target.kind == "dir":
            if view_range is not None:
                raise InvalidInputError(f"{target.guest} is a directory: view_range is for files")
            return await self._listing(target.guest)
        lines = _split(await self._read(target))
        n = len(lines)
        if view_range is None:
            return _render(lines, 1, min(n, _VIEW_LINES), rest=True) or f"[{target.guest} is empty]"
        valid = isinstance(view_range, list) and len(view_range) == 2
        if not valid or any(type(v) is not int for v in view_range):
            raise InvalidInputError("view_range must be two integers [start, end] (end -1: to EOF)")
        start, end = view_range[0], n if view_range[1] == -1 else view_range[1]
        if not 1 <= start <= end <= n:
            raise InvalidInputError(
                f"view_range {view_range} is out of range: {target.guest} has {n} lines"
            )
        return _render(lines, start, end)

    @_observed
    async def create(self, path: str, file_text: str | None) -> str:
        """Write ``file_text`` to a new file (parent directories made as needed)."""
        if file_text is None:
            raise InvalidInputError("editor create needs the argument 'file_text'")
        target = await self._resolve(path)
        if target.kind != "none":
            raise InvalidInputError(
                f"{target.guest} already exists: edit it (str_replace, insert) or rm it with bash"
            )
        await self._write(target, None, file_text)
        return f"Created {target.guest} ({len(_split(file_text))} lines)."

    @_observed
    async def str_replace(self, path: str, old_str: str | None, new_str: str | None = None) -> str:
        """Replace the one occurrence of ``old_str`` with ``new_str`` (default: delete it)."""
        if not old_str:
            raise InvalidInputError("editor str_replace needs a non-empty 'old_str'")
        new_str = new_str or ""
        target = await self._resolve(path)
        text = await self._read(target)
        found = [m.start() for m in re.finditer(f"(?={re.escape(old_str)})", text)]
        if not found:
            raise InvalidInputError(
                f"No replacement was made: old_str does not occur verbatim in {target.guest}."
                + _whitespace_hint(text, old_str)
            )
        if len(found) > 1:
            lines = ", ".join(str(_line_of(text, i)) for i in found[:20])
            raise InvalidInputError(
                f"No replacement was made: old_str occurs {len(found)} times in {target.guest} "
                f"(from lines {lines}); include more context to make it unique."
            )
        at = found[0]
        edited = text[:at] + new_str + text[at + len(old_str) :]
        await self._write(target, text, edited)
        first = _line_of(edited, at)
        return _edited(target.guest, edited, first, first + new_str.count("\n"))

    @_observed
    async def insert(self, path: str, insert_line: Any, new_str: str | None) -> str:
        """Insert ``new_str`` after line ``insert_line`` (0: at the top of the file)."""
        if type(insert_line) is not int:
            raise InvalidInputError("editor insert needs an integer 'insert_line'")
        if not new_str:
            raise InvalidInputError("editor insert needs a non-empty 'new_str'")
        target = await self._resolve(path)
        text = await self._read(target)
        lines = _split(text)
        if not 0 <= insert_line <= len(lines):
            raise InvalidInputError(
                f"insert_line {insert_line} is out of range: the file has {len(lines)} lines"
            )
        added = _split(new_str)
        joined = "\n".join(lines[:insert_line] + added + lines[insert_line:])
        edited = joined + "\n" if text.endswith("\n") or not text else joined
        await self._write(target, text, edited)
        return _edited(target.guest, edited, insert_line + 1, insert_line + len(added))

    @_observed
    async def undo_edit(self, path: str) -> str:
        """Revert the last create, str_replace or insert of the file."""
        target = await self._resolve(path)
        history = self._history.get(target.guest)
        if not history:
            raise InvalidInputError(f"No edit of {target.guest} to undo.")
        if (before := history[-1]) is None:
            await self._sh(f"remove {target.guest}", 'rm -f -- "$1"', target.guest)
        else:
            await self.sandbox.write_file(target.guest, before.encode())
        history.pop()
        done = "removed the file it created" if before is None else "restored the text before it"
        return f"Undid the last edit of {target.guest}: {done} ({len(history)} more to undo)."

    async def _resolve(self, path: str) -> _Target:
        """The path in the sandbox (a relative one from the workspace), or a refusal when it
        leads out of the workspace; a writable root's sandbox may edit anywhere."""
        base = self.sandbox.guest_workspace
        root = "/" if getattr(self.sandbox, "has_layer", False) else base
        if "\0" in path:
            raise InvalidInputError(f"the path {path!r} contains a NUL byte")
        # U+DC80..U+DCFF stand for the bytes of a file name that is not UTF-8; other
        # surrogates stand for nothing a file name can hold.
        if any(not "\udc80" <= char <= "\udcff" for char in _SURROGATE.findall(path)):
            raise InvalidInputError(f"the path {path!r} contains a lone surrogate")
        guest = posixpath.normpath(posixpath.join(base, path.strip()))
        outside = InvalidInputError(f"{path} is outside the workspace ({root})")
        if not _within(guest, root):
            raise outside
        parts = (await self._sh(f"resolve {path}", _PROBE, root, guest)).split("\0")
        if len(parts) != 4:
            raise InvalidInputError(f"cannot resolve {path}")
        kind, size, real_root, real = parts
        if not _within(real, real_root):
            raise outside
        rel = real[len(real_root) :].strip("/")
        return _Target(posixpath.join(root, rel) if rel else root, kind, int(size or 0))

    async def _read(self, target: _Target) -> str:
        if target.kind == "none":
            raise InvalidInputError(f"{target.guest} does not exist (create makes a new file)")
        if target.kind != "file":
            raise InvalidInputError(f"{target.guest} is not a regular file")
        if target.size > _MAX_BYTES:
            raise InvalidInputError(f"{target.guest} is over {_MAX_BYTES} bytes: use bash")
        data = await self.sandbox.read_file(target.guest)
        if b"\0" not in data:
            with contextlib.suppress(UnicodeDecodeError):
                return data.decode()
        raise InvalidInputError(f"{target.guest} is binary (not UTF-8 text): use bash for it")

    async def _write(self, target: _Target, before: str | None, after: str) -> None:
        await self.sandbox.write_file(target.guest, after.encode())
        self._history.setdefault(target.guest, []).append(before)

    async def _sh(self, what: str, script: str, *args: str) -> str:
        """The output of a bash ``script`` run in the sandbox, or a refusal saying what failed."""
        result = await self.sandbox.exec(["bash", "-c", script, "editor", *args], timeout=_EXEC_S)
        if result.exit_code != 0:
            raise InvalidInputError(f"cannot {what}: {result.stderr.strip() or 'timed out'}")
        return result.stdout

    async def _listing(self, directory: str) -> str:
        listed = await self._sh(f"list {directory}", _LIST, directory, str(_LIST_ENTRIES + 1))
        entries = listed.splitlines() or ["(empty)"]
        if len(entries) > _LIST_ENTRIES:
            note = f"[only the first {_LIST_ENTRIES} entries; view subdirectories for more]"
            entries[_LIST_ENTRIES:] = [note]
        head = f"{directory}: files and directories up to 2 levels deep (hidden ones left out):"
        return "\n".join([head, *entries])


def _split(text: str) -> list[str]:
    """The lines as ``cat -n`` numbers them (a final newline ends the last line)."""
    lines = text.split("\n")
    return lines[:-1] if lines[-1] == "" else lines


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _line_of(text: str, index: int) -> int:
    return text.count("\n", 0, index) + 1


def _render(lines: list[str], first: int, last: int, *, rest: bool = False) -> str:
    """Lines ``first``..``last`` (1-based) numbered as ``cat -n`` does, with a note on how to see
    more where the character limit cut them, or (``rest``) where lines follow ``last``."""
    out: list[str] = []
    size = 0
    for number in range(first, last + 1):
        row = f"{number:6}\t{lines[number - 1]}"
        if out and size + len(row) > _VIEW_CHARS:
            break
        out.append(row)
        size += len(row) + 1
    shown = first + len(out) - 1
    text = "\n".join(out)
    if len(text) > _VIEW_CHARS:
        text = text[:_VIEW_CHARS] + f"\n[line {shown} is cut here; use bash to see all of it]"
    if shown < last or (rest and shown < len(lines)):
        text += (
            f"\n[showing lines {first}-{shown} of {len(lines)}; view the rest with view_range "
            f"[{shown + 1}, {min(len(lines), shown + _VIEW_LINES)}] (or [{shown + 1}, -1])]"
        )
    return text


def _edited(path: str, text: str, first: int, last: int) -> str:
    """The message after an edit: a numbered snippet of the edited region and its context."""
    if not (lines := _split(text)):
        return f"Edited {path}: it is now empty."
    start = max(1, first - _CONTEXT_LINES)
    end = min(len(lines), max(last, first) + _CONTEXT_LINES)
    return f"Edited {path}; lines {start}-{end} now read:\n{_render(lines, start, end)}"


def _whitespace_hint(text: str, old_str: str) -> str:
    """Where ``old_str`` occurs when whitespace is ignored, as a hint for the model."""
    words = old_str.split()
    match = re.search(r"\s+".join(map(re.escape, words)), text) if words else None
    if match is None:
        return " Check it against a fresh view of the file."
    line = _line_of(text, match.start())
    return f" It occurs with other whitespace from line {line}: view it, copy old_str exactly."
