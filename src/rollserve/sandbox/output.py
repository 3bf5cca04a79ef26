"""Bounded capture of process output: the head and the tail are kept, the middle is counted."""

from __future__ import annotations

import re

# CSI (ESC [ ... final), OSC (ESC ] ... BEL/ST), other two-byte escapes, and stray C0 controls
# other than tab, newline and carriage return.
_ANSI = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"
    r"|\x1b[PX^_][^\x1b]*(?:\x1b\\)?"
    r"|\x1b[@-Z\\-_]"
    r"|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]"
)


class HeadTail:
    """Keeps the first and last ``limit // 2`` bytes of a stream and counts what it drops."""

    def __init__(self, limit: int) -> None:
        self.half = max(limit // 2, 1)
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped_bytes = 0
        self.dropped_lines = 0

    def feed(self, data: bytes) -> None:
        room = self.half - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if not data:
            return
        self.tail += data
        excess = len(self.tail) - self.half
        if excess > 0:
            cut = self.tail[:excess]
            self.dropped_bytes += excess
            self.dropped_lines += cut.count(b"\n")
            del self.tail[:excess]

    @property
    def truncated(self) -> bool:
        return self.dropped_bytes > 0

    def text(self, *, clean: bool = False) -> str:
        """Decoded output (invalid UTF-8 replaced), with a note where the middle was cut."""
        head = self.head.decode("utf-8", errors="replace")
        if not self.truncated:
            return clean_terminal(head) if clean else head
        tail = self.tail.decode("utf-8", errors="replace")
        if clean:
            head, tail = clean_terminal(head), clean_terminal(tail)
        note = (
            f"\n[... output truncated by rollserve: {self.dropped_bytes} bytes "
            f"({self.dropped_lines} lines) omitted ...]\n"
        )
        return head + note + tail


def clean_terminal(text: str) -> str:
    """Terminal output as a reader sees it: escapes stripped, each ``\\r``-overwritten line
    reduced to its last version (progress bars), CRLF turned into LF."""
    text = _ANSI.sub("", text.replace("\r\n", "\n"))
    if "\r" not in text:
        return text
    return "\n".join(line.rstrip("\r").rsplit("\r", 1)[-1] for line in text.split("\n"))
