"""Trajectories to tensors: right-padded token ids, the loss mask, rollout logprobs, micro-batches.

Positions are shifted once here: column t of every (B, T-1) tensor is about token t+1 of the
sequence (the logits at position t predict it), so the loss mask, the rollout logprobs and the
model's log-probabilities line up without further bookkeeping.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from toolgym.harness.trajectory import Trajectory
from toolgym.inference.prefix import MIN_SHARED, forward_logits, kept_logits
from toolgym.trainers.packing import PackingUnsupported, packed_logits


@dataclass
class TokenBatch:
    """A padded batch; `mask`, `rollout_logp` and `advantages` follow the shifted layout."""

    input_ids: torch.Tensor  # (B, T) right-padded
    attention: torch.Tensor  # (B, T) 1 on real tokens
    mask: torch.Tensor  # (B, T-1) 1 where token t+1 was sampled by the policy
    rollout_logp: torch.Tensor  # (B, T-1) the behaviour policy's logprob of token t+1 (0 off-mask)
    advantages: torch.Tensor  # (B,) one scalar per trajectory

    @property
    def tokens(self) -> int:
        """Policy tokens in the batch."""
        return int(self.mask.sum())

    def to(self, device: torch.device | str) -> TokenBatch:
        """The same batch on `device`."""
        return TokenBatch(*(t.to(device) for t in (self.input_ids, self.attention, self.mask, self.rollout_logp, self.advantages)))


def pack(trajectories: list[Trajectory], advantages: list[float] | torch.Tensor, pad_id: int, max_len: int | None = None) -> TokenBatch:
    """Pad trajectories into one `TokenBatch` (longer ones cut at `max_len` from the right)."""
    if not trajectories:
        raise ValueError("cannot pack an empty list of trajectories")
    seqs = [t.token_ids[:max_len] if max_len else t.token_ids for t in trajectories]
    width = max(len(s) for s in seqs)
    n = len(seqs)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    attention = torch.zeros((n, width), dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.float32)
    logp = torch.zeros((n, width), dtype=torch.float32)
    for i, (traj, seq) in enumerate(zip(trajectories, seqs)):
        ids[i, : len(seq)] = torch.tensor(seq)
        attention[i, : len(seq)] = 1
        mask[i, : len(seq)] = torch.tensor(traj.loss_mask[: len(seq)], dtype=torch.float32)
        logp[i, : len(seq)] = torch.tensor(traj.logprobs[: len(seq)], dtype=torch.float32)
    adv = torch.as_tensor(advantages, dtype=torch.float32)
    return TokenBatch(ids, attention, mask[:, 1:], logp[:, 1:], adv)


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def _by_budget(order: list[int], lengths: list[int], token_budget: int) -> list[list[int]]:
    """Consecutive runs of `order` whose (rows x longest row) stays within `token_budget`."""
    groups: list[list[int]] = []
    current: list[int] = []
    for i in order:
        longest = max([lengths[j] for j in current] + [lengths[i]])
        if current and longest * (len(current) + 1) > token_budget:
            groups.append(current)
            current = []
        current.append(i)
    if current:
        groups.append(current)
    return groups


def micro_batches(lengths: list[int], token_budget: int, sequences: list[list[int]] | None = None) -> list[list[int]]:
    """Indices grouped so that (sequences x longest sequence) stays within `token_budget`; a
    sequence longer than the budget goes alone.

    Without `sequences`, similar lengths go together (less padding). With the rows' tokens,
    rows that share more than the whole batch's common prefix (a GRPO group: its task prompt and
    usually its first turns) form their own micro-batches, so the shared-prefix forward
    (`inference/prefix.py`) computes that part once for the group: measured on SmolLM2 rollouts of
    `records`, half of the tokens after the system prompt. Rows sharing nothing go together by length."""
    if sequences is None:
        return _by_budget(sorted(range(len(lengths)), key=lambda i: lengths[i]), lengths, token_budget)
    order = sorted(range(len(lengths)), key=lambda i: sequences[i])  # shared prefixes end up adjacent
    base = min((_common_prefix(sequences[order[0]], sequences[i]) for i in order), default=0)
    clusters: list[list[int]] = []
    for i in order:
        if clusters and _common_prefix(sequences[clusters[-1][0]], sequences[i]) >= base + MIN_SHARED:
            clusters[-1].append(i)
        else:
            clusters.append([i])
    groups: list[list[int]] = []
    alone = [c[0] for c in clusters if len(c) == 1]
    for cluster in clusters:
        if len(cluster) > 1:
            groups += _by_budget(sorted(cluster, key=lambda i: lengths[i]), lengths, token_budget)
    return groups + _by_budget(sorted(alone, key=lambda i: lengths[i]), lengths, token_budget)


def select(batch: TokenBatch, index: list[int]) -> TokenBatch:
    """The rows `index` of a batch, trimmed to their longest sequence."""
    idx = torch.tensor(index)
    width = int(batch.attention[idx].sum(1).max())
    return TokenBatch(
        batch.input_ids[idx, :width],
        batch.attention[idx, :width],
        batch.mask[idx, : width - 1],
        batch.rollout_logp[idx, : width - 1],
        batch.advantages[idx],
    )


def sequence_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention: torch.Tensor,
    with_entropy: bool = False,
    share_prefix: bool = True,
    mask: torch.Tensor | None = None,
    temperature: float = 1.0,
    pack: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(token t+1 | tokens <= t) for every position (B, T-1), and optionally the entropy of
    each predictive distribution, where p = softmax(logits / `temperature`): the distribution the
    rollouts were sampled from (verl's actor divides its logits the same way). Right padding keeps
    real tokens at positions 0..len-1. The rows' shared prefix (system prompt, tool list, a group's
    task) runs once (`harness.prefix`). With `mask` (B, T-1), only the masked positions are
    computed (the LM head, softmax and entropy skip the prompt and observations); the others are 0.
    With `pack` too (and `share_prefix`), the rows run without padding (`harness.packing`)."""
    if mask is not None and not bool((mask > 0).any()):
        mask = None  # nothing to pick: the plain path (keeps the graph for a zero loss)
    if mask is None:
        logits = (
            forward_logits(model, input_ids, attention) if share_prefix else model(input_ids=input_ids, attention_mask=attention).logits
        )[:, :-1].float()
        logp_all = torch.log_softmax(_tempered(logits, temperature), dim=-1)
        logp = logp_all.gather(2, input_ids[:, 1:].unsqueeze(2)).squeeze(2)
        entropy = -(logp_all.exp() * logp_all).sum(-1).detach() if with_entropy else None
        return logp, entropy
    picked = mask > 0
    keep = torch.zeros_like(attention, dtype=torch.bool)
    keep[:, :-1] = picked
    if share_prefix:
        logits = (packed_or_padded if pack else forward_logits)(model, input_ids, attention, keep).float()
    else:
        logits = kept_logits(model, keep, input_ids=input_ids, attention_mask=attention).float()
    logp_all = torch.log_softmax(_tempered(logits, temperature), dim=-1)
    values = logp_all.gather(1, input_ids[:, 1:][picked].unsqueeze(1)).squeeze(1)
    logp = torch.zeros(mask.shape, dtype=values.dtype, device=values.device).masked_scatter(picked, values)
    entropy = None
    if with_entropy:
        ent = -(logp_all.exp() * logp_all).sum(-1).detach()
        entropy = torch.zeros(mask.shape, dtype=ent.dtype, device=ent.device).masked_scatter(picked, ent)
    return logp, entropy


def packed_or_padded(model: torch.nn.Module, input_ids: torch.Tensor, attention: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """The kept positions' logits, from the padding-free forward where the batch and the model
    allow it (`harness.packing`), else from the padded one with the shared prefix run once."""
    if not _PACKING_REFUSED.get(type(model), False):
        try:
            logits = packed_logits(model, input_ids, attention, keep)
        except PackingUnsupported as err:  # the model drops keyword arguments: never again for its class
            _PACKING_REFUSED[type(model)] = True
            warnings.warn(f"padding-free training forward unavailable ({err}); using padded batches", stacklevel=2)
        else:
            if logits is not None:
                return logits
    return forward_logits(model, input_ids, attention, keep=keep)


#: Model classes whose attention layers did not receive the packed segments.
_PACKING_REFUSED: dict[type, bool] = {}


def _tempered(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """`logits / temperature`; 1 and 0 (greedy, which has no distribution to scale) leave them."""
    return logits if temperature in (0.0, 1.0) else logits / temperature


__all__ = ["TokenBatch", "micro_batches", "pack", "select", "sequence_logprobs"]
