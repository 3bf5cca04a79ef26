"""The tiny test model: what it is made of, its chat template, and its lossy re-tokenization."""

from __future__ import annotations

import json
from pathlib import Path

from transformers import AutoConfig, AutoTokenizer, GenerationConfig

from rollserve.llm.local.engine import LocalEngine
from rollserve.llm.local.tiny_model import build_tiny_model, tiny_model_dir

PLAIN = [{"role": "user", "content": "hi"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]


def test_builds_deterministically_from_the_seed(tmp_path: Path) -> None:
    first = build_tiny_model(tmp_path / "a")
    again = build_tiny_model(tmp_path / "b")
    other = build_tiny_model(tmp_path / "c", seed=1)
    names = sorted(p.name for p in first.iterdir())
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(names)
    for name in names:
        assert (first / name).read_bytes() == (again / name).read_bytes(), name
    weights = "model.safetensors"
    assert (first / weights).read_bytes() != (other / weights).read_bytes()


def test_is_a_tiny_llama_with_a_chatml_tokenizer(
    tiny_engine: LocalEngine, tiny_model: Path
) -> None:
    config = AutoConfig.from_pretrained(tiny_model)
    assert config.model_type == "llama"
    assert (config.hidden_size, config.num_hidden_layers) == (64, 2)
    assert config.max_position_embeddings >= 2048
    params = sum(p.numel() for p in tiny_engine.model.parameters())
    assert 150_000 <= params <= 250_000

    tokenizer = tiny_engine.tokenizer
    assert 300 <= len(tokenizer) <= 1100
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.model_max_length == 2048
    for special in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"):
        assert tokenizer.tokenize(special) == [special]
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert GenerationConfig.from_pretrained(tiny_model).eos_token_id == eos


def test_tiny_model_dir_builds_once(tmp_path: Path) -> None:
    first = tiny_model_dir(tmp_path)
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert tiny_model_dir(tmp_path) == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no staging left behind


def test_template_renders_system_user_and_generation_prompt(tiny_model: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    assert (
        tokenizer.apply_chat_template(PLAIN, tokenize=False) == "<|im_start|>user\nhi<|im_end|>\n"
    )
    messages = [{"role": "system", "content": "Be brief."}, *PLAIN]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_template_renders_tools_tool_calls_and_tool_responses(tiny_model: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Where am I?"},
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [  # OpenAI's arguments are a JSON string; a dict renders the same
                {
                    "type": "function",
                    "function": {"name": "bash", "arguments": '{"command": "ls"}'},
                },
                {"type": "function", "function": {"name": "bash", "arguments": {"command": "pwd"}}},
            ],
        },
        {"role": "tool", "content": "a.py"},
        {"role": "tool", "content": "/root"},
        {"role": "assistant", "content": "In /root."},
    ]
    rendered = tokenizer.apply_chat_template(messages, tools=TOOLS, tokenize=False)
    system, rest = rendered.split("<|im_end|>\n", 1)
    assert system.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    tools_json = system.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0]
    assert json.loads(tools_json) == TOOLS[0]
    assert '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}' in system
    assert rest == (
        "<|im_start|>user\nWhere am I?<|im_end|>\n"
        "<|im_start|>assistant\nLet me look."
        '\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
        '\n<tool_call>\n{"name": "bash", "arguments": {"command": "pwd"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user"
        "\n<tool_response>\na.py\n</tool_response>"
        "\n<tool_response>\n/root\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\nIn /root.<|im_end|>\n"
    )


def test_decode_then_encode_is_lossy_for_generated_output(tiny_engine: LocalEngine) -> None:
    tokenizer = tiny_engine.tokenizer
    prompt = tokenizer.encode("<|im_start|>user\nls<|im_end|>\n<|im_start|>assistant\n")
    lossy = 0
    for seed in range(4):
        out = tiny_engine.generate(prompt, max_tokens=32, temperature=1.0, seed=seed)
        text = tokenizer.decode(out.token_ids)
        if tokenizer.encode(text, add_special_tokens=False) != out.token_ids:
            lossy += 1
    # Re-tokenizing what the model said gives other ids: token mode must keep the ids it got.
    assert lossy >= 3
