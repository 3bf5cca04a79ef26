"""A tiny Llama with a BPE tokenizer trained on the spot: a real Hugging Face model directory,
built in about a second without a download, whose decode → re-encode is lossy."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"
MAX_LENGTH = 2048
VOCAB_SIZE = 1000

# Qwen2.5's ChatML template, with no default system prompt, and tool-call arguments that are
# already a JSON string (the OpenAI wire format) rendered as they are, not encoded twice.
CHAT_TEMPLATE = """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\\n\\n' }}
    {%- endif %}
    {{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n' }}
    {{- 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}
    {%- for tool in tools %}
        {{- '\\n' + (tool | tojson) }}
    {%- endfor %}
    {{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and ' }}
    {{- 'arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n' }}
    {{- '{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'user' or (message.role == 'system' and not loop.first)
        or (message.role == 'assistant' and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
    {%- elif message.role == 'assistant' %}
        {{- '<|im_start|>assistant' }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for call in message.tool_calls %}
            {%- if call.function is defined %}
                {%- set call = call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' + call.name + '", "arguments": ' }}
            {%- if call.arguments is string %}
                {{- call.arguments }}
            {%- else %}
                {{- call.arguments | tojson }}
            {%- endif %}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

CORPUS = """\
<|im_start|>system
You are a helpful assistant. Answer briefly and use the tools when they help.<|im_end|>
<|im_start|>user
Hello! Can you list the files in the current directory?<|im_end|>
<|im_start|>assistant
Sure, I will run a command to list them.
<tool_call>
{"name": "bash", "arguments": {"command": "ls"}}
</tool_call><|im_end|>
<|im_start|>user
<tool_response>
README.md  setup.py  src  tests
</tool_response><|im_end|>
<|im_start|>assistant
The directory holds README.md, setup.py, src and tests.<|im_end|>
<|im_start|>user
What is 12 + 30? And what is 7 * 8?<|im_end|>
<|im_start|>assistant
12 + 30 = 42 and 7 * 8 = 56. The answers are 42 and 56.<|im_end|>
Let me compute: 3 + 4 = 7, 10 - 6 = 4, 9 * 9 = 81, 144 / 12 = 12, 2 ** 10 = 1024.
The sum of 1, 2, 3, 4 and 5 is 15. Half of 100 is 50. 0.5 + 0.25 = 0.75.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 25 50 75 99 100 1000 2024.
{"name": "bash", "arguments": {"command": "cat README.md"}}
{"name": "bash", "arguments": {"command": "python -m pytest -q tests"}}
{"name": "editor", "arguments": {"command": "view", "path": "src/app.py"}}
{"name": "editor", "arguments": {"command": "str_replace", "path": "a.py", "old_str": "x"}}
{"name": "submit", "arguments": {"answer": "42"}}
$ ls -la
$ cd src && grep -rn "def main" .
$ git diff --stat
$ python3 -c "print(1 + 1)"
$ pip install -e . && pytest -x
$ find . -name "*.py" | head -n 20
$ echo "hello world" > out.txt; cat out.txt
The quick brown fox jumps over the lazy dog. I think the answer is correct.
Thank you for the question. Let me think step by step before I answer.
First, read the file. Then, fix the bug in the function and run the tests again.
The tests pass now. I have finished the task and will submit the answer.
Could you explain what this error means? The function returns None instead of a list.
Of course! The error means the variable was not defined before it was used.
"""


def _train_tokenizer(digits: bool) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    if digits:  # each digit its own token, as in Qwen's and Llama 2's tokenizers
        split = pre_tokenizers.Split(Regex(r"\d"), behavior="isolated")
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([split, byte_level])
    else:
        tokenizer.pre_tokenizer = byte_level
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS.splitlines(keepends=True) * 2, trainer=trainer)
    return tokenizer


def build_tiny_model(path: Path, *, seed: int = 0, learner: bool = False) -> Path:
    """Write the tiny model (config, weights, tokenizer, chat template) into ``path``.

    The default's large random weights give peaked next-token distributions, like a trained
    model's, for tests of the plumbing. ``learner`` builds the variant meant to be trained:
    small initial weights, input and output embeddings shared, and a tokenizer that gives each
    digit its own token (a number is then copied digit by digit, one skill for every number)."""
    trained = _train_tokenizer(digits=learner)
    eos_id, pad_id = trained.token_to_id(EOS_TOKEN), trained.token_to_id(PAD_TOKEN)
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=trained,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        model_max_length=MAX_LENGTH,
        chat_template=CHAT_TEMPLATE,
    )
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=MAX_LENGTH,
        tie_word_embeddings=learner,
        initializer_range=0.02 if learner else 0.3,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(  # type: ignore[no-untyped-call]
        eos_token_id=eos_id, pad_token_id=pad_id
    )
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def tiny_model_dir(cache: Path, *, seed: int = 0, learner: bool = False) -> Path:
    """The tiny model under ``cache``: built once, then reused (a marker file says complete)."""
    target = cache / f"tiny-llama-seed{seed}{'-learner' if learner else ''}"
    marker = target / "rollserve-tiny.json"
    if marker.is_file():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename, so a concurrent or interrupted build never leaves a
    # half-written directory behind the marker.
    staging = Path(tempfile.mkdtemp(prefix=".tiny-", dir=cache))
    try:
        build_tiny_model(staging, seed=seed, learner=learner)
        (staging / marker.name).write_text(json.dumps({"seed": seed, "learner": learner}))
        try:
            staging.rename(target)
        except OSError:
            if not marker.is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
