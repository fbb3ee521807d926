"""Shared-prefix forward passes: a batch's common leading tokens are computed once.

Agent episodes share long prompts (the system message and the tool list are the same for every
episode of an environment; a GRPO group shares the whole task prompt). Generation and training
both run the model over every row's full context, so most of that compute repeats the same
prefix. Here the prefix runs once (batch 1), its KV cache is repeated for every row, and only the
rows' own tokens run in the batch. Positions and attention are those of the full sequences, so
the logits are the same as a plain forward (up to float rounding); gradients flow into the
prefix from every row.
"""

from __future__ import annotations

import inspect
from functools import cache
from typing import Any

import torch

#: Below this many shared tokens (or for a single row) the plain forward is used.
MIN_SHARED = 16


def cache_kwarg(model: torch.nn.Module) -> str:
    """The name of the KV-cache argument of `model.forward` (transformers >= 5.2x renamed
    `past_key_values` to `cache`); looks through a peft wrapper to the base model."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return _cache_kwarg_of(type(base))


@cache
def _cache_kwarg_of(cls: type) -> str:  # per class: forward passes ask on every call
    return "cache" if "cache" in inspect.signature(cls.forward).parameters else "past_key_values"


def shared_prefix_length(ids: torch.Tensor, attention: torch.Tensor) -> int:
    """Leading columns where every row has the same real token (right-padded batch)."""
    same = (ids == ids[:1]).all(0) & attention.bool().all(0)
    differ = (~same).nonzero()
    return int(differ[0]) if len(differ) else int(ids.shape[1])


def prefix_cache(model: torch.nn.Module, prefix: torch.Tensor, rows: int, logits: bool = True) -> tuple[torch.Tensor, Any]:
    """Run `prefix` (1, L) once; returns its logits (1, L, V; only the last position's when
    `logits` is False) and a KV cache repeated for `rows`."""
    from transformers import DynamicCache

    cache = DynamicCache()
    keep = {} if logits else {"logits_to_keep": 1}
    out = model(input_ids=prefix, attention_mask=torch.ones_like(prefix), use_cache=True, **{cache_kwarg(model): cache}, **keep)
    cache.batch_repeat_interleave(rows)
    return out.logits, cache


def kept_logits(model: torch.nn.Module, keep: torch.Tensor | None, **inputs: Any) -> torch.Tensor:
    """`model(**inputs).logits`, or with `keep` (bool, B x T) only the kept positions' logits, (N, V)
    in row-major order: the LM head and everything after it skip the others (transformers'
    `logits_to_keep` mask; older releases without it compute all and select)."""
    if keep is None:
        return model(**inputs).logits
    try:
        logits = model(**inputs, logits_to_keep=keep).logits
    except (TypeError, ValueError, IndexError, RuntimeError):
        return model(**inputs).logits[keep]
    return logits.reshape(-1, logits.shape[-1])


def forward_logits(model: torch.nn.Module, ids: torch.Tensor, attention: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
    """Logits (B, T, V) of a right-padded batch, with the rows' shared prefix computed once; with
    `keep` (bool, B x T), only the kept positions' logits, (N, V) in row-major order."""
    rows, width = ids.shape
    shared = min(shared_prefix_length(ids, attention), width - 1)
    if rows < 2 or shared < MIN_SHARED:
        return kept_logits(model, keep, input_ids=ids, attention_mask=attention)
    need_head = keep is None or bool(keep[:, :shared].any())
    head, cache = prefix_cache(model, ids[:1, :shared], rows, logits=need_head)
    pos = torch.arange(shared, width, device=ids.device).unsqueeze(0).expand(rows, -1)
    tail_inputs = dict(input_ids=ids[:, shared:], attention_mask=attention, position_ids=pos, use_cache=True, **{cache_kwarg(model): cache})
    if keep is not None and not need_head:  # every kept position is in the rows' own tokens
        return kept_logits(model, keep[:, shared:], **tail_inputs)
    full = torch.cat([head.expand(rows, -1, -1), model(**tail_inputs).logits], dim=1)
    return full if keep is None else full[keep]


def common_prefix_length(prompts: list[list[int]]) -> int:
    """Leading tokens every prompt shares (at most the shortest prompt's length - 1, so every row
    keeps at least one token of its own to produce its next-token logits)."""
    shortest = min(len(p) for p in prompts)
    if shortest < 2:
        return 0
    cols = torch.tensor([p[: shortest - 1] for p in prompts])
    differ = (cols != cols[:1]).any(0).nonzero()
    return int(differ[0]) if len(differ) else shortest - 1


__all__ = ["MIN_SHARED", "cache_kwarg", "common_prefix_length", "forward_logits", "kept_logits", "prefix_cache", "shared_prefix_length"]
