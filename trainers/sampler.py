"""Which tasks to roll out next: the learnability sampler (p(1-p) before any rollout) or uniform.

A task whose pass rate p is 0 or 1 teaches nothing: every member of its GRPO group gets the same
reward, so every advantage is 0. The reward's variance is p(1-p), largest at p = 1/2. The
`LearnabilitySampler` keeps a Beta posterior of p per task, updated from every graded attempt,
and draws tasks in proportion to the posterior expectation E[p(1-p)] = ab / ((a+b)(a+b+1))
*before* paying for rollouts (LILO, arXiv 2502.12272), with a floor so no task starves. Tasks
confidently solved or confidently unsolvable are retired from the draw, reported, and re-tested
now and then (the policy moves). Difficulty labels are never used. `uniform` is the ablation.

Tasks of one group (a family) share evidence: in a suite of a thousand tasks a short campaign
rarely draws a task twice, so a per-task posterior alone would leave every unseen task at the
prior and the draw uniform. Each task's posterior therefore adds its group's pooled pass rate,
worth at most `pool_strength` attempts (an empirical-Bayes prior): after one step, the unseen
tasks of a family that always passes, or never does, are drawn less than those of a family near
one half, before any of them is rolled out.

Screening (`screen`: N) goes further, per task: N candidates are drawn per task needed, the
campaign scores each one's reference solution under the sampling policy (trainers/screening.py)
and `keep_screened` keeps those whose predicted pass rate promises the most reward variance.

The state is plain JSON (`state_dict`), saved in every checkpoint.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

_GRID = np.linspace(0.0005, 0.9995, 1000)  # for Beta tail probabilities without scipy


class TaskStats(BaseModel):
    """The posterior of one task's pass rate and its bookkeeping."""

    alpha: float
    beta: float
    attempts: int = 0
    passes: float = 0.0
    retired: str | None = None  # "solved" | "unsolvable" | None
    retired_at: int | None = None

    @property
    def mean(self) -> float:
        """Posterior mean pass rate."""
        return self.alpha / (self.alpha + self.beta)

    @property
    def learnability(self) -> float:
        """E[p(1-p)] under the posterior."""
        a, b = self.alpha, self.beta
        return a * b / ((a + b) * (a + b + 1))


def beta_tail(alpha: float, beta: float, lo: float | None = None, hi: float | None = None) -> float:
    """P(p > hi) (or P(p < lo)) under Beta(alpha, beta), by numeric integration on a grid."""
    logpdf = (alpha - 1) * np.log(_GRID) + (beta - 1) * np.log1p(-_GRID)
    pdf = np.exp(logpdf - logpdf.max())
    pdf /= pdf.sum()
    if hi is not None:
        return float(pdf[_GRID > hi].sum())
    return float(pdf[_GRID < (lo if lo is not None else 0.0)].sum())


class SamplerConfig(BaseModel):
    """How tasks are chosen."""

    model_config = ConfigDict(extra="forbid")

    kind: str = Field(
        default="learnability",
        pattern="^(learnability|uniform)$",
        description="learnability (p(1-p) before rollout) | uniform (the ablation)",
    )
    prior: tuple[float, float] = Field(default=(1.0, 1.0), description="Beta prior (alpha, beta) of a new task")
    floor: float = Field(default=0.02, ge=0.0, description="minimum draw weight of an active task")
    decay: float = Field(default=0.98, gt=0.0, le=1.0, description="per update, old evidence is kept with this weight (the policy moves)")
    retire_confidence: float = Field(default=0.95, gt=0.5, lt=1.0)
    solved_above: float = Field(default=0.9, gt=0.5, le=1.0)
    unsolvable_below: float = Field(default=0.05, ge=0.0, lt=0.5)
    min_attempts: int = Field(default=8, ge=1, description="attempts before a task may be retired")
    retest_every: int = Field(default=10, ge=1, description="every N draws one retired task is tried again")
    pool_strength: float = Field(
        default=16.0,
        ge=0.0,
        description="a task's posterior includes its group's (family's) pooled pass rate, worth at most this many attempts; 0 = no pooling",
    )
    screen: int = Field(
        default=0,
        ge=0,
        description="draw this many candidates per task needed and keep those "
        "whose reference solution's probability under the policy predicts the most reward "
        "variance (trainers/screening.py); 0 or 1 = off",
    )
    screen_strength: float = Field(
        default=8.0,
        gt=0.0,
        description="a screened task's predicted pass rate counts as this many attempts (it replaces the family's pooled evidence)",
    )
    screen_declines: bool = Field(
        default=False,
        description="a task that any answer without a call passes "
        "(BFCL irrelevance) is screened by 1 - p(the answer opens a call) instead of "
        "p(its oracle's fixed sentence), which a policy that declines in its own words "
        "never says (trainers/screening.py)",
    )
    stratify: bool = Field(
        default=False,
        description="split each draw evenly across the suite's families (the "
        "groups), the weights choosing within each family: no family is left out of a step "
        "because it passes often (a family the policy has mastered still holds its ground)",
    )


class LearnabilitySampler:
    """Draws tasks by expected reward variance (or uniformly); see the module docstring."""

    def __init__(self, task_ids: list[str], config: SamplerConfig | None = None, groups: dict[str, str] | None = None) -> None:
        if not task_ids:
            raise ValueError("the sampler needs at least one task")
        self.config = config or SamplerConfig()
        a, b = self.config.prior
        self.stats: dict[str, TaskStats] = {t: TaskStats(alpha=a, beta=b) for t in dict.fromkeys(task_ids)}
        #: task id -> its group (family) for pooling; tasks not listed stand alone
        self.groups: dict[str, str] = dict(groups or {})
        #: group -> [passes, fails], decayed like the tasks' evidence
        self.pooled: dict[str, list[float]] = {}
        self.draws = 0

    def posterior(self, task_id: str) -> tuple[float, float]:
        """The Beta (alpha, beta) a draw uses: the task's own, plus its group's pooled evidence
        scaled to at most `pool_strength` attempts."""
        s = self.stats[task_id]
        pool = self.pooled.get(self.groups.get(task_id, ""))
        if not pool or self.config.pool_strength == 0 or sum(pool) == 0:
            return s.alpha, s.beta
        scale = min(1.0, self.config.pool_strength / sum(pool))
        return s.alpha + scale * pool[0], s.beta + scale * pool[1]

    def learnability(self, task_id: str) -> float:
        """E[p(1-p)] under the task's (pooled) posterior."""
        a, b = self.posterior(task_id)
        return a * b / ((a + b) * (a + b + 1))

    # ---- drawing -------------------------------------------------------------------------------

    def weights(self, ids: list[str]) -> np.ndarray:
        """Draw weights of `ids` (uniform, or max(E[p(1-p)], floor))."""
        if self.config.kind == "uniform":
            return np.ones(len(ids))
        return np.array([max(self.learnability(t), self.config.floor) for t in ids])

    def family_quotas(self, n: int, rng: np.random.Generator, exclude: set[str] | frozenset[str] = frozenset()) -> dict[str, int]:
        """How many of `n` tasks each family gets in a stratified draw (`stratify`): as even as
        the families' sizes allow, the remainder to families chosen at random. A task without a
        group is its own family."""
        sizes: dict[str, int] = {}
        for t in self.stats:
            if t not in exclude:
                family = self.groups.get(t, t)
                sizes[family] = sizes.get(family, 0) + 1
        quotas = dict.fromkeys(sizes, 0)
        left = min(n, sum(sizes.values()))
        while left > 0:
            open_families = [f for f in sizes if quotas[f] < sizes[f]]
            share, extra = divmod(left, len(open_families))
            lucky = set(rng.choice(len(open_families), size=extra, replace=False).tolist()) if extra else set()
            for i, f in enumerate(open_families):
                add = min(share + (i in lucky), sizes[f] - quotas[f])
                quotas[f] += add
                left -= add
        return {f: q for f, q in quotas.items() if q > 0}

    def draw(
        self, n: int, rng: np.random.Generator, exclude: set[str] | frozenset[str] = frozenset(), family: str | None = None
    ) -> list[str]:
        """`n` distinct task ids (fewer only if fewer tasks exist), before any rollout; none of
        `exclude` (tasks this step already plays); only tasks of `family` when one is named (a
        stratified draw asks once per family, with `family_quotas`). Each call counts as one
        draw for `retest_every`."""
        self.draws += 1

        def eligible(t: str) -> bool:
            return t not in exclude and (family is None or self.groups.get(t, t) == family)

        active = [t for t, s in self.stats.items() if (s.retired is None or self.config.kind == "uniform") and eligible(t)]
        retired = [t for t, s in self.stats.items() if s.retired is not None and self.config.kind != "uniform" and eligible(t)]
        chosen: list[str] = []
        if retired and self.draws % self.config.retest_every == 0:
            chosen.append(retired[int(rng.integers(len(retired)))])  # re-test one: the policy may have moved
        pool = active if active else retired
        pool = [t for t in pool if t not in chosen]
        k = min(n - len(chosen), len(pool))
        if k > 0:
            w = self.weights(pool)
            picks = rng.choice(len(pool), size=k, replace=False, p=w / w.sum())
            chosen += [pool[int(i)] for i in picks]
        return chosen

    def screened_learnability(self, task_id: str, predicted: float) -> float:
        """E[p(1-p)] under the task's own posterior plus a predicted pass rate worth
        `screen_strength` attempts (in place of the family's pooled evidence: the prediction is
        about this task, and fresh)."""
        s, k = self.stats[task_id], self.config.screen_strength
        a, b = s.alpha + k * predicted, s.beta + k * (1.0 - predicted)
        return a * b / ((a + b) * (a + b + 1))

    def keep_screened(self, candidates: list[str], n: int, predicted: dict[str, float]) -> list[str]:
        """The `n` candidates with the most expected reward variance: screened ones by their
        predicted pass rate, the others by their posterior (ties keep the draw's random order)."""

        def score(task_id: str) -> float:
            if task_id in predicted:
                return self.screened_learnability(task_id, predicted[task_id])
            return self.learnability(task_id)

        ranked = sorted(range(len(candidates)), key=lambda i: -score(candidates[i]))
        return [candidates[i] for i in sorted(ranked[:n])]

    # ---- learning from attempts ---------------------------------------------------------------

    def update(self, task_id: str, rewards: list[float], step: int = 0) -> None:
        """Fold graded attempts (rewards in [0, 1]) into the task's posterior; retire or revive it.

        Only agent attempts belong here: infra and verifier errors are left out by the caller."""
        if not rewards:
            return
        s = self.stats[task_id]
        a0, b0 = self.config.prior
        d = self.config.decay
        s.alpha = a0 + d * (s.alpha - a0) + sum(rewards)
        s.beta = b0 + d * (s.beta - b0) + sum(1.0 - r for r in rewards)
        s.attempts += len(rewards)
        s.passes += sum(rewards)
        group = self.groups.get(task_id)
        if group is not None:
            pool = self.pooled.setdefault(group, [0.0, 0.0])
            pool[0] = d * pool[0] + sum(rewards)
            pool[1] = d * pool[1] + sum(1.0 - r for r in rewards)
        c = self.config
        if s.attempts < c.min_attempts:
            return
        if beta_tail(s.alpha, s.beta, hi=c.solved_above) > c.retire_confidence:
            verdict = "solved"
        elif beta_tail(s.alpha, s.beta, lo=c.unsolvable_below) > c.retire_confidence:
            verdict = "unsolvable"
        else:
            verdict = None
        if verdict != s.retired:
            s.retired, s.retired_at = verdict, (step if verdict else None)

    # ---- reporting and persistence ------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        """Counts of active / solved / unsolvable / unseen tasks and the mean learnability."""
        values = list(self.stats.values())
        active = [t for t, s in self.stats.items() if s.retired is None]
        return {
            "tasks": len(values),
            "active": len(active),
            "retired_solved": sum(s.retired == "solved" for s in values),
            "retired_unsolvable": sum(s.retired == "unsolvable" for s in values),
            "unseen": sum(s.attempts == 0 for s in values),
            "mean_learnability": float(np.mean([self.learnability(t) for t in active])) if active else 0.0,
            "mean_pass_rate": float(np.mean([s.mean for s in values if s.attempts])) if any(s.attempts for s in values) else math.nan,
            "group_pass_rate": {g: p[0] / sum(p) for g, p in sorted(self.pooled.items()) if sum(p) > 0},
        }

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly (JSON-able)."""
        return {
            "config": self.config.model_dump(mode="json"),
            "draws": self.draws,
            "stats": {t: s.model_dump() for t, s in self.stats.items()},
            "groups": self.groups,
            "pooled": self.pooled,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> LearnabilitySampler:
        """The sampler `state_dict` saved."""
        sampler = cls(list(state["stats"]), SamplerConfig.model_validate(state["config"]), state.get("groups"))
        sampler.stats = {t: TaskStats.model_validate(s) for t, s in state["stats"].items()}
        sampler.pooled = {g: list(p) for g, p in state.get("pooled", {}).items()}
        sampler.draws = int(state["draws"])
        return sampler


__all__ = ["LearnabilitySampler", "SamplerConfig", "TaskStats", "beta_tail"]
