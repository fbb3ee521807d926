"""The RL math against straightforward references written here (loops, numpy), on random inputs
and hand-computed cases; and the gradient test: only the policy's own tokens get gradient."""

import math

import numpy as np
import pytest
import torch

from toolgym.trainers import core_algos as ca


def random_batch(seed, b=7, t=9):
    rng = np.random.default_rng(seed)
    groups = np.array(sorted(rng.integers(0, 3, size=b)))
    rewards = rng.integers(0, 2, size=b).astype(np.float64)
    logp = -rng.random((b, t)) * 3
    old = logp + rng.normal(0, 0.3, size=(b, t))
    mask = (rng.random((b, t)) > 0.3).astype(np.float64)
    mask[0, :] = 1
    adv_tok = rng.normal(0, 1, size=(b, t)) * mask
    return groups, rewards, logp, old, mask, adv_tok


# ---- advantages --------------------------------------------------------------------------------


def ref_advantages(rewards, groups, kind, eps=1e-6):
    out = np.zeros_like(rewards)
    for i, (r, g) in enumerate(zip(rewards, groups)):
        members = [rewards[j] for j in range(len(rewards)) if groups[j] == g]
        mean = sum(members) / len(members)
        if kind == "grpo":
            std = math.sqrt(sum((m - mean) ** 2 for m in members) / len(members))
            out[i] = (r - mean) / (std + eps)
        elif kind == "drgrpo":
            out[i] = r - mean
        else:
            others = [rewards[j] for j in range(len(rewards)) if groups[j] == g and j != i]
            out[i] = r - (sum(others) / len(others) if others else r)
    return out


@pytest.mark.parametrize("kind", ["grpo", "drgrpo", "rloo"])
@pytest.mark.parametrize("seed", range(5))
def test_advantages_match_the_reference(kind, seed):
    groups, rewards, *_ = random_batch(seed)
    rewards = rewards + np.random.default_rng(seed).random(len(rewards)) * 0.5  # fractional rewards too
    got = ca.ADVANTAGES[kind](torch.tensor(rewards), torch.tensor(groups))
    assert np.allclose(got.numpy(), ref_advantages(rewards, groups, kind), atol=1e-5)


def test_advantages_by_hand():
    r, g = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0]), torch.tensor([0, 0, 0, 0, 1, 1])
    # group 0: mean 0.25, std sqrt(3)/4; group 1: all equal -> 0
    assert ca.drgrpo_advantages(r, g).tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25, 0.0, 0.0])
    assert ca.grpo_advantages(r, g)[0].item() == pytest.approx(0.75 / (math.sqrt(3) / 4 + 1e-6))
    assert ca.rloo_advantages(r, g).tolist() == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3, 0.0, 0.0])
    assert ca.ADVANTAGES["none"](r, g).tolist() == [0.0] * 6  # the reward ablation: no signal at all
    assert ca.group_signal(r, g) == {"groups": 2, "all_pass": 1, "all_fail": 0, "zero_variance": 1}
    assert ca.zero_variance_mask(r, g).tolist() == [False] * 4 + [True, True]


def test_advantage_is_broadcast_over_the_mask_only():
    adv = torch.tensor([2.0, -1.0])
    mask = torch.tensor([[0, 1, 1, 0], [1, 0, 0, 1]], dtype=torch.float32)
    assert ca.broadcast(adv, mask).tolist() == [[0, 2, 2, 0], [-1, 0, 0, -1]]


# ---- aggregation and losses --------------------------------------------------------------------


def ref_aggregate(values, mask, mode, norm=None):
    if mode == "token-mean":
        return (values * mask).sum() / mask.sum()
    if mode == "seq-mean-token-mean":
        rows = [(values[i] * mask[i]).sum() / mask[i].sum() for i in range(len(values)) if mask[i].sum() > 0]
        return sum(rows) / len(rows)
    return (values * mask).sum() / (values.shape[0] * (norm or values.shape[1]))


def ref_ppo(logp, old, adv, mask, lo, hi):
    out = np.zeros_like(logp)
    for i in range(logp.shape[0]):
        for t in range(logp.shape[1]):
            ratio = math.exp(logp[i, t] - old[i, t])
            out[i, t] = max(-adv[i, t] * ratio, -adv[i, t] * min(max(ratio, 1 - lo), 1 + hi))
    return out


def ref_gspo(logp, old, adv, mask, lo, hi):
    out = np.zeros_like(logp)
    for i in range(logp.shape[0]):
        n = mask[i].sum()
        s = math.exp(sum((logp[i, t] - old[i, t]) * mask[i, t] for t in range(logp.shape[1])) / n)
        for t in range(logp.shape[1]):
            out[i, t] = max(-adv[i, t] * s, -adv[i, t] * min(max(s, 1 - lo), 1 + hi))
    return out


def ref_cispo(logp, old, adv, mask, lo, hi):
    out = np.zeros_like(logp)
    for i in range(logp.shape[0]):
        for t in range(logp.shape[1]):
            w = min(max(math.exp(logp[i, t] - old[i, t]), 0.0 if lo is None else 1 - lo), 1 + hi)
            out[i, t] = -w * adv[i, t] * logp[i, t]
    return out


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize(
    "loss,ref,eps", [("ppo", ref_ppo, (0.2, 0.28)), ("gspo", ref_gspo, (0.05, 0.08)), ("cispo", ref_cispo, (None, 0.5))]
)
@pytest.mark.parametrize("seed", range(3))
def test_losses_match_the_reference(loss, ref, eps, mode, seed):
    _, _, logp, old, mask, adv = random_batch(seed)
    got, stats = ca.policy_loss(
        loss,
        torch.tensor(logp),
        torch.tensor(old),
        torch.tensor(adv),
        torch.tensor(mask),
        eps_low=eps[0],
        eps_high=eps[1],
        agg=mode,
        norm=12.0,
    )
    want = ref_aggregate(ref(logp, old, adv, mask, *eps), mask, mode, norm=12.0)
    assert float(got) == pytest.approx(float(want), rel=1e-6, abs=1e-9)
    assert 0.0 <= stats["clip_frac_high"] <= 1.0 and stats["ratio_min"] <= stats["ratio_max"]


def test_ppo_by_hand():
    logp, old = torch.tensor([[math.log(1.5), math.log(0.5)]]), torch.zeros(1, 2)
    adv, mask = torch.tensor([[1.0, -1.0]]), torch.ones(1, 2)
    # token 1: ratio 1.5 > 1.2 with A > 0 -> clipped to 1.2: -1.2; token 2: ratio 0.5 < 0.8 with A < 0 -> 0.8
    loss, stats = ca.ppo_clip_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.2)
    assert float(loss) == pytest.approx((-1.2 + 0.8) / 2)
    assert stats["clip_frac_high"] == 0.5 and stats["clip_frac_low"] == 0.5


def test_ppo_clip_fraction_and_gradient_of_clipped_tokens():
    logp = torch.tensor([[math.log(2.0), 0.0]], requires_grad=True)
    loss, stats = ca.ppo_clip_loss(logp, torch.zeros(1, 2), torch.tensor([[1.0, 1.0]]), torch.ones(1, 2), eps_low=0.2, eps_high=0.28)
    loss.backward()
    assert logp.grad[0, 0] == 0.0 and logp.grad[0, 1] == pytest.approx(-0.5)  # clipped token: no gradient


def test_kl_k3_entropy_and_tis():
    logp, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -2.0])
    d = -0.5
    assert ca.kl_k3(logp, ref).tolist() == pytest.approx([math.exp(d) - d - 1, 0.0])
    assert (ca.kl_k3(torch.randn(50), torch.randn(50)) >= 0).all()
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0]]])
    assert ca.entropy_from_logits(logits).item() == pytest.approx(math.log(4))
    w = ca.truncated_is_weights(torch.tensor([0.0, 0.0]), torch.tensor([-2.0, 0.5]), cap=2.0)
    assert w.tolist() == pytest.approx([2.0, math.exp(-0.5)])
    gap = ca.logprob_gap(torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.1, -5.0]]), torch.tensor([[1.0, 0.0]]))
    assert gap["logprob_gap_max"] == pytest.approx(0.1)


def test_unknown_names_say_what_exists():
    with pytest.raises(KeyError, match="token-mean"):
        ca.aggregate(torch.ones(1, 1), torch.ones(1, 1), "bogus")
    with pytest.raises(KeyError, match="ppo"):
        ca.policy_loss("bogus")


# ---- only the policy's own tokens are trained ---------------------------------------------------


@pytest.mark.parametrize("loss", ["ppo", "gspo", "cispo"])
def test_observation_tokens_get_exactly_zero_gradient(loss):
    """Through a real model: logits gradients at template/observation positions are exactly 0,
    and changing the input logprob of an observation token changes nothing."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(20, 8), torch.nn.Linear(8, 20))
    ids = torch.randint(0, 20, (2, 6))
    mask = torch.tensor([[0, 0, 1, 1, 0, 1], [0, 1, 1, 0, 0, 0]], dtype=torch.float32)
    adv = ca.broadcast(torch.tensor([1.0, -0.5]), mask)
    hidden = model[0](ids)
    hidden.retain_grad()
    logits = model[1](hidden)
    logp = torch.log_softmax(logits, -1).gather(2, ids.unsqueeze(2)).squeeze(2)
    old = logp.detach()  # on-policy: nothing clipped, so every policy token must get gradient
    value, _ = ca.policy_loss(loss, logp, old, adv, mask)
    value.backward()
    grad_per_position = hidden.grad.abs().sum(-1)
    assert (grad_per_position[mask == 0] == 0).all() and (grad_per_position[mask == 1] > 0).all()
    changed = old.clone()
    changed[0, 0] -= 5.0  # an observation token's logprob input
    again, _ = ca.policy_loss(loss, logp.detach(), changed, adv, mask)
    base, _ = ca.policy_loss(loss, logp.detach(), old, adv, mask)
    assert float(again) == float(base)
