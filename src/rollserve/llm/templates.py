"""A model's chat template, from its local Hugging Face tokenizer directory: conversations
rendered to token ids, and the token suffix that new messages add to a conversation."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any, cast

from rollserve.errors import InvalidInputError

# A tokenizer's model_max_length above this is transformers' "no limit" placeholder.
_NO_LIMIT = 10**8


class ChatTemplate:
    """Renders a conversation (tools included) exactly as the model was trained to see it."""

    def __init__(self, tokenizer_dir: str) -> None:
        from transformers import AutoTokenizer  # heavy: only where token mode is used

        path = Path(tokenizer_dir)
        if not path.is_dir():
            raise InvalidInputError(
                f"tokenizer directory {tokenizer_dir} does not exist", field="tokenizer"
            )
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        except (OSError, ValueError) as exc:
            raise InvalidInputError(
                f"cannot load a tokenizer from {tokenizer_dir}: {exc}", field="tokenizer"
            ) from exc
        if not getattr(self.tokenizer, "chat_template", None):
            raise InvalidInputError(
                f"the tokenizer in {tokenizer_dir} has no chat template", field="tokenizer"
            )
        self.path = tokenizer_dir
        self.source = str(self.tokenizer.chat_template)  # the template's Jinja text
        limit = int(getattr(self.tokenizer, "model_max_length", 0) or 0)
        self.max_length: int | None = limit if 0 < limit < _NO_LIMIT else None
        self.stop_ids = _stop_ids(path, self.tokenizer.eos_token_id)
        self.vocab_size = _vocab_size(path, len(self.tokenizer))

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        *,
        generation_prompt: bool,
    ) -> str:
        text = self.tokenizer.apply_chat_template(
            messages,
            tools=cast(Any, tools or None),
            tokenize=False,
            add_generation_prompt=generation_prompt,
        )
        return str(text)

    def encode(self, text: str) -> list[int]:
        """Ids of text that already holds its special tokens (templates write their own)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def pieces(self, ids: list[int]) -> list[str]:
        """Each token as the text it stands for (a byte-level piece that is not text on its
        own shows as the tokenizer decodes it)."""
        return [str(self.tokenizer.decode([i], skip_special_tokens=False)) for i in ids]

    def decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=False))

    def prompt_ids(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> list[int]:
        """The first prompt of an episode, up to the assistant's generation prompt."""
        return self.encode(self.render(messages, tools, generation_prompt=True))

    def suffix_ids(
        self,
        new_messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        *,
        generated_tail: list[int],
    ) -> list[int]:
        """The tokens the template puts after a generated assistant turn for ``new_messages``
        (tool results, a user message), up to the next generation prompt.

        Earlier turns are never re-tokenized: the suffix is found on a stand-in conversation
        (what the template adds after an assistant turn is the same whatever it said), and
        the turn's closing text (e.g. ``<|im_end|>\\n``) is completed from where the
        generation stopped — after its end token, or whole when it was cut off."""
        stand_in: list[dict[str, Any]] = [
            {"role": "user", "content": "u"},
            {"role": "assistant", "content": "\x00"},
        ]
        base = self.render(stand_in, tools, generation_prompt=False)
        full = self.render(stand_in + new_messages, tools, generation_prompt=True)
        if not full.startswith(base):
            raise InvalidInputError(
                f"the chat template of {self.path} rewrites earlier turns when messages are "
                "added; token mode needs an append-only template",
                field="tokenizer",
            )
        closing = base[base.rindex("\x00") + 1 :]
        tail = self.decode(generated_tail[-1:]) if generated_tail else ""
        ended = bool(generated_tail) and generated_tail[-1] in self.stop_ids
        if ended and closing.startswith(tail):
            closing = closing[len(tail) :]
        return self.encode(closing + full[len(base) :])


def _stop_ids(path: Path, eos: int | None) -> tuple[int, ...]:
    """The ids that end a turn: the tokenizer's end token and the model's generation-config
    end tokens (chat models often end turns with a token other than the tokenizer's eos)."""
    ids = [] if eos is None else [int(eos)]
    config = path / "generation_config.json"
    if config.is_file():
        try:
            found = json.loads(config.read_text()).get("eos_token_id")
        except (OSError, json.JSONDecodeError):
            found = None
        for value in found if isinstance(found, list) else [found]:
            if isinstance(value, int) and value not in ids:
                ids.append(value)
    return tuple(ids)


def _vocab_size(path: Path, tokens: int) -> int:
    """How many ids the model may generate: the tokenizer's, or the model's embedding rows
    when its config in the same directory says more (tables are often padded: Qwen2.5 has
    151936 rows for 151665 tokens)."""
    config = path / "config.json"
    try:
        found = json.loads(config.read_text()) if config.is_file() else {}
    except (OSError, json.JSONDecodeError):
        found = {}
    sizes = [tokens]
    for section in (found, found.get("text_config")) if isinstance(found, dict) else ():
        size = section.get("vocab_size") if isinstance(section, dict) else None
        if type(size) is int:
            sizes.append(size)
    return max(sizes)


class TemplateCache:
    """Chat templates by tokenizer directory, loaded once per process."""

    def __init__(self) -> None:
        self._templates: dict[str, ChatTemplate] = {}
        self._lock = threading.Lock()

    def get(self, tokenizer_dir: str) -> ChatTemplate:
        with self._lock:
            template = self._templates.get(tokenizer_dir)
            if template is None:
                template = ChatTemplate(tokenizer_dir)
                self._templates[tokenizer_dir] = template
            return template

    async def aget(self, tokenizer_dir: str) -> ChatTemplate:
        """``get`` off the event loop: loading a tokenizer reads and parses files."""
        return await asyncio.to_thread(self.get, tokenizer_dir)
