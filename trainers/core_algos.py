"""The RL math as small pure functions over tensors and masks, registered by name.

No I/O, no model: every function takes tensors and returns tensors (plus plain-number stats), so
each is tested against a straightforward loop written independently in the tests.

Shapes: `rewards`, `group_ids`, advantages: (B,) one scalar per trajectory. Token tensors
(`logp`, `old_logp`, `mask`, ...): (B, T), `mask` 1 exactly on the policy's own tokens.

- advantages: `grpo` (R - mean_group) / (std_group + eps), `drgrpo` (no std division), `rloo`
  (leave-one-out baseline); one scalar per trajectory, broadcast over its mask.
- policy losses: `ppo` (clip with separate eps_low / eps_high: DAPO clip-higher), `gspo`
  (sequence-level, length-normalised ratio), `cispo` (clipped, stop-gradient importance weight on
  every token's log-probability).
- aggregation: `token-mean` (DAPO), `seq-mean-token-mean`, `seq-mean-token-sum-norm` (Dr.GRPO's
  constant normaliser).
- KL to a reference with the k3 estimator, entropy, clip fractions, importance-ratio statistics.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

ADVANTAGES: dict[str, Callable] = {}
POLICY_LOSSES: dict[str, Callable] = {}
AGGREGATIONS: dict[str, Callable] = {}


def _register(table: dict[str, Callable], name: str) -> Callable:
    def deco(fn: Callable) -> Callable:
        table[name] = fn
        return fn

    return deco


# ---- advantages ----------------------------------------------------------------------------------


def _group_index(group_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Dense 0..G-1 index per trajectory, and the number of groups."""
    _, index = torch.unique(group_ids, return_inverse=True)
    return index, int(index.max()) + 1 if index.numel() else 0


def group_mean_std(rewards: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per trajectory: its group's mean reward, (population) std and size."""
    index, n = _group_index(group_ids)
    r = rewards.to(torch.float64)
    size = torch.zeros(n, dtype=torch.float64).index_add_(0, index, torch.ones_like(r))
    mean = torch.zeros(n, dtype=torch.float64).index_add_(0, index, r) / size
    var = torch.zeros(n, dtype=torch.float64).index_add_(0, index, (r - mean[index]) ** 2) / size
    return mean[index], var.sqrt()[index], size[index]


@_register(ADVANTAGES, "grpo")
def grpo_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """(R - mean_group) / (std_group + eps)."""
    mean, std, _ = group_mean_std(rewards, group_ids)
    return ((rewards - mean) / (std + eps)).to(torch.float32)


@_register(ADVANTAGES, "drgrpo")
def drgrpo_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """R - mean_group (Dr.GRPO: no division by the group's std, which favours easy/hard groups)."""
    mean, _, _ = group_mean_std(rewards, group_ids)
    return (rewards - mean).to(torch.float32)


@_register(ADVANTAGES, "rloo")
def rloo_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """R minus the mean of the other members of its group (0 for a group of one)."""
    mean, _, size = group_mean_std(rewards, group_ids)
    others = torch.where(size > 1, (mean * size - rewards) / (size - 1).clamp(min=1), rewards.to(torch.float64))
    return (rewards - others).to(torch.float32)


@_register(ADVANTAGES, "none")
def no_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Every advantage 0: the reward ablation. The policy-gradient term vanishes, so an RL stage
    with `rl.sft_anchor` trains on its anchor demonstrations alone, with the same steps, sampler,
    rollouts per step and anchor draws (the tasks drawn after the first step differ, as the policy
    does): what its final model gains over this control is what the reward taught."""
    return torch.zeros(len(rewards), dtype=torch.float32)


def group_signal(rewards: torch.Tensor, group_ids: torch.Tensor) -> dict[str, float]:
    """How many groups carry no signal (all rewards equal): all-pass, all-fail, other zero-variance."""
    index, n = _group_index(group_ids)
    out = {"groups": n, "all_pass": 0, "all_fail": 0, "zero_variance": 0}
    for g in range(n):
        r = rewards[index == g]
        if bool((r == r[0]).all()):
            out["zero_variance"] += 1
            out["all_pass"] += int(bool(r[0] >= 1.0))
            out["all_fail"] += int(bool(r[0] <= 0.0))
    return out


def zero_variance_mask(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """True for trajectories whose group has rewards that are all equal (no gradient signal)."""
    _, std, _ = group_mean_std(rewards, group_ids)
    return std == 0


def broadcast(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """One scalar per trajectory on every one of its policy tokens, 0 elsewhere."""
    return advantages.unsqueeze(1) * mask


# ---- aggregation -----------------------------------------------------------------------------------


@_register(AGGREGATIONS, "token-mean")
def token_mean(values: torch.Tensor, mask: torch.Tensor, norm: float | None = None) -> torch.Tensor:
    """Mean over every policy token of the batch (DAPO)."""
    return (values * mask).sum() / mask.sum().clamp(min=1)


@_register(AGGREGATIONS, "seq-mean-token-mean")
def seq_mean_token_mean(values: torch.Tensor, mask: torch.Tensor, norm: float | None = None) -> torch.Tensor:
    """Mean over sequences of each sequence's token mean (GRPO paper)."""
    per_seq = (values * mask).sum(1) / mask.sum(1).clamp(min=1)
    has = (mask.sum(1) > 0).to(values.dtype)
    return (per_seq * has).sum() / has.sum().clamp(min=1)


@_register(AGGREGATIONS, "seq-mean-token-sum-norm")
def seq_mean_token_sum_norm(values: torch.Tensor, mask: torch.Tensor, norm: float | None = None) -> torch.Tensor:
    """Token sum divided by (sequences x a constant length), Dr.GRPO: no length bias."""
    length = float(norm) if norm else float(mask.shape[1])
    return (values * mask).sum() / (mask.shape[0] * length)


def aggregate(values: torch.Tensor, mask: torch.Tensor, mode: str, norm: float | None = None) -> torch.Tensor:
    """Aggregate per-token values under `mode` (see AGGREGATIONS)."""
    if mode not in AGGREGATIONS:
        raise KeyError(f"unknown loss aggregation {mode!r}; choose from {', '.join(AGGREGATIONS)}")
    return AGGREGATIONS[mode](values, mask, norm)


# ---- policy losses -----------------------------------------------------------------------------


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    return float((values * mask).sum() / mask.sum().clamp(min=1))


def _ratio_stats(ratio: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    on = ratio[mask.bool()]
    if on.numel() == 0:
        return {"ratio_mean": 1.0, "ratio_min": 1.0, "ratio_max": 1.0}
    return {"ratio_mean": float(on.mean()), "ratio_min": float(on.min()), "ratio_max": float(on.max())}


@_register(POLICY_LOSSES, "ppo")
def ppo_clip_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    agg: str = "token-mean",
    norm: float | None = None,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO-clip per token with separate low/high clip ranges; `adv` is per token (B, T).
    `weights` (B, T): an optional stop-gradient per-token factor (truncated importance sampling)."""
    ratio = torch.exp(logp - old_logp)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    per_token = torch.maximum(unclipped, clipped)
    if weights is not None:
        per_token = per_token * weights.detach()
    clip_low = ((ratio < 1.0 - eps_low) & (adv < 0)).to(logp.dtype)
    clip_high = ((ratio > 1.0 + eps_high) & (adv > 0)).to(logp.dtype)
    stats = {
        "clip_frac_low": _masked_mean(clip_low, mask),
        "clip_frac_high": _masked_mean(clip_high, mask),
        **_ratio_stats(ratio.detach(), mask),
    }
    return aggregate(per_token, mask, agg, norm), stats


@_register(POLICY_LOSSES, "gspo")
def gspo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float = 3e-4,
    eps_high: float = 4e-4,
    agg: str = "seq-mean-token-mean",
    norm: float | None = None,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO: the sequence ratio exp(mean over the sequence's tokens of (logp - old_logp)), clipped
    per sequence; its gradient reaches every token as in GSPO-token (s_i * exp(logp - sg(logp)))."""
    lengths = mask.sum(1).clamp(min=1)
    seq_log_ratio = ((logp - old_logp) * mask).sum(1) / lengths
    seq_ratio = torch.exp(seq_log_ratio.detach()).unsqueeze(1)
    ratio = seq_ratio * torch.exp(logp - logp.detach())  # value s_i, gradient through every token
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    per_token = torch.maximum(unclipped, clipped)
    if weights is not None:
        per_token = per_token * weights.detach()
    clip = (((ratio < 1.0 - eps_low) & (adv < 0)) | ((ratio > 1.0 + eps_high) & (adv > 0))).to(logp.dtype)
    stats = {
        "clip_frac_low": _masked_mean(((ratio < 1.0 - eps_low) & (adv < 0)).to(logp.dtype), mask),
        "clip_frac_high": _masked_mean(((ratio > 1.0 + eps_high) & (adv > 0)).to(logp.dtype), mask),
        "clip_frac": _masked_mean(clip, mask),
        **_ratio_stats(ratio.detach(), mask),
    }
    return aggregate(per_token, mask, agg, norm), stats


@_register(POLICY_LOSSES, "cispo")
def cispo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float | None = None,
    eps_high: float = 4.0,
    agg: str = "token-mean",
    norm: float | None = None,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """CISPO: -sg(clip(ratio, 1 - eps_low, 1 + eps_high)) * A * logp on every token (no token is
    dropped from the gradient; only the weight is clipped). eps_low None = no lower clip."""
    ratio = torch.exp(logp - old_logp).detach()
    low = 0.0 if eps_low is None else 1.0 - eps_low
    weight = torch.clamp(ratio, min=low, max=1.0 + eps_high)
    per_token = -weight * adv * logp
    if weights is not None:
        per_token = per_token * weights.detach()
    stats = {
        "clip_frac_high": _masked_mean((ratio > 1.0 + eps_high).to(logp.dtype), mask),
        "clip_frac_low": _masked_mean((ratio < low).to(logp.dtype), mask),
        **_ratio_stats(ratio, mask),
    }
    return aggregate(per_token, mask, agg, norm), stats


def policy_loss(name: str, *args, **kwargs) -> tuple[torch.Tensor, dict[str, float]]:
    """The registered policy loss `name`."""
    if name not in POLICY_LOSSES:
        raise KeyError(f"unknown policy loss {name!r}; choose from {', '.join(POLICY_LOSSES)}")
    return POLICY_LOSSES[name](*args, **kwargs)


# ---- regularisers and diagnostics -----------------------------------------------------------


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(pi || ref): exp(ref - logp) - (ref - logp) - 1 (>= 0, unbiased)."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1.0


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Per-position entropy of softmax(logits), (B, T, V) -> (B, T)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def truncated_is_weights(train_logp: torch.Tensor, rollout_logp: torch.Tensor, cap: float = 2.0) -> torch.Tensor:
    """Truncated importance sampling per token: min(pi_train / pi_rollout, cap), no gradient.
    Corrects for a separate inference engine (sglang) sampling from a slightly different policy."""
    return torch.clamp(torch.exp(train_logp.detach() - rollout_logp), max=cap)


def mismatch_stats(train_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor, cap: float | None = None) -> dict[str, float]:
    """How far the sampler was from the trained policy, over policy tokens: mean and max
    |logp_train - logp_rollout|, a k3 estimate of KL(pi_rollout || pi_train) (the tokens were
    sampled by the rollout policy), and the share of tokens whose importance weight the TIS `cap`
    truncated (0 without a cap)."""
    on = mask.bool()
    diff = (train_logp.detach() - rollout_logp)[on].double()
    if diff.numel() == 0:
        return {"logprob_gap_mean": 0.0, "logprob_gap_max": 0.0, "mismatch_kl": 0.0, "tis_truncated_frac": 0.0}
    ratio = diff.exp()
    return {
        "logprob_gap_mean": float(diff.abs().mean()),
        "logprob_gap_max": float(diff.abs().max()),
        "mismatch_kl": float((ratio - diff - 1.0).mean()),
        "tis_truncated_frac": float((ratio > cap).double().mean()) if cap else 0.0,
    }


def logprob_gap(train_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Mean and max |logp_train - logp_rollout| over policy tokens (see `mismatch_stats`)."""
    stats = mismatch_stats(train_logp, rollout_logp, mask)
    return {"logprob_gap_mean": stats["logprob_gap_mean"], "logprob_gap_max": stats["logprob_gap_max"]}


__all__ = [
    "ADVANTAGES",
    "AGGREGATIONS",
    "POLICY_LOSSES",
    "aggregate",
    "broadcast",
    "cispo_loss",
    "drgrpo_advantages",
    "entropy_from_logits",
    "group_mean_std",
    "group_signal",
    "grpo_advantages",
    "gspo_loss",
    "kl_k3",
    "logprob_gap",
    "mismatch_stats",
    "policy_loss",
    "ppo_clip_loss",
    "rloo_advantages",
    "truncated_is_weights",
    "zero_variance_mask",
]
