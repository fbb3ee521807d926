"""Padding-free training forwards: the rows of a right-padded batch run end to end as one row.

A training micro-batch holds rows of different lengths. Padded to its longest row, about 30 % of
what the main job's SFT steps computed was padding (8 BFCL demonstrations of 135 to 514 tokens,
measured on its rollouts). Here the batch's shared prefix (system prompt, tool list, a GRPO
group's task) runs once, as in `inference/prefix.py`, and each row's own tokens after it are laid
end to end in a single row (batch 1) with positions restarting per row, so the linear layers see
only real tokens. Attention runs segment by segment: each row sees the shared prefix and its own
earlier tokens, never another row's. The logits equal the padded forward's up to float rounding,
and the gradients flow the same way (TRL's `padding_free` and verl's `use_remove_padding` do the
same with flash-attention's variable-length kernels, which CPUs do not have).

The attention function is registered with transformers as `toolgym-packed` and switched on for
one forward at a time. A model whose attention layers never receive the segments (one that does
not pass keyword arguments down to its attention function) raises `PackingUnsupported` instead of
attending across rows; callers then use the padded forward.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from toolgym.inference.prefix import MIN_SHARED, cache_kwarg, prefix_cache, shared_prefix_length

NAME = "toolgym-packed"
#: The keyword argument that carries the segments from `model(...)` down to the attention layers.
SEGMENTS_KWARG = "toolgym_segments"

# Set while a packed forward runs in this thread: an attention call without segments then means
# the model dropped them, which must fail rather than attend across rows. Other threads (a
# policy generating from the same model object) are unaffected and use SDPA.
_PACKED_FORWARD = contextvars.ContextVar("toolgym_packed_forward", default=False)


class PackingUnsupported(RuntimeError):
    """The model's attention layers did not receive the packed segments."""


@dataclass(frozen=True)
class Segments:
    """Where each row sits in the packed row: keys [0, `prefix`) are the shared prefix every
    row sees; row i's own tokens are queries [start, end) of `bounds[i]` and keys
    [prefix + start, prefix + end)."""

    prefix: int
    bounds: tuple[tuple[int, int], ...]


def packed_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Causal attention of each segment over the shared prefix and its own tokens. `query`
    (1, Hq, T, D), `key`/`value` (1, Hkv, prefix + T, D); returns (1, T, Hq, D) like
    transformers' attention functions. Without segments (a call from outside a packed forward,
    e.g. a policy generating in another thread) it is SDPA."""
    segments: Segments | None = kwargs.get(SEGMENTS_KWARG)
    if segments is None:
        if _PACKED_FORWARD.get():
            raise PackingUnsupported(f"{type(module).__name__} did not pass `{SEGMENTS_KWARG}` to its attention")
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling)
    groups = query.shape[1] // key.shape[1]
    p = segments.prefix
    dropout = dropout if module.training else 0.0
    outputs = []
    for start, end in segments.bounds:
        if start == end:  # a row that is all shared prefix has no queries of its own
            continue
        k, v = key[:, :, p + start : p + end], value[:, :, p + start : p + end]
        if p:
            k = torch.cat([key[:, :, :p], k], dim=2)
            v = torch.cat([value[:, :, :p], v], dim=2)
        if groups > 1:  # grouped-query attention: every query head its key/value head
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        n = end - start
        # query i sees the whole prefix and its own tokens up to i (a causal mask shifted by p)
        mask = torch.ones(n, p + n, dtype=torch.bool, device=query.device).tril(diagonal=p) if p else None
        outputs.append(
            F.scaled_dot_product_attention(query[:, :, start:end], k, v, attn_mask=mask, dropout_p=dropout, is_causal=not p, scale=scaling)
        )
    return torch.cat(outputs, dim=2).transpose(1, 2).contiguous(), None


def _no_mask(*args: Any, **kwargs: Any) -> None:
    """The packed attention builds its own per-segment masks: none for the whole row."""
    return None


AttentionInterface.register(NAME, packed_attention)
AttentionMaskInterface.register(NAME, _no_mask)


@contextmanager
def _packed_attention(model: torch.nn.Module) -> Iterator[None]:
    """`model` attends with `packed_attention` for the duration (its own implementation after)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    before = base.config._attn_implementation
    base.set_attn_implementation(NAME)
    token = _PACKED_FORWARD.set(True)
    try:
        yield
    finally:
        _PACKED_FORWARD.reset(token)
        base.set_attn_implementation(before)


def packed_logits(model: torch.nn.Module, ids: torch.Tensor, attention: torch.Tensor, keep: torch.Tensor) -> torch.Tensor | None:
    """The logits at `keep` (bool, B x T) of a right-padded batch, (N, V) in row-major order, as
    `prefix.forward_logits` gives them, computed without padding. The prefix run once ends before
    the first kept position (the rows' answers run in their segments even where they start
    alike). None when a kept position lies on padding: use the padded forward then. Raises
    `PackingUnsupported` for a model that does not pass the segments down."""
    rows, width = ids.shape
    lengths = attention.sum(1).tolist()
    shared = min(shared_prefix_length(ids, attention), width - 1) if rows > 1 else 0
    kept_columns = keep.any(0).nonzero()
    if len(kept_columns):  # a GRPO group's answers often start alike: their common start is not prefix
        shared = min(shared, int(kept_columns[0]))
    if shared < MIN_SHARED:
        shared = 0
    tails = [slice(shared, n) for n in lengths]
    packed_ids = torch.cat([ids[i, s] for i, s in enumerate(tails)]).unsqueeze(0)
    positions = torch.cat([torch.arange(s.start, s.stop, device=ids.device) for s in tails]).unsqueeze(0)
    packed_keep = torch.cat([keep[i, s] for i, s in enumerate(tails)])
    if int(packed_keep.sum()) != int(keep.sum()):
        return None  # a kept position on padding: nothing to compute it from
    ends = torch.tensor([s.stop - s.start for s in tails]).cumsum(0).tolist()
    segments = Segments(shared, tuple(zip([0] + ends[:-1], ends)))
    inputs: dict[str, Any] = {
        "input_ids": packed_ids,
        "position_ids": positions,
        "attention_mask": None,
        "logits_to_keep": packed_keep.nonzero().squeeze(1),
        SEGMENTS_KWARG: segments,
    }
    if shared:
        _, cache = prefix_cache(model, ids[:1, :shared], 1, logits=False)
        inputs.update(use_cache=True, **{cache_kwarg(model): cache})
    else:
        inputs["use_cache"] = False
    with _packed_attention(model):
        logits = model(**inputs).logits
    return logits.reshape(-1, logits.shape[-1])


__all__ = ["NAME", "PackingUnsupported", "SEGMENTS_KWARG", "Segments", "packed_attention", "packed_logits"]
