"""The model-side preparation of ``rollserve demo``, run as a child process
(``python -m rollserve.demo.prepare``) so that a Ctrl-C can stop it at once and torch stays
out of the demo's own process: export a Hugging Face tokenizer directory (with a chat template
that shows the tools to the model) from a GGUF file or a model directory, and build the tiny
test model. Each command prints one JSON object on stdout."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from jinja2 import TemplateError

MARKER = "rollserve-demo-tokenizer.json"
_PROBE_TOOL = "rollserve_probe_tool"
# A chat template that has the ChatML markers can be replaced by one that also renders tools.
_CHATML = ("<|im_start|>", "<|im_end|>")


def _renders_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template shows the tool schemas to the model."""
    probe = [{"type": "function", "function": {"name": _PROBE_TOOL, "parameters": {}}}]
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    try:
        text = tokenizer.apply_chat_template(
            messages, tools=probe, tokenize=False, add_generation_prompt=True
        )
    except (TemplateError, TypeError, ValueError, KeyError, AttributeError):
        return False  # a template that cannot take tools does not render them
    return _PROBE_TOOL in str(text)


def export_tokenizer(source: Path, gguf_file: str | None, out: Path) -> dict[str, Any]:
    """Write the tokenizer of ``source`` (a model directory, or the directory of
    ``gguf_file``) into ``out``, once: a marker records what it was made from. A chat template
    that does not render tools is replaced by a ChatML one that does (Qwen2.5's format, which
    rollserve's ``hermes`` tool-call parser reads) when the vocabulary has the ChatML tokens."""
    origin = {"source": str(source), "gguf_file": gguf_file}
    marker = out / MARKER
    if marker.is_file():
        made = json.loads(marker.read_text())
        if made.get("origin") == origin:
            return {**made, "cached": True}
    from transformers import AutoTokenizer  # heavy: only when there is work to do

    from rollserve.llm.local.tiny_model import CHAT_TEMPLATE

    tokenizer = AutoTokenizer.from_pretrained(str(source), gguf_file=gguf_file)
    own = bool(getattr(tokenizer, "chat_template", None))
    vocab = tokenizer.get_vocab()
    if own and _renders_tools(tokenizer):
        template = "own"
    elif all(token in vocab for token in _CHATML):
        tokenizer.chat_template = CHAT_TEMPLATE
        template = "chatml-tools"
    elif own:
        template = "own-without-tools"
    else:
        raise SystemExit(f"{source}: the tokenizer has no chat template (token mode needs one)")
    made = {"origin": origin, "template": template, "eos_token": tokenizer.eos_token}
    out.parent.mkdir(parents=True, exist_ok=True)
    # Written beside the target and renamed, so an interrupted export leaves no half directory.
    staging = Path(tempfile.mkdtemp(prefix=".tokenizer-", dir=out.parent))
    try:
        tokenizer.save_pretrained(str(staging))
        (staging / MARKER).write_text(json.dumps(made))
        shutil.rmtree(out, ignore_errors=True)
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return {**made, "cached": False}


def build_tiny(cache: Path) -> dict[str, Any]:
    """The tiny test model under ``cache`` (built once)."""
    from rollserve.llm.local.tiny_model import tiny_model_dir

    return {"model_dir": str(tiny_model_dir(cache))}


def main(argv: list[str] | None = None) -> None:
    """``tokenizer --source DIR [--gguf-file NAME] --out DIR`` or ``tiny --cache DIR``."""
    parser = argparse.ArgumentParser(prog="python -m rollserve.demo.prepare")
    commands = parser.add_subparsers(dest="command", required=True)
    tokenizer = commands.add_parser("tokenizer")
    tokenizer.add_argument("--source", type=Path, required=True)
    tokenizer.add_argument("--gguf-file")
    tokenizer.add_argument("--out", type=Path, required=True)
    tiny = commands.add_parser("tiny")
    tiny.add_argument("--cache", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "tokenizer":
        result = export_tokenizer(args.source, args.gguf_file, args.out)
    else:
        result = build_tiny(args.cache)
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
