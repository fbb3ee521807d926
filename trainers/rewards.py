"""What an episode trains with, and which groups can carry a gradient: pure functions of trajectories.

- `shaped_reward`: the verdict's reward (a failed or truncated episode may earn `partial_credit`
  times the verifier's partial credit, below 0 where that credit is) less the safety policy's
  prices for the episode's side effects.
- `sampler_score`: what an attempt adds to the sampler's running rate (its pass, or its shaped
  reward when partial credit is on).
- `trained_reward`: the shaped reward less a cost per tool call (an earned reward only) and DAPO's
  soft overlong penalty (`overlong: penalize`).
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
    """The verifier's reward (an episode that failed or ran out of turns: `partial_credit` times
    the verdict's partial credit, where the verifier gives one; a state checker's can be below 0,
    for changes away from the goal) less `policy`'s penalties for the episode's side effects. A
    truncated episode counts: a state checker grades what the agent left behind, however the
    episode ended."""
    reward = traj.reward
    failed = traj.outcome in (Outcome.FAILED, Outcome.TRUNCATED) and traj.verdict is not None
    if partial_credit > 0 and failed and "partial_credit" in traj.verdict.details:
        reward = partial_credit * float(traj.verdict.details["partial_credit"])
    events = []
    for e in traj.side_effects:
        try:
            events.append(SideEffect.model_validate(e))
        except ValueError:  # an event of a kind this version does not know prices nothing
            continue
    # prices take a reward down to 0 and no further; a credit below 0 (a change away from the
    # goal) is kept as it is, so it still trains below a failure that left things alone
    return policy.penalize(reward, events) if reward >= 0 else reward


def sampler_score(traj: Trajectory, shaped: float, partial_credit: float) -> float:
    """What one attempt adds to the learnability sampler's running rate: its pass (0 or 1), or,
    with `partial_credit` on, its `shaped` reward clipped to [0, 1]. The sampler draws by the
    reward's variance, and with partial credit a task nobody passes yet still has some: its
    failures differ in how close they came (a multi-change task at 0 passes would otherwise sit at
    the floor and its credit would rarely be trained)."""
    if partial_credit <= 0:
        return float(traj.outcome == Outcome.PASSED)
    return min(1.0, max(0.0, shaped))


def trained_reward(traj: Trajectory, shaped: float, overlong: str, budget: int | None, buffer: int, call_cost: float = 0.0) -> float:
    """`shaped` less `call_cost` per tool call the episode made, then DAPO's soft overlong penalty
    under `overlong == "penalize"`: a truncated episode loses 1; one that used the last `buffer`
    tokens of the generation `budget` loses up to 1, linearly.

    The call cost is a price like a side effect's: it takes an earned reward down to 0 and no
    further, so of two episodes that left the same right state the one with fewer calls trains
    higher (walking the whole tool list can leave the right stock too), and a failure is never
    pushed below doing nothing, which would teach the policy to stop calling tools at all."""
    if call_cost > 0 and shaped > 0:
        shaped = max(0.0, shaped - call_cost * traj.tool_calls)
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


__all__ = ["broken_groups", "groups_of", "informative_groups", "sampler_score", "shaped_reward", "trained_reward"]
