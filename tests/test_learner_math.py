"""Each loss and aggregation as its paper writes it, through the real Learner on a real (tiny)
transformer, with the batch split into several micro-batches: the accumulated gradient equals the
gradient of the formula computed here by hand (loops over sequences and tokens) on the whole
batch. And off-policy data: a stale batch gives a different update than the same batch made
fresh, by the truncated importance weights the formula says."""

import pytest
import torch

import toolgym
from toolgym.harness.demonstrations import collect_demonstrations
from toolgym.inference.hf_policy import HFPolicy
from toolgym.tasks import builtin_suite
from toolgym.trainers.batching import TokenBatch, pack, sequence_logprobs
from toolgym.trainers.learner import DEFAULT_TIS_CAP, LOSS_DEFAULTS, Learner, LearnerConfig, loss_settings

ADVANTAGES = [0.5, -1.0, 2.0, 0.1, -0.3, 1.0]
BUDGET = 64  # generation budget: Dr.GRPO's constant


@pytest.fixture(scope="module")
def demo_batch(tiny_dir):
    policy = HFPolicy(tiny_dir, device="cpu", dtype="fp32")
    demos = collect_demonstrations(
        builtin_suite("records").split("train").tasks[:6], policy.tokenizer, lambda *a: toolgym.make("records-v0").unwrapped, progress=False
    )
    return pack(demos, ADVANTAGES, policy.pad_id)


def _grads(model):
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def _learner_grads(tiny_dir, batch, config, off_policy=False):
    policy = HFPolicy(tiny_dir, device="cpu", dtype="fp32")
    learner = Learner(policy.model, config, off_policy=off_policy, generation_budget=BUDGET)
    learner._step = lambda: 0.0  # keep the gradients to compare them
    metrics = learner.rl_step(batch)
    return _grads(policy.model), metrics, learner


def _hand_loss(logp, batch, loss, agg, eps_low, eps_high, weights=None):
    """The paper's objective, one sequence and one token at a time. One update per batch: the old
    policy is the current one (ratio 1 in value, gradient through logp)."""
    rows = []
    for i in range(logp.shape[0]):
        tokens = [t for t in range(logp.shape[1]) if batch.mask[i, t] > 0]
        a = float(batch.advantages[i])
        if not tokens:
            rows.append((torch.zeros(()), 0))
            continue
        terms = []
        if loss == "gspo":  # s_i = exp(mean_t log ratio), clipped per sequence (GSPO eq. 5, GSPO-token gradient)
            s = torch.exp(sum(logp[i, t] - logp[i, t].detach() for t in tokens) / len(tokens)).detach()
        for t in tokens:
            r = torch.exp(logp[i, t] - logp[i, t].detach())
            w = 1.0 if weights is None else float(weights[i, t])
            if loss == "ppo":
                term = torch.maximum(-a * r, -a * torch.clamp(r, 1 - eps_low, 1 + eps_high))
            elif loss == "gspo":
                ratio = s * r
                term = torch.maximum(-a * ratio, -a * torch.clamp(ratio, 1 - eps_low, 1 + eps_high))
            else:  # cispo: -sg(clip(r, max=1+eps_high)) * A * log pi (MiniMax-M1 eq. 4)
                term = -torch.clamp(r.detach(), max=1 + eps_high) * a * logp[i, t]
            terms.append(term * w)
        rows.append((sum(terms), len(tokens)))
    if agg == "token-mean":
        return sum(s for s, _ in rows) / sum(n for _, n in rows)
    if agg == "seq-mean-token-mean":
        kept = [s / n for s, n in rows if n]
        return sum(kept) / len(kept)
    return sum(s for s, _ in rows) / (len(rows) * BUDGET)  # Dr.GRPO: a constant per sequence


def _hand_grads(tiny_dir, batch, loss, agg, weights=None):
    policy = HFPolicy(tiny_dir, device="cpu", dtype="fp32")
    logp, _ = sequence_logprobs(policy.model, batch.input_ids, batch.attention)
    clips = LOSS_DEFAULTS[loss]
    _hand_loss(logp, batch, loss, agg, clips["eps_low"] or 1.0, clips["eps_high"], weights).backward()
    return _grads(policy.model)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("loss", ["ppo", "gspo", "cispo"])
def test_each_loss_and_aggregation_matches_the_paper_over_micro_batches(tiny_dir, demo_batch, loss, agg):
    whole = _hand_grads(tiny_dir, demo_batch, loss, agg)
    split, _, learner = _learner_grads(tiny_dir, demo_batch, LearnerConfig(loss=loss, agg=agg, token_budget=600, grad_clip=1e9))
    assert learner.last_micro_batches >= 3  # the batch really was split
    assert whole.abs().max() > 0
    assert torch.allclose(split, whole, atol=1e-6, rtol=1e-4)


def test_clip_ranges_default_to_each_papers():
    assert loss_settings(LearnerConfig(loss="ppo")) == {"eps_low": 0.2, "eps_high": 0.28, "agg": "token-mean"}
    assert loss_settings(LearnerConfig(loss="gspo")) == {"eps_low": 3e-4, "eps_high": 4e-4, "agg": "seq-mean-token-mean"}
    assert loss_settings(LearnerConfig(loss="cispo"))["eps_low"] is None  # no lower clip on the IS weight
    assert loss_settings(LearnerConfig(loss="gspo", eps_high=1e-3))["eps_high"] == 1e-3  # a user's value wins


def test_dr_grpo_divides_by_the_generation_budget_whatever_the_split(tiny_dir, demo_batch):
    config = dict(loss="ppo", agg="seq-mean-token-sum-norm", grad_clip=1e9)
    one, _, _ = _learner_grads(tiny_dir, demo_batch, LearnerConfig(token_budget=100_000, **config))
    many, _, _ = _learner_grads(tiny_dir, demo_batch, LearnerConfig(token_budget=600, **config))
    assert torch.allclose(one, many, atol=1e-6, rtol=1e-4)
    doubled, _, _ = _learner_grads(tiny_dir, demo_batch, LearnerConfig(token_budget=600, agg_norm=2 * BUDGET, **config))
    assert torch.allclose(doubled * 2, many, atol=1e-6, rtol=1e-4)  # the constant, not a padded width


def _with_rollout_logp(batch: TokenBatch, rollout_logp: torch.Tensor) -> TokenBatch:
    return TokenBatch(batch.input_ids, batch.attention, batch.mask, rollout_logp * batch.mask, batch.advantages)


def test_a_stale_batch_is_corrected_by_truncated_importance_weights(tiny_dir, demo_batch):
    """The same tokens sampled by the current weights (fresh) and by older ones (stale): the
    updates differ, and the stale one equals the fresh formula with each token weighted by
    min(pi_train / pi_stale, cap)."""
    policy = HFPolicy(tiny_dir, device="cpu", dtype="fp32")
    with torch.no_grad():
        fresh_logp, _ = sequence_logprobs(policy.model, demo_batch.input_ids, demo_batch.attention)
        old = HFPolicy(tiny_dir, device="cpu", dtype="fp32").model
        gen = torch.Generator().manual_seed(0)
        for p in old.parameters():  # the weights a few updates ago
            p.add_(torch.randn(p.shape, generator=gen) * 0.02)
        stale_logp, _ = sequence_logprobs(old, demo_batch.input_ids, demo_batch.attention)
    fresh, stale = _with_rollout_logp(demo_batch, fresh_logp), _with_rollout_logp(demo_batch, stale_logp)
    config = LearnerConfig(loss="ppo", token_budget=600, grad_clip=1e9)
    g_fresh, m_fresh, _ = _learner_grads(tiny_dir, fresh, config, off_policy=True)
    g_stale, m_stale, _ = _learner_grads(tiny_dir, stale, config, off_policy=True)
    assert not torch.allclose(g_fresh, g_stale, atol=1e-5)
    weights = torch.clamp(torch.exp(fresh_logp - stale_logp), max=DEFAULT_TIS_CAP)
    expected = _hand_grads(tiny_dir, demo_batch, "ppo", "token-mean", weights)
    assert torch.allclose(g_stale, expected, atol=1e-6, rtol=1e-4)
    assert torch.allclose(g_fresh, _hand_grads(tiny_dir, demo_batch, "ppo", "token-mean"), atol=1e-6, rtol=1e-4)
    # the mismatch is measured and logged: none when fresh, some when stale
    assert m_fresh["logprob_gap_mean"] < 1e-5 and m_fresh["mismatch_kl"] < 1e-8
    assert m_stale["logprob_gap_mean"] > 1e-3 and m_stale["mismatch_kl"] > 0 and m_stale["tis_cap"] == DEFAULT_TIS_CAP
    on = demo_batch.mask.bool()
    assert m_stale["tis_truncated_frac"] == pytest.approx(float((torch.exp(fresh_logp - stale_logp)[on] > 2).double().mean()), abs=1e-6)


def test_tis_is_off_on_policy_and_on_off_policy_by_default(tiny_dir):
    policy = HFPolicy(tiny_dir, device="cpu", dtype="fp32")
    assert Learner(policy.model, LearnerConfig()).tis_cap() is None
    assert Learner(policy.model, LearnerConfig(), off_policy=True).tis_cap() == DEFAULT_TIS_CAP
    assert Learner(policy.model, LearnerConfig(tis_cap=None), off_policy=True).tis_cap() is None


def test_the_sft_anchor_adds_its_coefficient_times_the_demonstrations_nll(tiny_dir, demo_batch):
    """PPO-ptx: the anchored update's gradient is the policy loss's plus coef x the token-mean
    NLL of the demonstrations, whatever the micro-batch split; without the anchor it is the
    policy loss's alone."""
    anchor = TokenBatch(
        demo_batch.input_ids[3:], demo_batch.attention[3:], demo_batch.mask[3:], demo_batch.rollout_logp[3:], torch.zeros(3)
    )  # three of the rows, as demonstrations
    policy = HFPolicy(tiny_dir, device="cpu", dtype="fp32")
    logp, _ = sequence_logprobs(policy.model, demo_batch.input_ids, demo_batch.attention)
    pg = _hand_loss(logp, demo_batch, "ppo", "token-mean", 0.2, 0.28)
    a_logp, _ = sequence_logprobs(policy.model, anchor.input_ids, anchor.attention)
    nll = -(a_logp * anchor.mask).sum() / anchor.mask.sum()
    (pg + 0.3 * nll).backward()
    by_hand = _grads(policy.model)

    policy = HFPolicy(tiny_dir, device="cpu", dtype="fp32")
    learner = Learner(policy.model, LearnerConfig(token_budget=600, grad_clip=1e9), generation_budget=BUDGET)
    learner._step = lambda: 0.0
    metrics = learner.rl_step(demo_batch, anchor=anchor, anchor_coef=0.3)
    assert learner.last_micro_batches >= 3  # the RL batch really was split
    assert torch.allclose(_grads(policy.model), by_hand, atol=1e-6, rtol=1e-4)
    assert metrics["anchor_nll"] == pytest.approx(float(nll), rel=1e-4)
    assert metrics["anchor_tokens"] == int(anchor.mask.sum())
    plain, plain_metrics, _ = _learner_grads(tiny_dir, demo_batch, LearnerConfig(token_budget=600, grad_clip=1e9))
    assert not torch.allclose(plain, by_hand, atol=1e-6, rtol=1e-4)  # the anchor really moved the gradient
    assert "anchor_nll" not in plain_metrics


def test_with_advantage_none_an_anchored_update_is_the_anchor_alone(tiny_dir, demo_batch):
    """The reward ablation (`rl.advantage: none`): zero advantages leave the policy-gradient term
    without gradient, so the update is coef x the demonstrations' NLL gradient, nothing else."""
    from toolgym.trainers import core_algos as ca

    anchor = TokenBatch(
        demo_batch.input_ids[3:], demo_batch.attention[3:], demo_batch.mask[3:], demo_batch.rollout_logp[3:], torch.zeros(3)
    )
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 0.0][: len(demo_batch.advantages)])
    zero = ca.ADVANTAGES["none"](rewards, torch.zeros(len(rewards), dtype=torch.long))
    ablated = TokenBatch(demo_batch.input_ids, demo_batch.attention, demo_batch.mask, demo_batch.rollout_logp, zero)
    policy = HFPolicy(tiny_dir, device="cpu", dtype="fp32")
    a_logp, _ = sequence_logprobs(policy.model, anchor.input_ids, anchor.attention)
    (0.3 * -(a_logp * anchor.mask).sum() / anchor.mask.sum()).backward()
    anchor_only = _grads(policy.model)

    policy = HFPolicy(tiny_dir, device="cpu", dtype="fp32")
    learner = Learner(policy.model, LearnerConfig(token_budget=600, grad_clip=1e9), generation_budget=BUDGET)
    learner._step = lambda: 0.0
    learner.rl_step(ablated, anchor=anchor, anchor_coef=0.3)
    assert torch.allclose(_grads(policy.model), anchor_only, atol=1e-6, rtol=1e-4)
    graded, _, _ = _learner_grads(tiny_dir, demo_batch, LearnerConfig(token_budget=600, grad_clip=1e9))
    assert graded.abs().sum() > 0  # the same batch with its advantages does carry a gradient


def test_mini_batches_reuse_the_logprobs_from_before_any_update_whatever_the_split(tiny_dir, demo_batch):
    """`updates_per_batch: 2`: two optimizer steps on halves of the batch, the second with the
    PPO ratio against the log-probabilities taken before the first (they moved: the ratio is
    not 1). The token budgets split the rows into micro-batches of different widths in the two
    passes (at 1,600 a half's rows share a micro-batch they did not share in the first pass);
    the update does not depend on the split (Adam's first steps move weights of near-zero
    gradient by up to about lr, hence the tolerance)."""
    results = []
    for budget in (600, 1_600, 100_000):
        policy = HFPolicy(tiny_dir, device="cpu", dtype="fp32")
        learner = Learner(
            policy.model, LearnerConfig(lr=1e-2, updates_per_batch=2, token_budget=budget, grad_clip=1e9), generation_budget=BUDGET
        )
        metrics = learner.rl_step(demo_batch)
        assert metrics["ratio_max"] > 1 + 1e-3 or metrics["ratio_min"] < 1 - 1e-3
        results.append((metrics, torch.cat([p.detach().flatten() for p in policy.model.parameters()])))
    (first, w_first), *others = results
    for metrics, weights in others:
        assert metrics["ratio_max"] == pytest.approx(first["ratio_max"], rel=1e-4)
        assert metrics["ratio_min"] == pytest.approx(first["ratio_min"], rel=1e-4)
        assert torch.allclose(weights, w_first, atol=1e-3)


def test_tokens_the_exploration_forced_count_as_on_policy(tiny_dir, demo_batch):
    """Tokens a rollout's tool exploration forced have no behaviour logprob (NaN in the batch):
    off-policy, their importance weight is 1 (as if the current policy had sampled them), the
    other tokens keep theirs, and no statistic turns NaN."""
    policy = HFPolicy(tiny_dir, device="cpu", dtype="fp32")
    with torch.no_grad():
        fresh_logp, _ = sequence_logprobs(policy.model, demo_batch.input_ids, demo_batch.attention)
    stale_logp = fresh_logp - 0.3  # every token 1.35x likelier now than when sampled: weight exp(0.3)
    forced = torch.zeros_like(demo_batch.mask, dtype=torch.bool)
    for row in range(forced.shape[0]):  # the first three policy tokens of every row
        forced[row, demo_batch.mask[row].nonzero().flatten()[:3]] = True
    explored = _with_rollout_logp(demo_batch, torch.where(forced, torch.full_like(stale_logp, float("nan")), stale_logp))
    config = LearnerConfig(loss="ppo", token_budget=600, grad_clip=1e9)
    grads, metrics, _ = _learner_grads(tiny_dir, explored, config, off_policy=True)
    weights = torch.where(forced, torch.ones_like(fresh_logp), torch.full_like(fresh_logp, float(torch.exp(torch.tensor(0.3)))))
    assert torch.allclose(grads, _hand_grads(tiny_dir, demo_batch, "ppo", "token-mean", weights), atol=1e-6, rtol=1e-4)
    assert all(v == v for v in metrics.values() if isinstance(v, float))  # no NaN
