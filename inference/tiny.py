"""Build the tiny CPU policy: a small Qwen2-architecture model with a tokenizer trained here.

No weights can be downloaded on the project's machines, so toolgym makes its own: a byte-level
BPE tokenizer trained on the built-in suites' text (instructions, observations, tool calls), with
ChatML special tokens and the Qwen2.5-style tool chat template, and a randomly initialised
~0.4 M-parameter Qwen2 model. Both are written with `save_pretrained` and load back through
`AutoTokenizer` / `AutoModelForCausalLM` like any hub model.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from toolgym.inference.chat import load_template
from toolgym.sandbox.fs import publish, staging_name

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
]
DEFAULT_DIR = Path.home() / ".cache" / "toolgym" / "tiny-policy-v1"


def _corpus(limit: int = 600) -> list[str]:
    """Texts the tokenizer is trained on: the records suite's episodes, rendered."""
    import toolgym
    from toolgym.tasks import builtin_suite

    env = toolgym.make("records-v0").unwrapped
    texts = [json.dumps(s) for s in env.tool_schemas()]
    for task in builtin_suite("records").tasks[:limit]:
        obs, _ = env.reset(options={"task": task})
        texts.append(obs)
        for call in task.oracle:
            texts.append(call.to_text())
            out = env.step(call.to_text())[0]
            texts.append(out)
    texts.append("".join(chr(c) for c in range(32, 127)))
    return texts


def build_tiny_policy(
    out_dir: str | Path = DEFAULT_DIR, vocab_size: int = 1024, hidden: int = 64, layers: int = 2, seed: int = 0, overwrite: bool = False
) -> Path:
    """Train the tokenizer, initialise the model, `save_pretrained` both to `out_dir`; returns it.

    Cached: an existing complete directory is reused unless `overwrite`.
    """
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    out = Path(out_dir)
    if (out / "config.json").exists() and (out / "tokenizer.json").exists() and not overwrite:
        template = out / "chat_template.jinja"  # a cache from before a template fix gets the current one
        if template.exists() and template.read_text() != load_template("qwen2.5"):
            template.write_text(load_template("qwen2.5"))
        return out
    # built under a staging name and published whole: another process (a second test worker, a
    # second campaign) never loads a half-written directory
    final, out = out, staging_name(out)
    out.mkdir(parents=True)

    bpe = Tokenizer(models.BPE(unk_token=None))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    bpe.train_from_iterator(_corpus(), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[1:],
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = load_template("qwen2.5")
    tokenizer.save_pretrained(out)

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 3,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    with torch.random.fork_rng(devices=[]):  # seeded init without touching the global RNG
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    model.save_pretrained(out)
    if overwrite:
        shutil.rmtree(final, ignore_errors=True)
    if not (final / "config.json").exists() and final.is_dir() and any(final.iterdir()):
        # a directory of the user's with other files in it: write into it, keeping them
        shutil.copytree(out, final, dirs_exist_ok=True)
        shutil.rmtree(out, ignore_errors=True)
    else:
        publish(out, final)  # if another process published the same build first, theirs stays
    return final
