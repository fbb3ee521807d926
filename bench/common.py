"""What every bench script shares: writing its numbers to `runs/bench/*.json`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_results(out: str | Path, results: Any) -> Path:
    """Write `results` as indented JSON (parents created) and say where."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2))
    print(f"written to {path}")
    return path


def qwen2_from_config(layers: int, hidden: int, seed: int = 0):
    """A randomly initialised Qwen2 model of the given size with the tiny policy's tokenizer (no
    download): (model, tokenizer). Heads of 64 dimensions, 8:1 grouped-query attention."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from toolgym.inference.tiny import build_tiny_policy

    tokenizer = AutoTokenizer.from_pretrained(str(build_tiny_policy()))
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 11 // 4,
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 64),
        num_key_value_heads=max(1, hidden // 512),
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config), tokenizer


def first_prompt_ids(tokenizer, env, task) -> list[int]:
    """The token ids of `task`'s first prompt as a campaign renders it: `env` reset on the task,
    its tools and first observation through `tokenizer`'s chat template."""
    from toolgym.inference.chat import ChatRenderer

    observation, info = env.reset(options={"task": task})
    renderer = ChatRenderer(tokenizer, tools=info.get("tools"))
    return renderer.prompt_ids(renderer.initial_messages(observation))
