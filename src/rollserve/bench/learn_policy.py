"""The policy ``rollserve bench learn`` starts from: the tiny model, taught the tool format by
imitation before reinforcement learning, as an instruct model knows its tools before it is
trained on a task.

The imitation episodes are those of an agent that ``cat``s one of the eight files *at random*
(whatever the question asks) and then submits the number it read. They come after a short
curriculum on the copy alone (a command's output, then the submit call that repeats it, after a
filler of prompt words): copying is found far sooner in short snippets than across a whole
episode, and carries over to it. So the starting policy knows
how to call ``bash`` and ``submit`` and to copy what a command printed, but not which file
answers the question: it scores about 1 in 8. Learning which file to read is left to the
reinforcement learning. The episodes are rendered with rollserve's own chat-template
accounting, token for token as the tool agent will show them to the model."""

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
from rollserve.bench.learn_tasks import FILES, LookupInstance, instances, split_numbers
from rollserve.llm.templates import ChatTemplate
from rollserve.tasks.lookup import SYSTEM_PROMPT

TOOLS = ["bash", "submit"]


@dataclass
class WarmStart:
    """What the imitation phase did, and how well the result follows the format."""

    copy_steps: int
    steps: int
    seconds: float
    final_loss: float
    format_ok: float  # share of sampled episodes whose two calls parse and read a file
    copy_ok: float  # share of those whose submitted answer is the number the file held


def call_text(name: str, arguments: dict[str, Any]) -> str:
    """A tool call as the hermes parser reads it, ended by the template's end token."""
    body = json.dumps({"name": name, "arguments": arguments})
    return f"<tool_call>\n{body}\n</tool_call><|im_end|>"


def observation(number: int) -> str:
    """What the bash tool answers to ``cat`` of a file holding ``number``."""
    return f"{number}\n[exit code 0]"


class EpisodeRenderer:
    """Episodes of the random reader as token ids with a loss mask (1 on the model's turns)."""

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

    def after_read(self, first_turn: list[int], number: int) -> list[int]:
        message = {"role": "tool", "name": "bash", "content": observation(number)}
        return self.template.suffix_ids([message], self.tools, generated_tail=first_turn)

    def snippet(self, rng: random.Random, number: int) -> tuple[list[int], list[int]]:
        """A command's output and the submit call that repeats it, after a filler of words
        of the prompt (no digits), as token ids with a loss mask on the call."""
        filler = [rng.choice(self.words) for _ in range(rng.randint(0, 40))]
        first = self.template.encode(call_text("bash", {"command": "cat a.txt"}))
        context = filler + self.after_read(first, number)
        call = self.template.encode(call_text("submit", {"answer": str(number)}))
        return context + call, [0] * len(context) + [1] * len(call)

    def episode(self, instance: LookupInstance, read: str) -> tuple[list[int], list[int]]:
        number = instance.numbers[read]
        prompt = self.prompt(instance)
        first = self.template.encode(call_text("bash", {"command": f"cat {read}.txt"}))
        middle = self.after_read(first, number)
        second = self.template.encode(call_text("submit", {"answer": str(number)}))
        ids = prompt + first + middle + second
        mask = [0] * len(prompt) + [1] * len(first) + [0] * len(middle) + [1] * len(second)
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
    numbers = split_numbers("train")
    pad = int(model.config.pad_token_id or 0)
    started, loss_value = time.monotonic(), float("nan")
    for step in range(copy_steps + steps):
        if step < copy_steps:
            episodes = [renderer.snippet(rng, rng.choice(numbers)) for _ in range(2 * batch)]
        else:
            episodes = [renderer.episode(rng.choice(pool), rng.choice(FILES)) for _ in range(batch)]
        loss = _loss(model, episodes, pad)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        loss_value = float(loss.detach())
    seconds = time.monotonic() - started
    model.train(False)
    model.save_pretrained(model_dir)
    format_ok, copy_ok = follows_format(model, renderer, instances("train", 32, seed + 1))
    return WarmStart(copy_steps, steps, round(seconds, 2), round(loss_value, 4), format_ok, copy_ok)


def _loss(model: PreTrainedModel, episodes: list[tuple[list[int], list[int]]], pad: int) -> Any:
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


def follows_format(
    model: PreTrainedModel, renderer: EpisodeRenderer, sample: list[LookupInstance]
) -> tuple[float, float]:
    """Sample both turns of each instance (temperature 1): the share whose calls parse and
    read a file, and the share of those that submit the number read."""
    generator = torch.Generator().manual_seed(0)
    parsed = copied = 0
    for instance in sample:
        prompt = renderer.prompt(instance)
        first = _sample(model, prompt, generator)
        command = _arguments(renderer.template.decode(first)).get("command", "")
        read = command.removeprefix("cat ").removesuffix(".txt")
        if read not in instance.numbers:
            continue
        parsed += 1
        context = prompt + first + renderer.after_read(first, instance.numbers[read])
        second = _sample(model, context, generator)
        answer = _arguments(renderer.template.decode(second)).get("answer")
        copied += answer == str(instance.numbers[read])
    return round(parsed / len(sample), 3), round(copied / max(parsed, 1), 3)


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
    start, stop = text.find("{"), text.rfind("}")
    try:
        call = json.loads(text[start : stop + 1])
    except ValueError:
        return {}
    arguments = call.get("arguments") if isinstance(call, dict) else None
    return arguments if isinstance(arguments, dict) else {}
