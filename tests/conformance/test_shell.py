"""Shell behaviour, identical in every backend."""

from __future__ import annotations

import asyncio

import pytest

from rollserve.errors import InvalidCommandError, ShellExitedError
from rollserve.shell import ShellSession


@pytest.mark.parametrize(
    ("command", "code"),
    [
        ("true", 0),
        ("exit_one() { return 1; }; exit_one", 1),
        ("false", 1),
        ("no-such-command-xyz", 127),
        ("false && true", 1),
        ("true || false", 0),
        ("(exit 42)", 42),
    ],
)
async def test_exit_codes(shell: ShellSession, command: str, code: int) -> None:
    result = await shell.run(command)
    assert result.exit_code == code
    assert not result.timed_out


async def test_command_not_found_message(shell: ShellSession) -> None:
    result = await shell.run("no-such-command-xyz")
    assert "no-such-command-xyz" in result.output
    assert "not found" in result.output


async def test_output_is_exact_and_not_echoed(shell: ShellSession) -> None:
    result = await shell.run("echo hello; echo world >&2")
    assert result.output == "hello\nworld\n"


async def test_previous_status_is_visible(shell: ShellSession) -> None:
    await shell.run("false")
    assert (await shell.run("echo $?")).output == "1\n"


async def test_cwd_and_env_persist(shell: ShellSession) -> None:
    start = await shell.run("pwd")
    assert start.output == shell.sandbox.guest_workspace + "\n"
    await shell.run("mkdir -p sub/dir && cd sub/dir")
    await shell.run("export ROLL_VAR='a b'; greet() { echo hi $1; }")
    result = await shell.run('pwd; echo "$ROLL_VAR"; greet there')
    assert result.output == f"{shell.sandbox.guest_workspace}/sub/dir\na b\nhi there\n"


async def test_timeout_interrupts_and_session_recovers(shell: ShellSession) -> None:
    result = await shell.run("echo started; sleep 30; echo never", timeout=1.0)
    assert result.timed_out
    assert result.exit_code is None
    assert "started" in result.output and "never" not in result.output
    assert result.duration_s < 10
    after = await shell.run("echo alive")
    assert (after.output, after.exit_code) == ("alive\n", 0)


async def test_command_ignoring_ctrl_c_is_killed(shell: ShellSession) -> None:
    result = await shell.run("bash -c \"trap '' INT; sleep 30\"; echo never", timeout=1.0)
    assert result.timed_out
    assert "never" not in result.output  # the rest of the line is dropped, as with Ctrl-C
    after = await shell.run("echo alive")
    assert after.output == "alive\n"


async def test_pager_is_interrupted(shell: ShellSession) -> None:
    result = await shell.run("seq 1 100000 | less", timeout=1.5)
    assert result.timed_out or result.waiting_for_input
    if result.waiting_for_input:
        result = await shell.interrupt()
    assert not shell.pending
    after = await shell.run("echo alive; stty -a | grep -o -- '-echo '")
    assert after.output == "alive\n-echo \n"


async def test_huge_output_is_cut_with_a_note(shell: ShellSession) -> None:
    limit = shell.sandbox.limits.max_output_bytes
    result = await shell.run("head -c 1000000 /dev/zero | tr '\\0' a; echo; echo END")
    assert result.exit_code == 0
    assert result.truncated
    assert result.dropped_bytes > 1_000_000 - limit - 1000
    assert len(result.output.encode()) < limit + 500
    assert "output truncated by rollserve" in result.output
    assert result.output.startswith("aaaa") and result.output.endswith("END\n")


async def test_many_lines_keep_head_and_tail(shell: ShellSession) -> None:
    result = await shell.run("seq 1 50000")
    assert result.truncated
    assert result.output.startswith("1\n2\n3\n")
    assert result.output.endswith("49999\n50000\n")
    assert "lines) omitted" in result.output


async def test_unicode_and_invalid_bytes(shell: ShellSession) -> None:
    result = await shell.run("echo 'héllo ☃ 日本語 🚀'; printf 'bad:\\xff\\xfe:end\\n'")
    assert result.output == "héllo ☃ 日本語 🚀\nbad:\ufffd\ufffd:end\n"


async def test_ansi_escapes_are_stripped(shell: ShellSession) -> None:
    result = await shell.run("printf '\\033[1;31mred\\033[0m plain\\n'")
    assert result.output == "red plain\n"


async def test_heredoc_and_multiline(shell: ShellSession) -> None:
    script = "cat > f.txt <<'EOF'\nline $HOME one\n  indented\nEOF\nwc -l < f.txt\ncat f.txt"
    result = await shell.run(script)
    assert result.output == "2\nline $HOME one\n  indented\n"


async def test_long_command(shell: ShellSession) -> None:
    payload = "x" * 20000
    result = await shell.run(f"echo {payload} | wc -c")
    assert result.output == "20001\n"


@pytest.mark.parametrize("command", ["", "   ", "# only a comment", "\n\n"])
async def test_empty_and_comment_commands(shell: ShellSession, command: str) -> None:
    result = await shell.run(command)
    assert (result.output, result.exit_code) == ("", 0)


async def test_syntax_error(shell: ShellSession) -> None:
    result = await shell.run("if then fi (")
    assert result.exit_code == 2
    assert "syntax error" in result.output
    assert (await shell.run("echo ok")).output == "ok\n"


async def test_background_server_reached_later(shell: ShellSession) -> None:
    started = await shell.run("python3 -m http.server 18765 --bind 127.0.0.1 >/dev/null 2>&1 &")
    assert started.exit_code == 0
    result = await shell.run(
        "for i in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/18765) 2>/dev/null && break; "
        "sleep 0.1; done; exec 3<>/dev/tcp/127.0.0.1/18765; "
        "printf 'GET / HTTP/1.0\\r\\n\\r\\n' >&3; head -1 <&3; exec 3<&-",
        timeout=30,
    )
    assert result.output.startswith("HTTP/1.0 200")


async def test_read_prompt_answered(shell: ShellSession) -> None:
    result = await shell.run("read -p 'your name? ' name; echo \"hello $name\"")
    assert result.waiting_for_input
    assert result.exit_code is None
    assert "your name? " in result.output
    answered = await shell.send_input("rollserve\n")
    assert (answered.output, answered.exit_code) == ("hello rollserve\n", 0)


async def test_program_waiting_for_input_can_be_interrupted(shell: ShellSession) -> None:
    result = await shell.run("cat")
    assert result.waiting_for_input
    interrupted = await shell.interrupt()
    assert not interrupted.waiting_for_input
    assert (await shell.run("echo ok")).output == "ok\n"


async def test_nul_byte_is_rejected(shell: ShellSession) -> None:
    with pytest.raises(InvalidCommandError, match="NUL"):
        await shell.run("echo a\x00b")


async def test_cancelled_command_closes_the_session(shell: ShellSession) -> None:
    task = asyncio.create_task(shell.run("sleep 1000", timeout=None))
    await asyncio.sleep(0.2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not shell.alive
    with pytest.raises(ShellExitedError, match="closed"):
        await shell.run("echo hi")
