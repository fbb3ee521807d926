"""The metrics of one RL step's rollouts (what `Campaign.learn` logs besides the update's own)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from toolgym.harness.trajectory import Trajectory
from toolgym.trainers.rewards import groups_of, informative_groups
from toolgym.verifiers import Outcome


def rollout_metrics(trajs: list[Trajectory], rewards: list[float], seconds: float, broken: set[str]) -> dict[str, Any]:
    """What one step's rollouts did: rewards, outcomes, lengths, tool use, side effects, speed."""
    graded = [i for i, t in enumerate(trajs) if t.outcome.is_agent_attempt]
    r = np.array([rewards[i] for i in graded]) if graded else np.zeros(0)
    outcomes = Counter(t.outcome.value for t in trajs)
    n = max(1, len(trajs))
    policy_tokens = [sum(t.loss_mask) for t in trajs]
    effects = Counter(e.get("kind", "?") for t in trajs for e in t.side_effects)
    verify_s = sum(t.verdict.duration_s for t in trajs if t.verdict is not None)
    # how close the failures came, where the verifier says (`rl.partial_credit` may train on it)
    credits = [float(t.verdict.details["partial_credit"]) for t in trajs if t.verdict is not None and "partial_credit" in t.verdict.details]
    return {
        "reward_mean": float(r.mean()) if r.size else 0.0,
        "reward_std": float(r.std()) if r.size else 0.0,
        "pass_rate": sum(trajs[i].outcome == Outcome.PASSED for i in graded) / max(1, len(graded)),
        "episodes": len(trajs),
        "infra_or_verifier_errors": len(trajs) - len(graded),
        "groups_dropped_infra": len(broken),
        "outcomes": {k: v / n for k, v in outcomes.items()},
        "truncation_rate": outcomes.get("truncated", 0) / n,
        "limits_hit": dict(Counter(t.limit_hit for t in trajs if t.limit_hit)),
        "response_tokens_mean": float(np.mean(policy_tokens)) if policy_tokens else 0.0,
        "episode_tokens_mean": float(np.mean([len(t.token_ids) for t in trajs])),
        "turns_mean": float(np.mean([len(t.turns) for t in trajs])),
        "tool_calls_mean": float(np.mean([t.tool_calls for t in trajs])),
        "tool_errors_mean": float(np.mean([sum(t.tool_errors.values()) for t in trajs])),
        "side_effect_rate": {k: v / n for k, v in effects.items()},
        "episodes_with_side_effects": sum(bool(t.side_effects) for t in trajs) / n,
        "rollout_tokens_per_s": sum(policy_tokens) / max(seconds, 1e-9),
        "time_verify_s": verify_s,
        **({"failed_partial_credit_mean": float(np.mean(credits))} if credits else {}),
    }


def suite_metrics(trajs: list[Trajectory], rewards: list[float], suite_of: dict[str, str]) -> dict[str, dict[str, Any]]:
    """One step's rollouts per suite (`suite_of`: task id -> suite): pass rate, turns per episode,
    the share of episodes with a side effect, the share of the episodes' tokens that were trained
    (the policy's own; template and observation tokens are masked), and per family how many GRPO
    groups were played and how many had a gradient (not broken, trained rewards not all equal)."""
    live = set(informative_groups(trajs, rewards))
    out: dict[str, dict[str, Any]] = {}
    for suite in dict.fromkeys(suite_of.get(t.task_id, "?") for t in trajs):
        idx = [i for i, t in enumerate(trajs) if suite_of.get(t.task_id, "?") == suite]
        mine = [trajs[i] for i in idx]
        tokens = sum(len(t.token_ids) for t in mine)
        families: dict[str, list[int]] = {}
        for group, members in groups_of(mine).items():
            counts = families.setdefault(mine[members[0]].family or "?", [0, 0])
            counts[0] += 1
            counts[1] += group in live
        out[suite] = {
            "episodes": len(mine),
            "pass_rate": sum(t.outcome == Outcome.PASSED for t in mine) / max(1, len(mine)),
            "turns_mean": float(np.mean([len(t.turns) for t in mine])),
            "side_effect_episodes": sum(bool(t.side_effects) for t in mine) / max(1, len(mine)),
            "trained_token_share": sum(sum(t.loss_mask) for t in mine) / max(1, tokens),
            "groups_by_family": {f: {"groups": c[0], "with_gradient": c[1]} for f, c in sorted(families.items())},
        }
    return out


def staleness_metrics(trajs: list[Trajectory], current_version: int, dropped: int) -> dict[str, Any]:
    """How many weight versions behind the learner (`current_version`) the rollouts' oldest turns
    were, and how many trajectories were dropped for it."""
    staleness = [t.staleness(current_version) for t in trajs if t.weight_versions]
    return {
        "staleness_mean": float(np.mean(staleness)) if staleness else 0.0,
        "staleness_max": max(staleness, default=0),
        "stale_dropped": dropped,
    }


__all__ = ["rollout_metrics", "staleness_metrics", "suite_metrics"]
