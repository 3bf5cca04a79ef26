"""Bounded output capture and terminal clean-up."""

from __future__ import annotations

from rollserve.sandbox.output import HeadTail, clean_terminal


def test_small_output_is_kept_whole() -> None:
    buf = HeadTail(100)
    buf.feed(b"hello ")
    buf.feed(b"world")
    assert buf.text() == "hello world"
    assert not buf.truncated


def test_large_output_keeps_head_and_tail() -> None:
    buf = HeadTail(20)
    for i in range(1000):
        buf.feed(f"{i}\n".encode())
    text = buf.text()
    assert text.startswith("0\n1\n2\n")
    assert text.endswith("998\n999\n")
    assert (
        buf.truncated
        and buf.dropped_bytes == len(b"".join(f"{i}\n".encode() for i in range(1000))) - 20
    )
    assert f"{buf.dropped_bytes} bytes" in text and "lines) omitted" in text


def test_invalid_utf8_is_replaced() -> None:
    buf = HeadTail(100)
    buf.feed(b"a\xffb")
    assert buf.text() == "a\ufffdb"


def test_clean_terminal_strips_escapes_and_overwrites() -> None:
    assert clean_terminal("\x1b[1;31mred\x1b[0m\r\n") == "red\n"
    assert clean_terminal("\x1b]0;title\x07text") == "text"
    assert clean_terminal("10%\r50%\r100%\ndone\n") == "100%\ndone\n"
    assert clean_terminal("keep\ttabs\x07") == "keep\ttabs"
