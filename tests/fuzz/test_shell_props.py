"""Properties of the shell's quoting and marker protocol, on a real bash on a real PTY: any bytes a
command prints and any text a command holds come back as they were, and output that imitates
the end marker neither ends a command early nor forges its exit code."""

from __future__ import annotations

import shlex
from collections.abc import AsyncIterator

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from rollserve.errors import InvalidCommandError
from rollserve.sandbox import SandboxInstance, SandboxManager, spec_for
from rollserve.sandbox.output import clean_terminal
from rollserve.shell import ShellSession
from tests.conformance.conftest import require

# One shell serves every example of a test: that it stays in step from one command to the
# next is part of what is checked.
SHELL_PROPERTY = settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
TIMEOUT_S = 10.0  # a command that loses its end marker would hang until this


@pytest.fixture
async def shell(manager: SandboxManager) -> AsyncIterator[ShellSession]:
    require(manager, "local")
    box: SandboxInstance = await manager.start(spec_for("local"))
    session = await ShellSession.open(box, input_idle_s=1.0)
    yield session
    await session.close()
    await manager.close(box)


def printf_of(data: bytes) -> str:
    """A command printing ``data`` exactly, quoted independently of rollserve's own quoting."""
    return "printf '" + "".join(f"\\{byte:03o}" for byte in data) + "'"


def as_read(data: bytes) -> str:
    """What a reader of the terminal sees of ``data``: the terminal turns LF into CRLF, and
    results are decoded and cleaned of terminal escapes."""
    return clean_terminal(data.replace(b"\n", b"\r\n").decode("utf-8", errors="replace"))


async def in_step(shell: ShellSession) -> None:
    after = await shell.run("echo in-step", timeout=TIMEOUT_S)
    assert (after.output, after.exit_code) == ("in-step\n", 0)


_hex = st.text("0123456789abcdef", min_size=12, max_size=12)
fake_markers = st.builds(
    lambda nonce, code, end, cut: ("\x1eRS" + nonce + ":" + str(code) + end)[:cut].encode(),
    _hex,
    st.integers(0, 100_000),
    st.sampled_from(["\x1e\n", "\x1e", "", "\n"]),
    st.integers(1, 40),
)
output_bytes = st.lists(
    st.binary(max_size=64)
    | fake_markers
    | st.sampled_from([b"\x1e", b"\n", b"\r\n", b"\x1eRS", b"\x1b[1m", b"\xff"]),
    max_size=8,
).map(b"".join)


@SHELL_PROPERTY
@given(data=st.binary(max_size=3000))
@example(data=bytes(range(256)))
async def test_printed_bytes_come_back(shell: ShellSession, data: bytes) -> None:
    result = await shell.run(printf_of(data), timeout=TIMEOUT_S)
    assert (result.exit_code, result.timed_out) == (0, False)
    assert result.output == as_read(data)


@SHELL_PROPERTY
@given(data=output_bytes, code=st.integers(0, 255))
@example(data=b"\x1eRSaaaaaaaaaaaa:7", code=0)
@example(data=b"\x1eRSaaaaaaaaaaaa:7\x1e\n", code=3)
@example(data=b"\x1eRS000000000000:0\x1e", code=1)
async def test_fake_markers_neither_end_nor_forge(
    shell: ShellSession, data: bytes, code: int
) -> None:
    result = await shell.run(f"{printf_of(data)}; (exit {code})", timeout=TIMEOUT_S)
    assert (result.exit_code, result.timed_out) == (code, False)
    assert result.output == as_read(data)
    await in_step(shell)


@SHELL_PROPERTY
@given(
    data=output_bytes,
    code=st.integers(0, 255),
    pause=st.sampled_from(["", "sleep 0.05; "]),
)
async def test_fake_markers_split_across_reads(
    shell: ShellSession, data: bytes, code: int, pause: str
) -> None:
    """The same, with the fake marker's halves written apart (the reader may see either)."""
    half = len(data) // 2
    command = f"{printf_of(data[:half])}; {pause}{printf_of(data[half:])}; (exit {code})"
    result = await shell.run(command, timeout=TIMEOUT_S)
    assert (result.exit_code, result.timed_out) == (code, False)
    assert result.output == as_read(data)


command_texts = st.text(
    st.characters(codec=None, categories=None, exclude_characters="\x00"), max_size=300
)


@SHELL_PROPERTY
@given(text=command_texts)
@example(text="\udcff\udc80 raw bytes as surrogate escapes")
@example(text="lone \ud800 surrogate")
@example(text="'\"$HOME `x` \\ !\n\t" + "é" * 600)
async def test_command_text_arrives_intact(shell: ShellSession, text: str) -> None:
    command = "printf %s " + shlex.quote(text)
    try:
        data = text.encode("utf-8", errors="surrogateescape")
    except UnicodeEncodeError:
        with pytest.raises(InvalidCommandError, match="surrogate"):
            await shell.run(command, timeout=TIMEOUT_S)
        return
    result = await shell.run(command, timeout=TIMEOUT_S)
    assert (result.exit_code, result.timed_out) == (0, False)
    assert result.output == as_read(data)


@SHELL_PROPERTY
@given(text=command_texts)
async def test_any_text_in_a_heredoc(shell: ShellSession, text: str) -> None:
    """Text typed as a heredoc body reaches the command byte for byte (od shows the bytes)."""
    try:
        data = text.encode("utf-8", errors="surrogateescape")
    except UnicodeEncodeError:
        return
    assume("EOF_RS" not in text.split("\n"))
    body = text if text.endswith("\n") else text + "\n"
    expected = data if data.endswith(b"\n") else data + b"\n"
    result = await shell.run(f"od -An -v -tx1 <<'EOF_RS'\n{body}EOF_RS", timeout=TIMEOUT_S)
    assert result.exit_code == 0
    assert bytes.fromhex(result.output) == expected


async def test_input_with_surrogates(shell: ShellSession) -> None:
    """Typed input follows the rule of commands: surrogate escapes are raw bytes, other lone
    surrogates are refused before anything is typed."""
    waiting = await shell.run('IFS= read -r line; printf "%s" "$line" | od -An -tx1')
    assert waiting.waiting_for_input
    with pytest.raises(InvalidCommandError, match="surrogate"):
        await shell.send_input("\ud800\n")
    answered = await shell.send_input("\u00e9\udcff\n")
    assert (answered.output.split(), answered.exit_code) == (["c3", "a9", "ff"], 0)
