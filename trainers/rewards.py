"""What an episode trains with, and which groups can carry a gradient: pure functions of trajectories.

- `shaped_reward`: the verdict's reward (a failure may earn `partial_credit` times the verifier's
  partial credit) less the safety policy's prices for the episode's side effects.
- `trained_reward`: the shaped reward less DAPO's soft overlong penalty (`overlong: penalize`).
- `groups_of`, `broken_groups`, `informative_groups`: GRPO groups by id; a group with an infra or
  verifier error says nothing about the policy and is dropped whole; a group whose trained
  rewards are all equal has no advantage to train on.

The campaign calls these; tests call them directly on hand-built trajectories.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from toolgym.harness.trajectory import Trajectory
from toolgym.sandbox import SafetyPolicy, SideEffect
from toolgym.verifiers import Outcome


def shaped_reward(traj: Trajectory, policy: SafetyPolicy, partial_credit: float = 0.0) -> float:
    """The verifier's reward (a failed episode: `partial_credit` times the verdict's partial
    credit, where the verifier gives one) less `policy`'s penalties for the episode's side effects."""
    reward = traj.reward
    if partial_credit > 0 and traj.outcome == Outcome.FAILED and traj.verdict is not None:
        reward = max(reward, partial_credit * float(traj.verdict.details.get("partial_credit", 0.0)))
    events = []
    for e in traj.side_effects:
        try:
            events.append(SideEffect.model_validate(e))
        except ValueError:  # an event of a kind this version does not know prices nothing
            continue
    return policy.penalize(reward, events)


def trained_reward(traj: Trajectory, shaped: float, overlong: str, budget: int | None, buffer: int) -> float:
    """`shaped` less DAPO's soft overlong penalty under `overlong == "penalize"`: a truncated
    episode loses 1; one that used the last `buffer` tokens of the generation `budget` loses up to
    1, linearly."""
    if overlong != "penalize":
        return shaped
    if traj.outcome == Outcome.TRUNCATED:
        return shaped - 1.0
    if not budget:
        return shaped
    over = sum(traj.loss_mask) - (budget - buffer)
    return shaped - min(1.0, max(0.0, over / buffer))


def groups_of(trajs: Sequence[Trajectory]) -> dict[str, list[int]]:
    """Trajectory indices by GRPO group id, in play order."""
    groups: dict[str, list[int]] = defaultdict(list)
    for i, t in enumerate(trajs):
        groups[t.group_id].append(i)
    return dict(groups)


def broken_groups(trajs: Sequence[Trajectory], groups: dict[str, list[int]]) -> set[str]:
    """Groups with an episode that is not the agent's attempt (infra or verifier error)."""
    return {g for g, idx in groups.items() if any(not trajs[i].outcome.is_agent_attempt for i in idx)}


def informative_groups(trajs: Sequence[Trajectory], rewards: Sequence[float]) -> list[str]:
    """Group ids, in play order, that can carry a gradient: not broken, and with trained rewards
    (`rewards[i]` is trajectory i's) that are not all equal."""
    groups = groups_of(trajs)
    broken = broken_groups(trajs, groups)
    return [g for g, idx in groups.items() if g not in broken and len({rewards[i] for i in idx}) > 1]


__all__ = ["broken_groups", "groups_of", "informative_groups", "shaped_reward", "trained_reward"]
