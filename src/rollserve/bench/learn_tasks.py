"""The task family ``rollserve bench learn`` trains on: ``lookup`` tasks whose workspace holds
eight files, each with a random number, and whose question asks for the number in one of them.

The answer exists only in the sandbox, so a policy that does not run a command there cannot
score; reading a wrong file gives a wrong number. Training and held-out instances draw their
numbers from disjoint sets, so no held-out answer is ever seen in training."""

from __future__ import annotations

import random
import string
from dataclasses import dataclass
from typing import Any, Literal

FILES = ("red", "blue", "green", "gold", "gray", "pink", "teal", "plum")
QUESTION = "Case {case}: what number is written in the file {name}.txt?"
NUMBERS = range(100, 1000)

Split = Literal["train", "heldout"]


@dataclass(frozen=True)
class LookupInstance:
    """One task instance: a numbered file per name; the question names one of them."""

    case: str
    target: str
    numbers: dict[str, int]

    @property
    def prompt(self) -> str:
        return QUESTION.format(case=self.case, name=self.target)

    @property
    def answer(self) -> str:
        return str(self.numbers[self.target])

    def files(self) -> dict[str, str]:
        return {f"{name}.txt": f"{number}\n" for name, number in self.numbers.items()}

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
    """The numbers of a split: the two halves of a fixed shuffle of 100 to 999, so that both use
    every digit (a token) and share no number."""
    numbers = list(NUMBERS)
    random.Random("lookup-numbers").shuffle(numbers)
    half = len(numbers) // 2
    return sorted(numbers[:half] if split == "train" else numbers[half:])


def instances(split: Split, count: int, seed: int) -> list[LookupInstance]:
    """``count`` instances of ``split``; each file name is asked about equally often (in turn),
    and every case name is unique across both splits for a seed."""
    rng = random.Random(f"{seed}-{split}")
    pool = split_numbers(split)
    out, cases = [], set()
    for index in range(count):
        numbers = dict(zip(FILES, rng.sample(pool, len(FILES)), strict=True))
        case = ""
        while not case or case in cases:
            case = f"{'t' if split == 'train' else 'h'}{_letters(rng, 3)}"
        cases.add(case)
        out.append(LookupInstance(case=case, target=FILES[index % len(FILES)], numbers=numbers))
    rng.shuffle(out)
    return out


def _letters(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(n))
