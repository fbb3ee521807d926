"""Reward shaping and group filtering as pure functions (`toolgym.trainers.rewards`): side-effect
prices, partial credit, the overlong penalty, and which groups can carry a gradient."""

import pytest
import torch

from toolgym.harness.trajectory import Segment, Trajectory
from toolgym.sandbox import SafetyPolicy, SandboxConfig
from toolgym.trainers.core_algos import grpo_advantages
from toolgym.trainers.rewards import broken_groups, groups_of, informative_groups, sampler_score, shaped_reward, trained_reward
from toolgym.verifiers import Outcome, Verdict


def _traj(group, reward, outcome=Outcome.PASSED, effects=(), policy_tokens=0):
    segments = [Segment(kind="policy", token_ids=[1] * policy_tokens, logprobs=[0.0] * policy_tokens)] if policy_tokens else []
    return Trajectory(
        segments=segments,
        task_id=group,
        group_id=group,
        seed=0,
        policy="p",
        env_id="toolgym/shell-ops-v0",
        reward=reward,
        outcome=outcome,
        side_effects=[dict(e) for e in effects],
    )


def test_a_violating_side_effect_gets_the_configured_penalty_in_its_advantage():
    # the policy as a campaign builds it from an env's `sandbox:` settings
    policy = SandboxConfig.model_validate(
        {"backend": "bwrap", "policy": {"rules": {"write_outside_workspace": {"action": "penalize", "penalty": 0.75}}}}
    ).policy
    clean = _traj("g", 1.0)
    dirty = _traj("g", 1.0, effects=[{"kind": "write_outside_workspace", "step": 1, "detail": "write: /etc/x"}])
    recorded = _traj("g", 1.0, effects=[{"kind": "delete_preexisting", "step": 1}])  # no rule: not a violation
    rewards = [shaped_reward(t, policy) for t in (clean, dirty, recorded)]
    assert rewards == [1.0, 0.25, 1.0]
    adv = grpo_advantages(torch.tensor(rewards), torch.tensor([0, 0, 0]))
    assert adv[1] < 0 < adv[0] and adv[0] == adv[2]


def test_partial_credit_orders_failures_below_every_pass_and_only_when_asked():
    """A failure trains with w times its verdict's partial credit (the closer failure gets the
    larger advantage), a pass with 1, a failure without partial credit with 0; at w = 0 every
    failure is 0 again. Grading is untouched: the trajectories' own rewards stay 0 and 1."""

    def graded(reward, credit=None, outcome=None):
        details = {} if credit is None else {"partial_credit": credit}
        outcome = outcome or (Outcome.PASSED if reward == 1.0 else Outcome.FAILED)
        traj = _traj("g", reward, outcome=outcome)
        traj.verdict = Verdict(reward=reward, passed=reward == 1.0, outcome=outcome, details=details)
        return traj

    group = [graded(1.0), graded(0.0, 0.9), graded(0.0, 0.3), graded(0.0)]
    rewards = {w: [shaped_reward(t, SafetyPolicy(), w) for t in group] for w in (0.5, 0.0)}
    assert rewards[0.5] == pytest.approx([1.0, 0.45, 0.15, 0.0])
    assert rewards[0.0] == [1.0, 0.0, 0.0, 0.0]
    adv = grpo_advantages(torch.tensor(rewards[0.5]), torch.zeros(4, dtype=torch.long))
    assert adv[0] > adv[1] > adv[2] > adv[3]
    assert [t.reward for t in group] == [1.0, 0.0, 0.0, 0.0]
    # an episode cut by its turn limit is graded on what it left: its partial credit counts too
    assert shaped_reward(graded(0.0, 0.5, Outcome.TRUNCATED), SafetyPolicy(), 0.5) == pytest.approx(0.25)
    assert shaped_reward(graded(0.0, 0.5, Outcome.TIMEOUT), SafetyPolicy(), 0.5) == 0.0
    # the sampler counts passes, or with partial credit on, the shaped reward a task's attempts earn
    near = graded(0.0, 0.9)
    assert sampler_score(near, shaped_reward(near, SafetyPolicy(), 0.0), 0.0) == 0.0
    assert sampler_score(near, shaped_reward(near, SafetyPolicy(), 0.5), 0.5) == pytest.approx(0.45)
    assert sampler_score(group[0], 1.0, 0.0) == 1.0 and sampler_score(group[0], 1.0, 0.5) == 1.0
    assert sampler_score(graded(0.0), -0.5, 0.5) == 0.0  # a price below 0 is not a rate below 0
    # a state checker's credit below 0 (a change the wrong way) trains below leaving things alone
    wrong_way = graded(0.0, -0.5)
    assert shaped_reward(wrong_way, SafetyPolicy(), 0.5) == pytest.approx(-0.25)
    assert shaped_reward(graded(0.0, 0.0), SafetyPolicy(), 0.5) == 0.0
    assert sampler_score(wrong_way, -0.25, 0.5) == 0.0


def test_the_overlong_penalty_is_dapos_soft_one_and_only_when_asked():
    truncated = _traj("g", 0.0, outcome=Outcome.TRUNCATED)
    assert trained_reward(truncated, 0.0, "penalize", 100, 20) == -1.0
    assert trained_reward(truncated, 0.0, "drop", 100, 20) == 0.0
    inside = _traj("g", 1.0, policy_tokens=80)  # right at the buffer's start: no penalty
    half = _traj("g", 1.0, policy_tokens=90)  # half way into the last 20 tokens
    full = _traj("g", 1.0, policy_tokens=130)  # past the budget: the whole penalty, no more
    assert [trained_reward(t, 1.0, "penalize", 100, 20) for t in (inside, half, full)] == [1.0, 0.5, 0.0]
    assert trained_reward(half, 1.0, "penalize", None, 20) == 1.0  # no budget known: nothing to measure against


def test_a_call_cost_ranks_passes_by_their_calls_and_never_pushes_a_failure_below_zero():
    lean, walked = _traj("g", 1.0), _traj("g", 1.0)
    lean.tool_calls, walked.tool_calls = 3, 7  # read, write, submit / the whole tool list walked
    costs = [trained_reward(t, 1.0, "keep", None, 0, call_cost=0.05) for t in (lean, walked)]
    assert costs == pytest.approx([0.85, 0.65])
    adv = grpo_advantages(torch.tensor(costs), torch.tensor([0, 0]))
    assert adv[0] > 0 > adv[1]  # the same right state, the leaner episode trains up
    assert trained_reward(walked, 1.0, "keep", None, 0) == 1.0  # no cost unless asked
    assert trained_reward(walked, 0.2, "keep", None, 0, call_cost=0.05) == 0.0  # floored at 0, like a price
    failed = _traj("g", 0.0, outcome=Outcome.FAILED)
    failed.tool_calls = 9
    # a failure keeps its reward (0, or a credit below 0): costing it would teach calling nothing
    assert trained_reward(failed, 0.0, "keep", None, 0, call_cost=0.05) == 0.0
    assert trained_reward(failed, -0.25, "keep", None, 0, call_cost=0.05) == -0.25


def test_groups_with_an_infra_error_are_broken_and_equal_rewards_carry_no_gradient():
    trajs = [
        _traj("a", 1.0),
        _traj("a", 0.0, Outcome.FAILED),  # informative
        _traj("b", 1.0),
        _traj("b", 1.0),  # all pass: no gradient
        _traj("c", 1.0),
        _traj("c", 0.0, Outcome.INFRA_ERROR),  # ours, not the policy's: dropped whole
        _traj("d", 0.0, Outcome.FAILED),
        _traj("d", 0.0, Outcome.VERIFIER_ERROR),
    ]
    groups = groups_of(trajs)
    assert groups == {"a": [0, 1], "b": [2, 3], "c": [4, 5], "d": [6, 7]}
    assert broken_groups(trajs, groups) == {"c", "d"}
    assert informative_groups(trajs, [t.reward for t in trajs]) == ["a"]
    # shaped rewards decide, not the verdicts: a priced side effect splits an all-pass group
    assert informative_groups(trajs, [1.0, 0.0, 1.0, 0.25, 1.0, 0.0, 0.0, 0.0]) == ["a", "b"]


def test_a_steps_metrics_per_suite_count_groups_with_a_gradient_per_family_and_the_trained_token_share():
    from toolgym.harness.trajectory import TurnRecord
    from toolgym.trainers.step_metrics import suite_metrics

    def episode(task, group, reward, family, turns, effects=()):
        t = _traj(group, reward, Outcome.PASSED if reward == 1.0 else Outcome.FAILED, effects, policy_tokens=3)
        t.task_id, t.family = task, family
        t.segments = [Segment(kind="template", token_ids=[0] * 5), *t.segments, Segment(kind="observation", token_ids=[0] * 2)]
        t.turns = [TurnRecord() for _ in range(turns)]
        return t

    trajs = [
        episode("a", "ga", 1.0, "inv/ship", 2),
        episode("a", "ga", 0.0, "inv/ship", 4),  # a gradient
        episode("b", "gb", 0.0, "inv/exact", 3, [{"kind": "network_attempt", "step": 1}]),
        episode("b", "gb", 0.0, "inv/exact", 3),
        episode("c", "gc", 1.0, "simple", 1),
        episode("c", "gc", 1.0, "simple", 1),
    ]
    out = suite_metrics(trajs, [t.reward for t in trajs], {"a": "inventory", "b": "inventory", "c": "bfcl"})
    inv, bfcl = out["inventory"], out["bfcl"]
    assert inv["groups_by_family"] == {"inv/exact": {"groups": 1, "with_gradient": 0}, "inv/ship": {"groups": 1, "with_gradient": 1}}
    assert bfcl["groups_by_family"] == {"simple": {"groups": 1, "with_gradient": 0}}
    assert inv["turns_mean"] == 3.0 and inv["pass_rate"] == 0.25 and inv["side_effect_episodes"] == 0.25
    assert inv["trained_token_share"] == 3 / 10  # 3 policy tokens of 5 template + 3 + 2 observation
