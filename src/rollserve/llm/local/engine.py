"""A causal LM on the CPU (transformers, float32): token ids in, token ids and logprobs out;
the engine behind rollserve's local development inference server."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache, PreTrainedTokenizerBase

from rollserve.errors import InvalidInputError

FinishReason = Literal["stop", "length", "abort"]


@dataclass
class Generation:
    """What one request generated: the ids exactly as sampled, each with its logprob."""

    token_ids: list[int]
    logprobs: list[float]  # log_softmax of the logits: raw, or after temperature (processed)
    finish_reason: FinishReason
    stop_token_id: int | None = None  # the id that ended it, when finish_reason is "stop"
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)


class LocalEngine:
    """One model on the CPU, serving one request at a time (callers serialise the calls)."""

    def __init__(
        self, model: Path | str, *, gguf_file: str | None = None, model_name: str | None = None
    ) -> None:
        path = Path(model)
        if path.is_file() and path.suffix == ".gguf" and gguf_file is None:
            path, gguf_file = path.parent, path.name
        self.model_name = model_name or (gguf_file or path.name).removesuffix(".gguf")
        self.tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(
            path, gguf_file=gguf_file
        )
        # from_pretrained leaves the model in eval mode.
        self.model = AutoModelForCausalLM.from_pretrained(
            path, gguf_file=gguf_file, dtype=torch.float32
        )
        self.max_model_len = _context_length(self.model.config, self.tokenizer)
        self.eos_token_ids = frozenset(_eos_ids(self.tokenizer, self.model.generation_config))
        self.vocab_size = int(self.model.config.vocab_size)
        # transformers renamed ``past_key_values`` to ``cache`` during 5.x.
        forward = inspect.signature(self.model.forward).parameters
        self._cache_arg = "cache" if "cache" in forward else "past_key_values"

    def generate(
        self,
        prompt_ids: list[int],
        *,
        max_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = -1,
        min_p: float = 0.0,
        seed: int | None = None,
        stop_token_ids: Sequence[int] = (),
        top_logprobs: int = 0,
        processed_logprobs: bool = False,
        aborted: Callable[[], bool] = lambda: False,
    ) -> Generation:
        """Generate up to ``max_tokens`` ids after ``prompt_ids``; an end or stop id ends the
        generation and is part of it (as vLLM returns it). ``aborted`` is asked before each
        token: when it answers True the generation ends as ``abort`` with what it has."""
        self._check(prompt_ids, max_tokens)
        stops = self.eos_token_ids | frozenset(stop_token_ids)
        generator = torch.Generator()
        if seed is None:
            generator.seed()
        else:
            generator.manual_seed(seed)
        out = Generation(token_ids=[], logprobs=[], finish_reason="length")
        cache = DynamicCache()
        inputs = torch.tensor([prompt_ids], dtype=torch.long)
        with torch.inference_mode():
            for _ in range(max_tokens):
                if aborted():
                    out.finish_reason = "abort"
                    break
                kwargs = {self._cache_arg: cache}
                result = self.model(input_ids=inputs, use_cache=True, logits_to_keep=1, **kwargs)
                logits = result.logits[0, -1].float()
                token = _sample(logits, temperature, top_p, top_k, min_p, generator)
                scaled = logits / temperature if processed_logprobs and temperature > 0 else logits
                logprobs = torch.log_softmax(scaled, dim=-1)
                out.token_ids.append(token)
                out.logprobs.append(float(logprobs[token]))
                if top_logprobs:
                    values, ids = torch.topk(logprobs, min(top_logprobs, logprobs.numel()))
                    out.top_logprobs.append(
                        [(int(i), float(v)) for i, v in zip(ids, values, strict=True)]
                    )
                if token in stops:
                    out.finish_reason, out.stop_token_id = "stop", token
                    break
                inputs = torch.tensor([[token]], dtype=torch.long)
        return out

    def load_weights(self, path: Path | str) -> None:
        """Replace the model's weights with a checkpoint of the same architecture (a weight
        update)."""
        update = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        try:
            self.model.load_state_dict(update.state_dict())
        except RuntimeError as exc:
            raise InvalidInputError(
                f"the weights at {path} do not fit the served model: {exc}", field="model_path"
            ) from exc

    def _check(self, prompt_ids: list[int], max_tokens: int) -> None:
        if not prompt_ids:
            raise InvalidInputError("the prompt is empty", field="prompt")
        bad = [i for i in prompt_ids if not 0 <= i < self.vocab_size]
        if bad:
            raise InvalidInputError(
                f"token ids out of the vocabulary (size {self.vocab_size}): {bad[:5]}",
                field="prompt",
            )
        if max_tokens < 0:
            raise InvalidInputError("max_tokens must not be negative", field="max_tokens")
        if len(prompt_ids) + max_tokens > self.max_model_len:
            raise InvalidInputError(
                f"this model's maximum context length is {self.max_model_len} tokens; the request"
                f" has {len(prompt_ids)} prompt tokens and asks for {max_tokens} more",
                field="max_tokens",
            )


def _sample(
    logits: torch.Tensor,
    temperature: float,
    top_p: float,
    top_k: int,
    min_p: float,
    gen: torch.Generator,
) -> int:
    if temperature <= 0:
        return int(torch.argmax(logits))
    if 0 < top_k < logits.numel():
        logits = logits.masked_fill(logits < torch.topk(logits, top_k).values[-1], -torch.inf)
    probs = torch.softmax(logits / temperature, dim=-1)
    if min_p > 0:
        probs = probs.masked_fill(probs < min_p * probs.max(), 0.0)
        probs = probs / probs.sum()
    if top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        # Keep the smallest prefix whose mass reaches top_p (the top token always stays).
        drop = torch.cumsum(sorted_probs, dim=-1) - sorted_probs >= top_p
        sorted_probs[drop] = 0.0
        pick = torch.multinomial(sorted_probs, 1, generator=gen)
        return int(order[pick])
    return int(torch.multinomial(probs, 1, generator=gen))


def _context_length(config: object, tokenizer: PreTrainedTokenizerBase) -> int:
    length = int(getattr(config, "max_position_embeddings", 0) or 0) or 2048
    # Tokenizers without a limit report a huge sentinel (int(1e30)); only a real one counts.
    declared = getattr(tokenizer, "model_max_length", None)
    if isinstance(declared, int) and 0 < declared < 1_000_000:
        length = min(length, declared)
    return length


def _eos_ids(tokenizer: PreTrainedTokenizerBase, generation_config: object) -> set[int]:
    ids: set[int] = set()
    if isinstance(tokenizer.eos_token_id, int):
        ids.add(tokenizer.eos_token_id)
    configured = getattr(generation_config, "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif isinstance(configured, list):
        ids.update(i for i in configured if isinstance(i, int))
    return ids
