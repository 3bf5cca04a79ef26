"""The task family ``rollserve bench learn`` trains on: ``lookup`` tasks whose workspace holds
thirteen files, each with a number: the secret in ``answer.txt``, decoys in the twelve others.

The answer exists only in the sandbox (a number drawn for each instance), so a policy that does
not run commands there cannot score, and a file read at random is the right one time in
thirteen. What pays is a two-turn strategy: read ``answer.txt``, submit the number it holds.
Training and held-out instances draw their numbers from disjoint sets, so no held-out answer is
ever seen in training."""

from __future__ import annotations

import random
import string
from dataclasses import dataclass
from typing import Any, Literal

# Each name is one token of the tiny model's tokenizer (after a space), so choosing the file to
# read is one token's choice.
FILES = (
    "brown", "lazy", "quick", "world", "main", "setup",
    "course", "step", "brief", "jumps", "over", "again",
)  # fmt: skip
SECRET = "answer"
QUESTION = "Case {case}: what is the secret number? It is written in the file answer.txt."
NUMBERS = range(100, 1000)

Split = Literal["train", "heldout"]


@dataclass(frozen=True)
class LookupInstance:
    """One task instance: a distinct number in each file, the secret in ``answer.txt``."""

    case: str
    numbers: dict[str, int]

    @property
    def prompt(self) -> str:
        return QUESTION.format(case=self.case)

    @property
    def answer(self) -> str:
        return str(self.numbers[SECRET])

    def content(self, name: str) -> str:
        """What ``cat NAME.txt`` prints in this instance's workspace."""
        return f"{self.numbers[name]}\n"

    def files(self) -> dict[str, str]:
        return {f"{name}.txt": self.content(name) for name in self.numbers}

    def task(self) -> dict[str, Any]:
        """The rollserve task (kind ``lookup``)."""
        return {
            "task_id": f"lookup-{self.case}",
            "kind": "lookup",
            "prompt": self.prompt,
            "files": self.files(),
            "answer": self.answer,
        }


def split_numbers(split: Split) -> list[int]:
    """The numbers of a split: the two halves of a fixed shuffle of 100 to 999, so that both
    use every digit (a token) and share no number."""
    numbers = list(NUMBERS)
    random.Random("lookup-numbers").shuffle(numbers)
    half = len(numbers) // 2
    return sorted(numbers[:half] if split == "train" else numbers[half:])


def instances(split: Split, count: int, seed: int) -> list[LookupInstance]:
    """``count`` instances of ``split``; every case name is unique across both splits for a
    seed."""
    rng = random.Random(f"{seed}-{split}")
    pool = split_numbers(split)
    out, cases = [], set()
    names = (SECRET, *FILES)
    for _ in range(count):
        numbers = dict(zip(names, rng.sample(pool, len(names)), strict=True))
        case = ""
        while not case or case in cases:
            case = f"{'t' if split == 'train' else 'h'}{_letters(rng, 3)}"
        cases.add(case)
        out.append(LookupInstance(case=case, numbers=numbers))
    return out


def _letters(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(n))
