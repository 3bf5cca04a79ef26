"""The baseline of ``rollserve bench store``: the store's lifecycle of one job driven by
``pgbench``, PostgreSQL's own C client, against the same server.

``store_lifecycle.sql`` beside this module holds the same statements as the store sends for a
round of a node's lifecycles, in the same order, written in pgbench's script language (its
comments say which store call each one is; :func:`lifecycle_script` writes out the statements
made once for each job of the round), in sessions with the store's settings. pgbench adds no
client work of its own to speak of: what rollserve reaches of its figure is what the store's
Python side leaves of the server's capacity.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import psycopg

from rollserve.errors import InfrastructureError, InvalidInputError
from rollserve.fixtures.postgres import postgres_bin
from rollserve.storage.postgres.dialect import SESSION_SETTINGS

# The jobs pgbench's lifecycles submit: their ids start so ('pg-' CLIENT '-' RANDOM).
_PREFIX = "pg-"


@dataclass(frozen=True)
class PgbenchStep:
    """One client count of the baseline."""

    clients: int
    lifecycles: int
    seconds: float

    @property
    def lifecycles_per_s(self) -> float:
        return self.lifecycles / self.seconds if self.seconds > 0 else 0.0


_SCRIPT = resources.files("rollserve.bench").joinpath("store_lifecycle.sql")


def lifecycle_script(batch: int) -> str:
    """The pgbench script of a round of ``batch`` jobs' lifecycles: the template's "@each"
    parts written once per job the claim may have taken, the "@once" parts once."""
    if batch < 1:
        raise InvalidInputError(f"a round carries at least 1 job, not batch={batch}")
    head, *parts = re.split(r"^-- @(each|once)\n", _SCRIPT.read_text(), flags=re.MULTILINE)
    script = [head]
    for kind, text in zip(parts[::2], parts[1::2], strict=True):
        if kind == "once":
            script.append(text)
            continue
        for n in range(1, batch + 1):
            script.append(f"\\if :got >= {n}\n{text.replace('[@]', f'[{n}]')}\\endif\n")
    return "".join(script)


def pgbench_path() -> Path | None:
    """Where ``pgbench`` is: beside the newest PostgreSQL server's binaries, or on PATH."""
    server = postgres_bin()
    if server is not None and (server / "pgbench").is_file():
        return server / "pgbench"
    found = shutil.which("pgbench")
    return Path(found) if found else None


def run_pgbench(
    url: str,
    clients: int,
    seconds: float,
    request_bytes: int = 0,
    output_bytes: int = 0,
    batch: int = 1,
) -> PgbenchStep:
    """``clients`` pgbench clients running rounds of ``batch`` lifecycles for ``seconds``
    (whole seconds, at least one) against the store's database at ``url``, with requests and
    run outputs of that many bytes of text; the lifecycles that ended (their jobs reached
    ``done``) per second of pgbench's own clock."""
    binary = pgbench_path()
    if binary is None:
        raise InfrastructureError("pgbench is not installed (Debian: apt install postgresql)")
    script = lifecycle_script(batch)
    before = _done(url)
    # pgbench's sessions are set up as the store's are.
    options = " ".join(f"-c {name}={value}" for name, value in SESSION_SETTINGS.items())
    env = {**os.environ, "PGOPTIONS": f"{os.environ.get('PGOPTIONS', '')} {options}".strip()}
    with tempfile.NamedTemporaryFile("w", suffix=".sql", prefix="lifecycle-") as file:
        file.write(script)
        file.flush()
        command = [
            str(binary), "--no-vacuum", "--protocol=prepared", f"--client={clients}",
            f"--jobs={min(clients, os.cpu_count() or 1)}", f"--time={max(1, round(seconds))}",
            f"--define=batch={batch}", f"--define=request_bytes={request_bytes}",
            f"--define=output_bytes={output_bytes}", f"--file={file.name}", url,
        ]  # fmt: skip
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=seconds + 120, env=env
        )
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip()[-2000:]
        raise InfrastructureError(f"pgbench failed (exit {done.returncode}): {said}")
    processed = _figure(done.stdout, r"number of transactions actually processed: (\d+)")
    tps = _figure(done.stdout, r"tps = ([\d.]+) \(without initial connection time\)")
    elapsed = processed / tps if tps > 0 else 0.0
    return PgbenchStep(clients=clients, lifecycles=_done(url) - before, seconds=elapsed)


def vacuum(url: str) -> None:
    """VACUUM the jobs table: each run starts without the dead rows of the one before (every
    lifecycle leaves some, and the store's scans of waiting jobs pass over them until a
    vacuum)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM jobs")


def _done(url: str) -> int:
    """How many of pgbench's jobs have ended."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM jobs WHERE stage = 'done' AND job_id LIKE %s",
            (_PREFIX + "%",),
        ).fetchone()
    return int(row[0]) if row else 0


def _figure(output: str, pattern: str) -> float:
    found = re.search(pattern, output)
    if found is None:
        raise InfrastructureError(f"pgbench printed no {pattern!r}: {output[-1000:]}")
    return float(found.group(1))
