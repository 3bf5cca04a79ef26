"""``rollserve demo``: what this build of rollserve can do, shown on this machine."""

from __future__ import annotations

from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from rollserve.bench.startup import check_backends
from rollserve.sandbox import SandboxManager, spec_for
from rollserve.schema.sandbox import BackendCheck
from rollserve.settings import Settings
from rollserve.shell import ShellSession

_SESSION = [
    "echo hello from $(hostname); id -u; pwd",
    "cd /tmp && export GREETING=persisted",
    'echo "cwd=$(pwd) GREETING=$GREETING"',
    "python3 -c 'print(sum(range(10)))' 2>/dev/null || echo no python here",
    "cat > notes.txt <<'EOF'\nwritten by a heredoc\nEOF\ncat notes.txt",
    "curl -sS --max-time 2 http://127.0.0.1:9 2>&1 | head -1; ip -brief link 2>/dev/null "
    "|| cat /proc/net/dev | tail -n +3 | cut -d: -f1",
    "sleep 30",
    "echo still usable after the timeout",
]


def check_table(checks: list[BackendCheck], title: str | None = None) -> Table:
    """``rollserve sandbox check`` as a table."""
    table = Table("backend", "available", "start p50 (ms)", "note", title=title)
    for c in checks:
        start = f"{c.start_p50_ms:.1f}" if c.start_p50_ms is not None else "-"
        table.add_row(c.name, "yes" if c.available else "no", start, c.reason)
    return table


async def run_demo(settings: Settings, console: Console) -> None:
    """Sandbox check, then a short session in the default backend with its timings."""
    async with SandboxManager(settings) as manager:
        checks = await check_backends(manager, starts=3)
        console.print(check_table(checks, title="sandbox check"))
        backend = settings.default_sandbox_backend
        sandbox = await manager.start(spec_for(backend))
        session = await ShellSession.open(sandbox)
        console.print(
            f"\n[bold]a persistent shell in a {backend} sandbox[/bold] "
            f"(workspace {sandbox.guest_workspace}, network off)"
        )
        try:
            for command in _SESSION:
                result = await session.run(command, timeout=2)
                status = (
                    "timed out, interrupted" if result.timed_out else f"exit {result.exit_code}"
                )
                console.print(
                    Panel(
                        result.output.rstrip() or "(no output)",
                        title=f"$ {command.splitlines()[0]}",
                        subtitle=f"{status} · {result.duration_s * 1000:.1f} ms",
                        title_align="left",
                        subtitle_align="right",
                    )
                )
        finally:
            await session.close()
            await manager.close(sandbox)
        console.print("sandbox closed: its processes, cgroup and directory are gone")
