"""What is typed into the shell: quoting must round-trip any bytes through a real bash."""

from __future__ import annotations

import random
import subprocess

import pytest

from rollserve.shell import protocol


def _bash_eval(quoted: str) -> bytes:
    return subprocess.run(
        ["bash", "--noprofile", "--norc", "-c", f"printf %s {quoted}"],
        capture_output=True,
        check=True,
    ).stdout


@pytest.mark.parametrize(
    "text",
    [
        b"",
        b"plain",
        b'it\'s \\ "q" $HOME `x` !',
        b"a\nb\tc\r",
        "héllo ☃".encode(),
        b"\xff\xfe\x01\x7f",
    ],
)
def test_quote_round_trips(text: bytes) -> None:
    quoted = protocol.quote(text)
    assert quoted.isascii() and "\n" not in quoted
    assert _bash_eval(quoted) == text


def test_quote_round_trips_random_bytes() -> None:
    rng = random.Random(7)
    data = bytes(rng.randrange(1, 256) for _ in range(3000))
    assert _bash_eval(protocol.quote(data)) == data


def test_long_commands_are_split_into_short_lines() -> None:
    lines = protocol.command_lines("echo " + "é" * 5000, "0123456789ab").split(b"\n")
    assert len(lines) > 3
    assert max(len(line) for line in lines) < 4095  # the terminal's canonical line limit


def test_marker_text_is_never_typed() -> None:
    typed = protocol.command_lines("echo hi", "0123456789ab")
    assert protocol.MARKER.search(typed) is None
    assert b"0123456789ab" in typed


def test_safe_length_holds_back_a_possible_marker() -> None:
    assert protocol.safe_length(b"output\x1eRS0123") == len(b"output")
    assert protocol.safe_length(b"output\x1ebinary\nmore") == len(b"output\x1ebinary\nmore")
    assert protocol.safe_length(b"plain") == 5
