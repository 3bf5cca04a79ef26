"""The ``rollserve`` command's entry point: says how to install the server side when only the
client is installed."""

from __future__ import annotations

import sys


def main() -> None:
    """Run the CLI, or exit with what to install."""
    try:
        from rollserve.cli.app import main as run
    except ModuleNotFoundError as exc:
        sys.exit(
            f"rollserve: the command needs the server side, which is not installed ({exc.name} "
            "is missing): pip install 'rollserve[server]'"
        )
    run()
