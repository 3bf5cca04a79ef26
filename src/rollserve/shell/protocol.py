"""What rollserve types into the shell: commands as ANSI-C quoted strings, and end markers.

A command is never typed as is. Its bytes are sent as ``$'…'`` literals (pure ASCII, in lines
short enough for the terminal's canonical mode) and run with ``eval``, so heredocs, quotes,
unicode and multi-line scripts arrive intact, and then a marker carrying the exit status is
printed. The marker's text never appears in what is typed, so nothing can be mistaken for it.
"""

from __future__ import annotations

import re
import secrets

MARKER = re.compile(rb"\x1eRS([0-9a-f]{12}):(\d+)\x1e\n?")
_MAX_MARKER = 32
_CHUNK = 512  # bytes per typed line: escaped (4 chars a byte at worst) it stays under 4095
_PLAIN = frozenset(range(0x20, 0x7F)) - {ord("\\"), ord("'")}
_SURROGATES = re.compile("[\ud800-\udfff]")

# Typed once at start: no prompts, no history, job control on (so a command runs in its own
# process group and Ctrl-C reaches it), and a helper that restores $? before each command.
INIT = (
    "set +H +o history -m; PS1=''; PS2=''; PS0=''; PROMPT_COMMAND=''; unset HISTFILE; "
    '__rs_rc() { builtin return "$1"; }; __rs_ec=0; cd {workspace} 2>/dev/null; '
)


def new_nonce() -> str:
    return secrets.token_hex(6)


def quote(data: bytes) -> str:
    """``data`` as a bash ANSI-C quoted string made only of printable ASCII."""
    out = []
    for byte in data:
        if byte in _PLAIN:
            out.append(chr(byte))
        elif byte == 0x0A:
            out.append("\\n")
        elif byte == 0x5C:
            out.append("\\\\")
        elif byte == 0x27:
            out.append("\\'")
        else:
            out.append(f"\\x{byte:02x}")
    return "$'" + "".join(out) + "'"


def marker_command(nonce: str) -> str:
    """Print the end marker with the status saved in ``__rs_ec``."""
    return f"builtin printf '\\036RS%s:%d\\036\\n' {nonce} \"$__rs_ec\""


def lone_surrogate(command: str) -> str | None:
    """The first surrogate of ``command`` that does not stand for a raw byte (U+DC80..U+DCFF,
    as ``surrogateescape`` decodes bytes that are not UTF-8), or None: such a command has no
    bytes to type."""
    for char in _SURROGATES.findall(command):
        if not "\udc80" <= char <= "\udcff":
            return str(char)
    return None


def command_lines(command: str, nonce: str) -> bytes:
    """The lines that run ``command`` and then print the marker for ``nonce``."""
    data = command.encode("utf-8", errors="surrogateescape")
    chunks = [data[i : i + _CHUNK] for i in range(0, len(data), _CHUNK)] or [b""]
    lines = [f"__rs_c={quote(chunks[0])}"]
    lines += [f"__rs_c+={quote(chunk)}" for chunk in chunks[1:]]
    # Complete lines typed for the command but left unread would otherwise be run by bash as
    # commands once it returns: read them away before the marker.
    lines.append(
        f'__rs_rc "$__rs_ec"; builtin eval "$__rs_c"; __rs_ec=$?; '
        f"while builtin read -r -t 0; do builtin read -r _; done; {marker_command(nonce)}"
    )
    return ("\n".join(lines) + "\n").encode("ascii")


def sync_line(nonce: str) -> bytes:
    """After an interrupt: record the status of whatever ran last and print a marker."""
    return f"__rs_ec=$?; {marker_command(nonce)}\n".encode("ascii")


def init_line(workspace: str, nonce: str) -> bytes:
    return (
        INIT.replace("{workspace}", _shell_word(workspace)) + marker_command(nonce) + "\n"
    ).encode("ascii")


def exports(env: dict[str, str]) -> str:
    """A command that exports ``env`` into the shell."""
    return "".join(f"export {name}={quote(value.encode())}; " for name, value in env.items())


def safe_length(buf: bytes | bytearray) -> int:
    """How many leading bytes of ``buf`` (which holds no complete marker) are surely output;
    a trailing fragment that could still grow into a marker is held back."""
    cut = buf.rfind(b"\x1e", max(0, len(buf) - _MAX_MARKER))
    if cut != -1 and b"\n" not in buf[cut:]:
        return cut
    return len(buf)


def _shell_word(text: str) -> str:
    return quote(text.encode())
