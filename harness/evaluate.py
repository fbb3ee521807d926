"""Evaluation: unbiased pass@k (Chen et al., 2021) with bootstrap confidence intervals, per family
and difficulty, with outcome rates, safety-event rates and tool use; a JSON file, a markdown
report and PNG plots.

Infra and verifier errors are excluded from pass@k (they say nothing about the policy) and are
reported as rates of their own.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from math import comb
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, Field

from toolgym.harness.trajectory import Trajectory
from toolgym.verifiers import Outcome


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimate of P(at least one of k samples passes) from n samples with c passes."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per task, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


class Estimate(BaseModel):
    """A point estimate with a bootstrap confidence interval over tasks."""

    value: float
    low: float
    high: float
    tasks: int


def _bootstrap(per_task: np.ndarray, rng: np.random.Generator, n_boot: int = 1000, level: float = 0.95) -> Estimate:
    if per_task.size == 0:
        return Estimate(value=float("nan"), low=float("nan"), high=float("nan"), tasks=0)
    idx = rng.integers(0, per_task.size, size=(n_boot, per_task.size))
    means = per_task[idx].mean(axis=1)
    alpha = (1 - level) / 2
    return Estimate(
        value=float(per_task.mean()),
        low=float(np.quantile(means, alpha)),
        high=float(np.quantile(means, 1 - alpha)),
        tasks=int(per_task.size),
    )


def per_task_pass_rate(trajs: list[Trajectory]) -> dict[str, float]:
    """Each task's pass rate over its graded samples (infra and verifier errors left out)."""
    graded: dict[str, list[bool]] = defaultdict(list)
    for t in trajs:
        if t.outcome.is_agent_attempt:
            graded[t.task_id].append(t.outcome == Outcome.PASSED)
    return {task: float(np.mean(v)) for task, v in graded.items()}


def paired_difference(
    before: list[Trajectory], after: list[Trajectory], seed: int = 0, n_boot: int = 2000, level: float = 0.95
) -> Estimate:
    """pass@1 of `after` minus `before` on the tasks both graded, with a paired bootstrap CI:
    tasks are resampled together, so the task-to-task spread that both evaluations share cancels
    (same tasks, same sampling seeds: the comparison the campaign's evaluations make)."""
    a, b = per_task_pass_rate(before), per_task_pass_rate(after)
    common = sorted(set(a) & set(b))
    diffs = np.array([b[t] - a[t] for t in common], dtype=float)
    return _bootstrap(diffs, np.random.default_rng(seed), n_boot=n_boot, level=level)


class EvalBudget(BaseModel):
    """What an evaluation allowed the policy: two evaluations compare only under the same budget."""

    temperature: float | None = None
    top_p: float | None = None
    samples: int = 1
    max_turns: int | None = None
    max_new_tokens_per_turn: int | None = None
    max_total_tokens: int | None = None
    watchdog_s: float | None = None

    def differences(self, other: EvalBudget | None) -> list[str]:
        """`field: a vs b` for every setting that differs (all of them when `other` is missing)."""
        if other is None:
            return ["the other evaluation recorded no budget"]
        a, b = self.model_dump(), other.model_dump()
        return [f"{k}: {a[k]} vs {b[k]}" for k in a if a[k] != b[k]]


def budget_warning(a: EvalReport, b: EvalReport) -> str:
    """A loud one-line warning when two evaluations ran under different budgets ('' if equal)."""
    if a.budget is None and b.budget is None:
        return "WARNING: neither evaluation recorded its budget; the comparison may not be like with like"
    diffs = (a.budget or EvalBudget()).differences(b.budget) if a.budget else ["the first evaluation recorded no budget"]
    return (
        ("WARNING: the evaluations ran under different budgets (" + "; ".join(diffs) + "): their difference is not the policy's alone")
        if diffs
        else ""
    )


class GroupReport(BaseModel):
    """Numbers for one slice (all, a family, a difficulty)."""

    episodes: int
    pass_at: dict[str, Estimate] = Field(default_factory=dict)
    #: with several samples per task: the sample the policy itself is most sure of (highest mean
    #: token log-prob) graded alone, and the most common submitted answer (answer tasks)
    best_of_n: Estimate | None = None
    majority_vote: Estimate | None = None
    #: episodes cut by each limit: turns, tokens (the agent's), watchdog (ours: infra_error)
    limits_hit: dict[str, int] = Field(default_factory=dict)
    outcome_rates: dict[str, float] = Field(default_factory=dict)
    safety_event_rate: float = 0.0
    safety_events: dict[str, int] = Field(default_factory=dict)
    mean_tool_calls: float = 0.0
    mean_turns: float = 0.0
    mean_reward: float = 0.0


class EvalReport(BaseModel):
    """A whole evaluation: what was run, and the numbers overall and per slice."""

    policy: str
    suite: str
    suite_version: str
    split: str
    seed: int
    samples_per_task: int
    ks: list[int]
    budget: EvalBudget | None = None
    overall: GroupReport
    by_family: dict[str, GroupReport]
    by_difficulty: dict[str, GroupReport]
    #: Further slices from task metadata, e.g. {"package": {"inflection": ...}} for mined suites.
    by_metadata: dict[str, dict[str, GroupReport]] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)


def _slice(trajs: list[Trajectory], ks: list[int], rng: np.random.Generator, notes: list[str]) -> GroupReport:
    by_task: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajs:
        by_task[t.task_id].append(t)
    outcomes = Counter(t.outcome.value for t in trajs)
    n_eps = max(1, len(trajs))
    report = GroupReport(
        episodes=len(trajs),
        outcome_rates={o.value: outcomes.get(o.value, 0) / n_eps for o in Outcome},
        mean_tool_calls=float(np.mean([t.tool_calls for t in trajs])) if trajs else 0.0,
        mean_turns=float(np.mean([len(t.turns) for t in trajs])) if trajs else 0.0,
        mean_reward=float(np.mean([t.reward for t in trajs])) if trajs else 0.0,
    )
    report.limits_hit = dict(Counter(t.limit_hit for t in trajs if t.limit_hit))
    if any(len(v) > 1 for v in by_task.values()):
        report.best_of_n = _bootstrap(np.array([_best_of_n(v) for v in by_task.values() if _graded(v)]), rng)
        votes = [_majority(v) for v in by_task.values() if _graded(v)]
        if any(v is not None for v in votes):
            report.majority_vote = _bootstrap(np.array([v for v in votes if v is not None], dtype=float), rng)
    events = Counter(e.get("kind", "unknown") for t in trajs for e in t.side_effects)
    report.safety_events = dict(events)
    report.safety_event_rate = sum(1 for t in trajs if t.side_effects) / n_eps
    for k in ks:
        per_task = []
        for task_trajs in by_task.values():
            graded = [t for t in task_trajs if t.outcome.is_agent_attempt]
            if len(graded) < k:
                continue
            c = sum(t.outcome == Outcome.PASSED for t in graded)
            per_task.append(pass_at_k(len(graded), c, k))
        if len(per_task) < len(by_task):
            notes.append(
                f"pass@{k}: {len(by_task) - len(per_task)} task(s) had fewer than {k} graded samples "
                "(infra/verifier errors) and were left out"
            )
        report.pass_at[str(k)] = _bootstrap(np.array(per_task, dtype=float), rng)
    return report


def _graded(trajs: list[Trajectory]) -> list[Trajectory]:
    return [t for t in trajs if t.outcome.is_agent_attempt]


def _best_of_n(trajs: list[Trajectory]) -> float:
    """1 if the sample with the highest mean log-prob of its own tokens passed (no oracle picks)."""

    def confidence(t: Trajectory) -> float:
        lp = t.logprobs
        return float(np.mean(lp)) if lp else float("-inf")

    best = max(_graded(trajs), key=confidence)
    return float(best.outcome == Outcome.PASSED)


def _majority(trajs: list[Trajectory]) -> float | None:
    """1 if the most common submitted answer (ties: the first seen) passed; None without answers."""
    answered = [t for t in _graded(trajs) if t.answer is not None]
    if not answered:
        return None
    counts = Counter(t.answer.strip() for t in answered)
    top = max(counts, key=lambda a: (counts[a], -[t.answer.strip() for t in answered].index(a)))
    return float(next(t for t in answered if t.answer.strip() == top).outcome == Outcome.PASSED)


def evaluate(
    trajs: list[Trajectory],
    ks: list[int],
    *,
    policy: str,
    suite: str,
    suite_version: str,
    split: str,
    seed: int,
    samples_per_task: int,
    task_groups: dict[str, dict[str, str]] | None = None,
    budget: EvalBudget | None = None,
) -> EvalReport:
    """Aggregate trajectories into an `EvalReport` (bootstrap seeded by `seed`). `task_groups`
    adds slices by task metadata: {name: {task id: value}} (e.g. the package of a mined task)."""
    rng = np.random.default_rng(seed)
    notes: list[str] = []
    fams: dict[str, list[Trajectory]] = defaultdict(list)
    diffs: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajs:
        fams[t.family].append(t)
        diffs[str(t.difficulty)].append(t)
    return EvalReport(
        policy=policy,
        suite=suite,
        suite_version=suite_version,
        split=split,
        seed=seed,
        samples_per_task=samples_per_task,
        ks=ks,
        budget=budget,
        overall=_slice(trajs, ks, rng, notes),
        by_family={f: _slice(v, ks, rng, []) for f, v in sorted(fams.items())},
        by_difficulty={d: _slice(v, ks, rng, []) for d, v in sorted(diffs.items())},
        by_metadata={
            name: {
                value: _slice([t for t in trajs if groups.get(t.task_id) == value], ks, rng, []) for value in sorted(set(groups.values()))
            }
            for name, groups in (task_groups or {}).items()
        },
        notes=sorted(set(notes)),
    )


def _fmt(e: Estimate) -> str:
    return "n/a" if e.tasks == 0 else f"{e.value:.3f} [{e.low:.3f}, {e.high:.3f}]"


def render_markdown(report: EvalReport) -> str:
    """A report a person can read."""
    ks = [str(k) for k in report.ks]
    lines = [
        f"# Evaluation: {report.policy}",
        "",
        f"- suite: `{report.suite}` v{report.suite_version}, split `{report.split}`",
        f"- samples per task: {report.samples_per_task}; seed: {report.seed}",
        f"- budget: {_budget_line(report.budget)}",
        f"- episodes: {report.overall.episodes}; 95% bootstrap CIs over tasks; limits hit: "
        + (", ".join(f"{k} {v}" for k, v in sorted(report.overall.limits_hit.items())) or "none"),
        "",
    ]
    o = report.overall
    if o.best_of_n is not None:
        lines += [f"- best-of-{report.samples_per_task} (the policy's most confident sample): {_fmt(o.best_of_n)}"]
    if o.majority_vote is not None:
        lines += [f"- majority vote over {report.samples_per_task} answers: {_fmt(o.majority_vote)}"]
    if o.best_of_n is not None or o.majority_vote is not None:
        lines.append("")
    header = (
        "| slice | episodes | "
        + " | ".join(f"pass@{k}" for k in ks)
        + " | format err | truncated | timeout | infra err | safety events/ep | tool calls/ep | turns/ep |"
    )
    lines += [header, "|" + "---|" * (len(ks) + 9)]

    def row(name: str, g: GroupReport) -> str:
        r = g.outcome_rates
        return (
            f"| {name} | {g.episodes} | "
            + " | ".join(_fmt(g.pass_at[k]) for k in ks)
            + f" | {r.get('format_error', 0):.2f} | {r.get('truncated', 0):.2f} | {r.get('timeout', 0):.2f}"
            + f" | {r.get('infra_error', 0):.2f}"
            + f" | {g.safety_event_rate:.2f} | {g.mean_tool_calls:.1f} | {g.mean_turns:.1f} |"
        )

    lines.append(row("**all**", report.overall))
    for fam, g in report.by_family.items():
        lines.append(row(f"family `{fam}`", g))
    for d, g in report.by_difficulty.items():
        lines.append(row(f"difficulty {d}", g))
    for name, groups in report.by_metadata.items():
        for value, g in groups.items():
            lines.append(row(f"{name} `{value}`", g))
    lines += ["", "## Outcomes", "", "| outcome | rate |", "|---|---|"]
    lines += [f"| {o} | {v:.3f} |" for o, v in report.overall.outcome_rates.items()]
    if report.overall.safety_events:
        lines += ["", "## Safety events", "", "| event | count |", "|---|---|"]
        lines += [f"| {k} | {v} |" for k, v in sorted(report.overall.safety_events.items())]
    if report.notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in report.notes]
    lines += ["", "![pass@k by family](passk.png)", "", "![outcomes](outcomes.png)", ""]
    return "\n".join(lines)


def _budget_line(budget: EvalBudget | None) -> str:
    if budget is None:
        return "not recorded"
    return (
        f"temperature {budget.temperature}, top-p {budget.top_p}, {budget.samples} sample(s), turns "
        f"{budget.max_turns or 'env default'}, {budget.max_new_tokens_per_turn} tokens/turn, "
        f"{budget.max_total_tokens} tokens/episode, watchdog {budget.watchdog_s} s"
    )


def plot_report(report: EvalReport, out_dir: Path) -> list[Path]:
    """PNG plots: pass@k per family with CIs, and the outcome mix."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    fams = list(report.by_family)
    fig, ax = plt.subplots(figsize=(max(5, 1.6 * len(fams) + 2), 3.5))
    width = 0.8 / max(1, len(report.ks))
    for j, k in enumerate(report.ks):
        vals = [report.by_family[f].pass_at[str(k)] for f in fams]
        xs = np.arange(len(fams)) + j * width
        ys = [0 if v.tasks == 0 else v.value for v in vals]
        err = [
            [0 if v.tasks == 0 else max(0, v.value - v.low) for v in vals],
            [0 if v.tasks == 0 else max(0, v.high - v.value) for v in vals],
        ]
        ax.bar(xs, ys, width, yerr=err, capsize=3, label=f"pass@{k}")
    ax.set_xticks(np.arange(len(fams)) + width * (len(report.ks) - 1) / 2, fams, rotation=15)
    ax.set_ylim(0, 1.05)
    ax.set_title(f"{report.policy} on {report.suite}/{report.split}")
    ax.legend()
    fig.tight_layout()
    paths.append(out_dir / "passk.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 3))
    rates = report.overall.outcome_rates
    ax.barh(list(rates), list(rates.values()), color="tab:gray")
    ax.set_xlim(0, 1)
    ax.set_title("outcome rates")
    fig.tight_layout()
    paths.append(out_dir / "outcomes.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


def write_report(report: EvalReport, out_dir: str | Path) -> dict[str, Path]:
    """Write `report.json`, `report.md` and the PNG plots into `out_dir`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report.model_dump(mode="json"), indent=2))
    (out / "report.md").write_text(render_markdown(report))
    plots = plot_report(report, out)
    return {"json": out / "report.json", "markdown": out / "report.md", **{p.stem: p for p in plots}}


def report_dict(report: EvalReport) -> dict[str, Any]:
    """The report as plain JSON-able data."""
    return report.model_dump(mode="json")
