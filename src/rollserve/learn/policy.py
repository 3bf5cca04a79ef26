"""The policy ``rollserve bench learn`` starts from: the tiny model, taught the tool format by
imitation before reinforcement learning, as an instruct model knows its tools before it is
trained on a task.

The imitation episodes are those of a *random reader*: it ``cat``s one of the thirteen files at
random, whatever the question says, then submits the number it read. So the starting policy
knows how to call ``bash`` and ``submit`` and to copy a number a command printed, but not which
file to read: it scores about one in thirteen. Learning to read ``answer.txt`` is left to the
reinforcement learning. The episodes come after a short curriculum on the copy alone (a
command's output, then the submit call that repeats it, after a filler of prompt words):
copying is found far sooner in short snippets than across a whole episode, and carries over to
it. Everything is rendered with rollserve's own chat-template accounting, token for token as
the tool agent shows it to the model."""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from rollserve.agents.tools import tool_schemas
from rollserve.learn.tasks import FILES, SECRET, LookupInstance, instances
from rollserve.llm.templates import ChatTemplate
from rollserve.llm.toolcalls import HermesParser
from rollserve.tasks.lookup import SYSTEM_PROMPT

TOOLS = ["bash", "submit"]


@dataclass
class WarmStart:
    """What the imitation phase did, and how the result behaves (sampled, temperature 1)."""

    copy_steps: int
    steps: int
    seconds: float
    final_loss: float
    reward: float  # share of sampled episodes that submit the secret
    reads_secret: float  # share whose command reads answer.txt
    copies: float  # of episodes that read a file, the share that submit its number


def call_text(name: str, arguments: dict[str, Any]) -> str:
    """A tool call as the hermes parser reads it, ended by the template's end token."""
    body = json.dumps({"name": name, "arguments": arguments})
    return f"<tool_call>\n{body}\n</tool_call><|im_end|>"


def observation(text: str) -> str:
    """What the bash tool answers to ``cat`` of a file holding ``text``."""
    return f"{text.rstrip(chr(10))}\n[exit code 0]"


def read_call(name: str) -> str:
    return call_text("bash", {"command": f"cat {name}.txt"})


Episode = tuple[list[int], list[int]]  # token ids, loss mask (1 on the model's turns)


class EpisodeRenderer:
    """Episodes of the random reader as token ids with a loss mask."""

    def __init__(self, model_dir: Path) -> None:
        self.template = ChatTemplate(str(model_dir))
        self.tools = tool_schemas(TOOLS)
        seen = set(self.prompt(instances("train", 1, 0)[0]))
        self.words = sorted(w for w in seen if not any(c.isdigit() for c in self.decode(w)))

    def decode(self, token: int) -> str:
        return self.template.decode([token])

    def prompt(self, instance: LookupInstance) -> list[int]:
        messages = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": instance.prompt},
        ]
        return self.template.prompt_ids(messages, self.tools)

    def after(self, turn: list[int], printed: str) -> list[int]:
        """The tokens between a ``cat`` call and the next turn: what it printed."""
        message = {"role": "tool", "name": "bash", "content": observation(printed)}
        return self.template.suffix_ids([message], self.tools, generated_tail=turn)

    def snippet(self, rng: random.Random, instance: LookupInstance) -> Episode:
        """The copy alone, after a filler of prompt words (no digits): a number read, then the
        submit call that repeats it."""
        filler = [rng.choice(self.words) for _ in range(rng.randint(0, 40))]
        number = instance.answer
        context = filler + self.after(self.template.encode(read_call(rng.choice(FILES))), number)
        call = self.template.encode(call_text("submit", {"answer": number}))
        return context + call, [0] * len(context) + [1] * len(call)

    def episode(self, instance: LookupInstance, read: str) -> Episode:
        """The reader's episode when it reads ``read``."""
        prompt = self.prompt(instance)
        first = self.template.encode(read_call(read))
        between = self.after(first, instance.content(read))
        answer = instance.content(read).strip()
        last = self.template.encode(call_text("submit", {"answer": answer}))
        ids = prompt + first + between + last
        mask = [0] * len(prompt) + [1] * len(first) + [0] * len(between) + [1] * len(last)
        return ids, mask


def warm_start(
    model_dir: Path,
    *,
    copy_steps: int = 300,
    steps: int = 300,
    seed: int = 0,
    batch: int = 16,
    lr: float = 3e-3,
) -> WarmStart:
    """Teach the model in ``model_dir`` the copy (``copy_steps`` batches of snippets), then
    the random reader's episodes (``steps`` batches); save it in place."""
    renderer = EpisodeRenderer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    rng = random.Random(f"warm-{seed}")
    pool = instances("train", 512, seed)
    pad = int(model.config.pad_token_id or 0)
    started, loss_value = time.monotonic(), float("nan")
    for step in range(copy_steps + steps):
        if step < copy_steps:
            episodes = [renderer.snippet(rng, rng.choice(pool)) for _ in range(2 * batch)]
        else:
            names = (SECRET, *FILES)
            episodes = [renderer.episode(rng.choice(pool), rng.choice(names)) for _ in range(batch)]
        loss = _loss(model, episodes, pad)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        loss_value = float(loss.detach())
    seconds = time.monotonic() - started
    model.train(False)
    model.save_pretrained(model_dir)
    behaviour = explore(model, renderer, instances("train", 48, seed + 1))
    return WarmStart(copy_steps, steps, round(seconds, 2), round(loss_value, 4), *behaviour)


def _loss(model: PreTrainedModel, episodes: list[Episode], pad: int) -> Any:
    width = max(len(ids) for ids, _ in episodes)
    ids = torch.full((len(episodes), width), pad, dtype=torch.long)
    labels = torch.full((len(episodes), width), -100, dtype=torch.long)
    attention = torch.zeros((len(episodes), width), dtype=torch.long)
    for row, (tokens, mask) in enumerate(episodes):
        ids[row, : len(tokens)] = torch.tensor(tokens)
        attention[row, : len(tokens)] = 1
        kept = [t if m else -100 for t, m in zip(tokens, mask, strict=True)]
        labels[row, : len(tokens)] = torch.tensor(kept)
    return model(input_ids=ids, attention_mask=attention, labels=labels).loss


def explore(
    model: PreTrainedModel, renderer: EpisodeRenderer, sample: list[LookupInstance]
) -> tuple[float, float, float]:
    """Play each instance with the model (temperature 1, at most two turns, the files as
    ``cat`` shows them): the share rewarded, the share that read ``answer.txt``, and the share
    of reads whose number is then submitted."""
    generator = torch.Generator().manual_seed(0)
    rewarded = secret = reads = copies = 0
    for instance in sample:
        prompt = renderer.prompt(instance)
        first = _sample(model, prompt, generator)
        command = str(_arguments(renderer.template.decode(first)).get("command", ""))
        name = command.removeprefix("cat ").removesuffix(".txt")
        if name not in instance.numbers:
            continue
        reads += 1
        secret += name == SECRET
        context = prompt + first + renderer.after(first, instance.content(name))
        answer = _arguments(renderer.template.decode(_sample(model, context, generator)))
        copies += answer.get("answer") == instance.content(name).strip()
        rewarded += answer.get("answer") == instance.answer
    return (
        round(rewarded / len(sample), 3),
        round(secret / len(sample), 3),
        round(copies / max(reads, 1), 3),
    )


def _sample(model: PreTrainedModel, prompt: list[int], generator: torch.Generator) -> list[int]:
    end = int(model.config.eos_token_id)
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(48):
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
            token = int(torch.multinomial(torch.softmax(logits, -1), 1, generator=generator))
            ids.append(token)
            if token == end:
                break
    return ids[len(prompt) :]


def _arguments(text: str) -> dict[str, Any]:
    """The first tool call's arguments, read by the tool agent's own parser (empty when the
    turn has no well-formed call)."""
    parsed = HermesParser().parse(text.removesuffix("<|im_end|>"))
    return parsed.calls[0].arguments if parsed.calls else {}
