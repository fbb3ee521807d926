"""What `HFPolicy` (inference/hf_policy.py) is built from: its batching constants, the device and
dtype it resolves, and the small records of a request, a prefill and a deduplicated prefill's logits.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import torch

from toolgym.inference.policy import SamplingParams

#: Decoding continues on the unfinished rows alone once at most this share of the batch's rows
#: still runs (dropping rows copies the cache, so not after every finished row).
SHRINK_AT = 0.5

#: The longest a batch waits for live episodes' requests while they keep arriving (`_gather`):
#: a batch of a hundred rows takes seconds to minutes, a hundred episodes start in well under one.
GATHER_MAX_S = 2.0

#: A prefill chunk takes rows up to this many times its shortest row's new tokens (see
#: `HFPolicy._forward_by_length`): padding wastes at most a fifth of a chunk's compute.
PAD_SLACK = 1.25
#: Filled share of a batch's KV buffer from which a bf16 CPU decoding step attends over the whole
#: buffer rather than copying a view of the filled columns (see `kv_cache.BufferLayer`).
WHOLE_BUFFER_AT = 0.5


@dataclass
class _Request:
    prompt: list[int]
    sampling: SamplingParams
    future: asyncio.Future
    episode: str | None  # the rollout runner's episode id: whose cached keys and values to reuse


def default_device() -> str:
    """CUDA when a GPU is present, else CPU."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_dtype(dtype: str | torch.dtype | None, device: str) -> torch.dtype:
    """`bf16`/`fp16`/`fp32` (or a torch dtype); default bf16 on CUDA, fp32 elsewhere."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype is None or dtype == "auto":
        return torch.bfloat16 if str(device).startswith("cuda") else torch.float32
    names = {
        "bf16": torch.bfloat16,
        "bfloat16": torch.bfloat16,
        "fp16": torch.float16,
        "float16": torch.float16,
        "fp32": torch.float32,
        "float32": torch.float32,
    }
    if dtype not in names:
        raise ValueError(f"unknown dtype {dtype!r}; use one of bf16, fp16, fp32 or auto")
    return names[dtype]


#: Generation checks "every row finished?" on the host once per this many tokens, not per token.
SYNC_EVERY = 8
#: Freed memory goes back to the OS once per this many decoded tokens. Each step's logits (rows x
#: vocabulary, in float32) are freed and allocated anew, and malloc's heap fragments around them:
#: SmolLM2-135M decoding 64 rows grew 27 MB a token, 2.9 -> 9.9 GB over 256 tokens, while live
#: objects held 0.7 GB (`bench/host_memory.py`).
TRIM_EVERY = 16


def _kv_shape(model: torch.nn.Module) -> tuple[int, int, int]:
    """(layers, key/value heads, head dim) of a decoder's KV cache, from its config."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return config.num_hidden_layers, kv_heads, head_dim


@dataclass
class _Prefill:
    """A batch after its first forward: the output, the mask and positions, the cache, and where
    each row's tokens sit in the cache (to store them for the episode's next turn)."""

    out: Any
    attention: torch.Tensor  # (rows, capacity): 0 on pads; each forward passes the filled columns
    positions: torch.Tensor  # (rows, new tokens)
    cache: Any
    past: list[int]  # cached tokens per row, in columns [0, past)
    new: list[int]  # the row's own new tokens, right-aligned to `width`
    width: int  # columns filled by the prompt (past region + new region)


@dataclass
class _Logits:
    """The part of a model output the decoding loop reads (a deduplicated prefill's copy)."""

    logits: torch.Tensor
