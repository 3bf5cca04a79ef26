#!/usr/bin/env python3
"""Rebuild examples/math/tasks.jsonl: competition-math problems (AIME 2024/2025, HMMT 2024/2025)
with reference answers as ``math`` tasks, from the comp-math-24-25 set shipped in the
``nemo-gym`` wheel (NVIDIA, Apache-2.0).

    pip download --no-deps --only-binary=:all: --python-version 3.12 nemo-gym==0.4.0 -d /tmp/ng
    python scripts/make-math-tasks.py --source /tmp/ng/nemo_gym-0.4.0-py3-none-any.whl

``--source`` takes the wheel or the ``compmath_test.jsonl`` inside it. A problem is kept only
when its reference answer is a formula that math-verify parses and verifies against itself:
prose answers ("all primes p such that ..."), sequences with ``\\ldots`` and comma lists that
math-verify would misread (``98,118,122,142`` as one number) are left out.
"""

from __future__ import annotations

import argparse
import json
import re
import zipfile
from pathlib import Path
from typing import Any

from math_verify import parse, verify

DATA_IN_WHEEL = "resources_servers/ns_tools/data/compmath_test.jsonl"
SOURCE = "nemo-gym 0.4.0 (Apache-2.0), " + DATA_IN_WHEEL + " (NeMo-Skills comp-math-24-25)"
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "examples" / "math" / "tasks.jsonl"


def read_source(source: Path) -> list[dict[str, Any]]:
    """The rows of compmath_test.jsonl, from the wheel or the file itself."""
    if source.suffix == ".whl":
        with zipfile.ZipFile(source) as wheel:
            text = wheel.read(DATA_IN_WHEEL).decode("utf-8")
    else:
        text = source.read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def normalized(answer: str) -> str:
    """The answer without a surrounding ``$...$`` pair and a trailing full stop."""
    answer = answer.strip().removesuffix(".").strip()
    if answer.startswith("$") and answer.endswith("$") and answer.count("$") == 2:
        answer = answer[1:-1].strip()
    return answer


def usable(answer: str) -> bool:
    """Whether math-verify reads the answer as the formula it is."""
    if re.search(r"[a-zA-Z]{3,}", re.sub(r"\\[a-zA-Z]+", "", answer)) or "$" in answer:
        return False  # prose, or text mixed with math
    if "\\ldots" in answer or "\\dots" in answer:
        return False
    gold = parse(f"${answer}$", parsing_timeout=None)
    if not gold or not verify(gold, parse(f"${answer}$", parsing_timeout=None)):
        return False
    if "," in answer:  # a list must read as a set with (at least) one element per item
        elements = getattr(gold[0], "args", ())
        return type(gold[0]).__name__ == "FiniteSet" and len(elements) >= answer.count(",") + 1
    return True


def to_task(row: dict[str, Any], answer: str) -> dict[str, Any]:
    metadata: dict[str, Any] = {"source": SOURCE, "subset": row.get("subset_for_metrics")}
    if answer != row["expected_answer"]:
        metadata["original_answer"] = row["expected_answer"]
    if isinstance(row.get("reference_solution"), str):
        metadata["reference_solution"] = row["reference_solution"]
    return {
        "task_id": f"compmath/{row['id']}",
        "kind": "math",
        "prompt": row["question"].strip(),
        "answer": answer,
        "metadata": metadata,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, required=True, help="nemo-gym wheel or .jsonl")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    rows = read_source(args.source)
    kept, left_out = [], []
    for row in rows:
        answer = normalized(row["expected_answer"])
        if usable(answer):
            kept.append(to_task(row, answer))
        else:
            left_out.append(f"{row['id']}: {row['expected_answer']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", encoding="utf-8") as out:
        for task in kept:
            out.write(json.dumps(task, ensure_ascii=False) + "\n")
    print(f"wrote {len(kept)} of {len(rows)} problems to {args.out}; left out:")
    for line in left_out:
        print(f"  {line}")


if __name__ == "__main__":
    main()
