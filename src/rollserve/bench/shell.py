"""``rollserve bench shell``: a persistent PTY versus tmux polling versus ``bash -c`` per command.

Every method runs inside the same sandbox. The PTY figure is measured from rollserve itself
(``ShellSession.run``), all its overhead included. tmux and ``bash -c`` are driven by a bash
loop inside the sandbox — the most favourable place for them, as no sandbox start is counted.
"""

from __future__ import annotations

import statistics
import time

from rollserve.errors import RollserveError
from rollserve.sandbox import SandboxInstance, SandboxManager, spec_for
from rollserve.schema.bench import ShellBenchResult, ShellMethod
from rollserve.shell import ShellSession

# Times each iteration in microseconds with bash's own clock; prints one figure per line.
_TMUX_DRIVER = r"""
set -e
# A directory of this run's own: /tmp is the host's on the local backend, shared by users.
dir=$(mktemp -d); sock=$dir/tmux.sock; trap 'rm -rf "$dir"' EXIT
tmux -S $sock new-session -d -s b -x 200 -y 50 'bash --noprofile --norc'
tmux -S $sock send-keys -t b 'true' Enter; sleep 0.2
for i in $(seq 1 {n}); do
  s=${EPOCHREALTIME/./}
  tmux -S $sock send-keys -t b "true; echo __M$i" Enter
  until tmux -S $sock capture-pane -p -t b | grep -qx "__M$i"; do sleep 0.01; done
  e=${EPOCHREALTIME/./}; echo $((e - s))
done
tmux -S $sock kill-server
"""

_BASH_C_DRIVER = r"""
for i in $(seq 1 {n}); do
  s=${EPOCHREALTIME/./}; bash -c true; e=${EPOCHREALTIME/./}; echo $((e - s))
done
"""


def _summary(backend: str, method: ShellMethod, samples_ms: list[float]) -> ShellBenchResult:
    ordered = sorted(samples_ms)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return ShellBenchResult(
        backend=backend,
        method=method,
        p50_ms=round(statistics.median(ordered), 3),
        p99_ms=round(p99, 3),
        n=len(ordered),
    )


async def _pty(sandbox: SandboxInstance, n: int) -> list[float]:
    session = await ShellSession.open(sandbox)
    try:
        for _ in range(min(20, n)):  # warm-up
            await session.run("true")
        samples = []
        for _ in range(n):
            start = time.perf_counter()
            await session.run("true")
            samples.append((time.perf_counter() - start) * 1000)
        return samples
    finally:
        await session.close()


async def _driver(sandbox: SandboxInstance, script: str, n: int) -> list[float]:
    result = await sandbox.exec(script.replace("{n}", str(n)), timeout=600)
    if result.exit_code != 0:
        raise RuntimeError(
            f"benchmark driver failed ({result.exit_code}): {result.stderr.strip()[-300:]}"
        )
    return [int(line) / 1000 for line in result.stdout.split()]


async def bench_shell(
    manager: SandboxManager, backends: list[str], n: int = 200, tmux_n: int = 100
) -> list[ShellBenchResult]:
    """Latency figures per backend and method; unavailable backends are left out."""
    results = []
    for name in backends:
        if not manager.availability(name).available:
            continue
        try:
            sandbox = await manager.start(spec_for(name))
        except RollserveError:
            continue
        try:
            results.append(_summary(name, "pty", await _pty(sandbox, n)))
            if (await sandbox.exec("command -v tmux")).exit_code == 0:
                results.append(_summary(name, "tmux", await _driver(sandbox, _TMUX_DRIVER, tmux_n)))
            results.append(_summary(name, "bash_c", await _driver(sandbox, _BASH_C_DRIVER, n)))
        finally:
            await manager.close(sandbox)
    return results
