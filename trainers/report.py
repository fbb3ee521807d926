"""`toolgym report RUN_DIR`: PNG curves and a markdown summary of a training run.

Reads what the campaign wrote (`metrics.jsonl`, `eval/<label>/<suite>/report.json`,
`config.yaml`) and writes `report.md` and `plots/*.png`: training curves, the before/after
held-out table per family with confidence intervals, sampler statistics and a safety table.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from toolgym.trainers.checkpoint import read_metrics

CURVES = [
    ("reward", ["reward_mean", "pass_rate"]),
    ("groups", ["groups_zero_variance_frac", "groups_all_pass_frac", "groups_all_fail_frac"]),
    ("policy", ["entropy", "kl", "clip_frac_low", "clip_frac_high"]),
    ("ratios", ["ratio_mean", "ratio_min", "ratio_max"]),
    ("mismatch", ["logprob_gap_mean", "logprob_gap_max"]),
    ("optimisation", ["loss", "grad_norm", "anchor_nll"]),
    ("lengths", ["response_tokens_mean", "episode_tokens_mean", "truncation_rate"]),
    ("tools", ["tool_calls_mean", "tool_errors_mean", "turns_mean"]),
    ("throughput", ["rollout_tokens_per_s", "train_tokens_per_s"]),
    ("time", ["time_rollout_s", "time_verify_s", "time_train_s"]),
]


class ReportError(ValueError):
    """The directory is not a training run."""


def read_evaluations(run_dir: Path) -> dict[str, dict[str, dict[str, Any]]]:
    """{label: {suite: report.json}} in the order the campaign wrote them (a report still being
    written is skipped)."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    root = run_dir / "eval"
    if root.is_dir():
        for label_dir in sorted((p for p in root.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime):
            for suite_dir in sorted(p for p in label_dir.iterdir() if p.is_dir()):
                try:
                    out.setdefault(label_dir.name, {})[suite_dir.name] = json.loads((suite_dir / "report.json").read_text())
                except (OSError, ValueError):
                    continue
    return out


def _fmt(est: dict[str, Any] | None) -> str:
    if not est or est.get("tasks", 0) == 0:
        return "n/a"
    return f"{est['value']:.3f} [{est['low']:.3f}, {est['high']:.3f}]"


def plot_curves(records: list[dict[str, Any]], out: Path) -> list[Path]:
    """One PNG per group of training curves, plus held-out pass@1 over steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    train = [r for r in records if r.get("kind") == "train"]
    paths = []
    for name, keys in CURVES:
        present = [k for k in keys if any(isinstance(r.get(k), (int, float)) for r in train)]
        if not present:
            continue
        fig, ax = plt.subplots(figsize=(6, 3.2))
        for k in present:
            pts = [(r["step"], r[k]) for r in train if isinstance(r.get(k), (int, float))]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", label=k)
        ax.set_xlabel("step")
        ax.set_title(name)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / f"{name}.png", dpi=100)
        plt.close(fig)
        paths.append(out / f"{name}.png")
    sft = [r for r in records if r.get("kind") == "sft"]
    if sft:
        fig, ax = plt.subplots(figsize=(6, 3.2))
        ax.plot([r["step"] for r in sft], [r["sft_loss"] for r in sft], label="sft_loss")
        ax.plot([r["step"] for r in sft], [r["sft_token_accuracy"] for r in sft], label="sft_token_accuracy")
        ax.set_xlabel("SFT step")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "sft.png", dpi=100)
        plt.close(fig)
        paths.append(out / "sft.png")
    evals = [r for r in records if r.get("kind") == "eval"]
    if evals:
        fig, ax = plt.subplots(figsize=(6, 3.2))
        suites = sorted({k for r in evals for k, v in r.items() if isinstance(v, dict) and "pass@1" in v})
        for s in suites:
            pts = [(r["step"], r[s]["pass@1"]) for r in evals if isinstance(r.get(s), dict)]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{s} held-out pass@1")
        ax.set_xlabel("step")
        ax.set_ylim(0, 1)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "heldout.png", dpi=100)
        plt.close(fig)
        paths.append(out / "heldout.png")
    return paths


def _eval_trajectories(run_dir: Path, label: str, suite: str) -> list:
    from toolgym.harness.trajectory import read_jsonl

    path = run_dir / "eval" / label / suite / "trajectories.jsonl"
    return read_jsonl(path) if path.exists() else []


def _pass1(report: dict[str, Any] | None, family: str | None = None) -> dict[str, Any] | None:
    if not report:
        return None
    group = report.get("overall") if family is None else report.get("by_family", {}).get(family)
    return (group or {}).get("pass_at", {}).get("1")


def _points(est: Any) -> str:
    if est is None or est.tasks == 0:
        return "n/a"
    return f"{est.value * 100:+.1f} [{est.low * 100:+.1f}, {est.high * 100:+.1f}]"


def _run_config(run_dir: Path) -> dict[str, Any]:
    """The run's config.yaml as a dict ({} when it is missing or unreadable)."""
    import yaml

    try:
        return yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        return {}


def evaluation_only_suites(run_dir: Path) -> set[str]:
    """The suites the run evaluated but never trained on (`eval.suites` in its config.yaml)."""
    config = _run_config(run_dir)
    return {entry.get("suite") for entry in (config.get("eval") or {}).get("suites") or [] if isinstance(entry, dict)}


def sandboxed_suites(run_dir: Path) -> set[str]:
    """The suites of the run (its config.yaml's `envs` and `eval.suites`) whose environment runs in a
    sandbox: the report shows their side-effect rates by stage."""
    from toolgym.envs.registry import env_info

    config = _run_config(run_dir)
    entries = [*(config.get("envs") or []), *((config.get("eval") or {}).get("suites") or [])]
    out = set()
    for entry in entries:
        if isinstance(entry, dict) and entry.get("env") and entry.get("suite"):
            info = env_info(str(entry["env"]))
            if info is not None and info.sandboxed:
                out.add(entry["suite"])
    return out


def heldout_section(
    run_dir: Path, evals: dict[str, dict[str, dict[str, Any]]], before: str, after: str, headline: dict[str, Any]
) -> list[str]:
    """The held-out table: base, `before` (SFT) and `after` (final) pass@1 per suite and family, with
    the paired difference after - before (same tasks, same samples) and its bootstrap CI."""
    from toolgym.harness.evaluate import paired_difference

    base = "base" if "base" in evals and before != "base" else None
    cols = ([base] if base else []) + [before, after]
    lines = [
        f"## Held-out pass@1: {' -> '.join(f'`{c}`' for c in cols)}",
        "",
        "95% bootstrap CIs over tasks; the same sampling settings at every evaluation. The change "
        f"`{after}` - `{before}`" + (f" (and `{after}` - `base`)" if base else "") + " is paired (the same tasks and "
        "sampling seeds in both), in points.",
        "",
        "| suite | slice | episodes | "
        + " | ".join(cols)
        + f" | {after} - {before} (paired) |"
        + (f" {after} - {base} (paired) |" if base else ""),
        "|---|---|---|" + "---|" * (len(cols) + 1 + bool(base)),
    ]
    warnings = []
    evaluated_only = evaluation_only_suites(run_dir)
    sandboxed = sandboxed_suites(run_dir)
    for suite in sorted(set(evals[before]) | set(evals.get(after, {}))):
        reports = [evals.get(c, {}).get(suite) for c in cols]
        budgets = {json.dumps((r or {}).get("budget"), sort_keys=True) for r in reports if r}
        if len(budgets) > 1:
            warnings.append(
                f"**WARNING: `{suite}`'s evaluations ran under different budgets** ("
                + "; ".join(f"`{c}`: {(r or {}).get('budget')}" for c, r in zip(cols, reports))
                + "): their differences are not the policy's alone."
            )
        trajs = {c: _eval_trajectories(run_dir, c, suite) for c in ([base] if base else []) + [before, after]}
        fams = sorted(
            set(evals[before].get(suite, {}).get("by_family", {})) | set(evals.get(after, {}).get(suite, {}).get("by_family", {}))
        )
        for fam in [None, *fams]:
            pick = {c: [t for t in trajs[c] if fam is None or t.family == fam] for c in trajs}
            diff = paired_difference(pick[before], pick[after], seed=0) if pick[before] and pick[after] else None
            # the base evaluation may cover only the first tasks: paired on the tasks both graded
            base_diff = paired_difference(pick[base], pick[after], seed=0) if base and pick[base] and pick[after] else None
            ests = [_pass1(evals.get(c, {}).get(suite), fam) for c in cols]
            episodes = len(pick[after]) or (evals.get(after, {}).get(suite, {}).get("overall") or {}).get("episodes", 0)
            lines.append(
                f"| {suite} | {fam or 'all'} | {episodes} | "
                + " | ".join(_fmt(e) for e in ests)
                + f" | {_points(diff)} |"
                + (f" {_points(base_diff)} |" if base else "")
            )
            if fam is None:
                values = {c: (e or {}).get("value") for c, e in zip(cols, ests)}
                after_est = ests[-1] or {}
                headline["suites"][suite] = {
                    "base": values.get(base) if base else None,
                    "before": values[before],
                    "after": values[after],
                    "after_ci": [after_est.get("low"), after_est.get("high")],
                    "evaluated_only": suite in evaluated_only,
                    "gain_points": None if diff is None or diff.tasks == 0 else diff.value * 100,
                    "gain_ci_points": None if diff is None or diff.tasks == 0 else [diff.low * 100, diff.high * 100],
                    "episodes": episodes,
                    "labels": cols,
                    "base_gain_points": None if base_diff is None or base_diff.tasks == 0 else base_diff.value * 100,
                    "base_gain_ci_points": None
                    if base_diff is None or base_diff.tasks == 0
                    else [base_diff.low * 100, base_diff.high * 100],
                    "base_episodes": 0 if base_diff is None else base_diff.tasks,
                    "sandboxed": suite in sandboxed,
                    # per stage: the share of held-out episodes with a side effect, their kinds, turns
                    "stages": {
                        c: {
                            "side_effect_rate": (evals[c][suite].get("overall") or {}).get("safety_event_rate", 0.0),
                            "side_effects": (evals[c][suite].get("overall") or {}).get("safety_events", {}),
                            "turns_mean": (evals[c][suite].get("overall") or {}).get("mean_turns", 0.0),
                        }
                        for c in cols
                        if evals.get(c, {}).get(suite)
                    },
                }
    return lines + [""] + [w + "\n" for w in warnings]


def handoff_section(train: list[dict[str, Any]], evals: dict[str, dict[str, dict[str, Any]]], before: str) -> list[str]:
    """Did SFT leave headroom for RL? Well-formed rollouts (few format errors) and rewards with
    variance (groups that are neither all-pass nor all-fail) at the first RL steps."""
    lines = ["## From SFT to RL", ""]
    for suite, report in sorted(evals.get(before, {}).items()):
        rates = (report.get("overall") or {}).get("outcome_rates", {})
        lines.append(
            f"- `{suite}` after `{before}`: held-out pass@1 {_fmt(_pass1(report))}, format errors "
            f"{rates.get('format_error', 0):.1%}, truncated {rates.get('truncated', 0):.1%}, "
            f"timeouts {rates.get('timeout', 0):.1%}, infra errors {rates.get('infra_error', 0):.1%}."
        )
    first = train[: max(1, min(3, len(train)))]
    if first:
        signal = [1 - r.get("groups_zero_variance_frac", 1.0) for r in first if "groups_zero_variance_frac" in r]
        passes = [r.get("pass_rate", 0.0) for r in first]
        lines.append(
            f"- First {len(first)} RL step(s): train pass rate {', '.join(f'{p:.2f}' for p in passes)}; "
            f"groups with reward variance (a gradient) {', '.join(f'{x:.0%}' for x in signal) or 'n/a'}. "
            "Headroom for RL means a pass rate well below 1 and groups with variance."
        )
    return lines + [""]


def curve_table(train: list[dict[str, Any]]) -> list[str]:
    """The train reward curve as a table: one row per RL step."""
    lines = [
        "## Train reward per RL step",
        "",
        "Mismatch: mean |logp_train - logp_rollout| over policy tokens and a k3 estimate of "
        "KL(rollout || train); TIS truncated: the share of tokens whose importance weight hit the cap "
        "(0 when the sampler is the trained model). Truncated: episodes cut by their turn or token limit. "
        "Screened: candidate tasks whose reference solution was scored before the draw (`sampler.screen`) "
        "and the seconds it took.",
        "",
        "| step | reward mean | pass rate | groups with variance | trained groups | extra draws | screened "
        "| truncated | mismatch \\|dlogp\\| | mismatch KL | TIS truncated | rollout s | train s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in train:
        signal = 1 - r["groups_zero_variance_frac"] if "groups_zero_variance_frac" in r else float("nan")
        screened = f"{r['screen_scored']} ({r.get('screen_seconds', 0):.0f} s)" if "screen_scored" in r else "-"
        lines.append(
            f"| {r['step']} | {r.get('reward_mean', 0):.3f} | {r.get('pass_rate', 0):.3f} | {signal:.0%} | "
            f"{r.get('trained_groups', 'n/a')} | {r.get('dynamic_extra_draws', 0)} | {screened} | "
            f"{r.get('truncation_rate', 0):.0%} | {r.get('logprob_gap_mean', float('nan')):.2e} | "
            f"{r.get('mismatch_kl', float('nan')):.2e} | {r.get('tis_truncated_frac', 0):.2%} | "
            f"{r.get('time_rollout_s', 0):.0f} | {r.get('time_train_s', 0):.0f} |"
        )
    return lines + [""]


def suite_table(train: list[dict[str, Any]]) -> list[str]:
    """Per RL step and suite: pass rate, turns, episodes with a side effect, the trained share of
    the tokens, and per family the groups played and those with a gradient (`by_suite`)."""
    rows = [(r["step"], suite, m) for r in train for suite, m in (r.get("by_suite") or {}).items()]
    if not rows:
        return []
    lines = [
        "## Per step and suite",
        "",
        "Groups: per family, groups with a gradient / groups played (a group has a gradient when its "
        "episodes' trained rewards differ and none hit an infra or verifier error). Trained tokens: "
        "the share of the episodes' tokens the loss sees (the policy's own; template and tool output masked).",
        "",
        "| step | suite | pass rate | turns | side-effect episodes | trained tokens | groups with a gradient, per family |",
        "|---|---|---|---|---|---|---|",
    ]
    for step, suite, m in rows:
        families = ", ".join(f"{f} {c['with_gradient']}/{c['groups']}" for f, c in m["groups_by_family"].items())
        lines.append(
            f"| {step} | {suite} | {m['pass_rate']:.3f} | {m['turns_mean']:.1f} | {m['side_effect_episodes']:.1%} | "
            f"{m['trained_token_share']:.1%} | {families} |"
        )
    return lines + [""]


def audit_indices(rewards: list[float], per_kind: int = 2, seed: int = 0) -> tuple[list[int], list[int]]:
    """(the `per_kind` highest-reward indices, `per_kind` more drawn at random from the rest):
    one step's audit sample, the same in audit.md and in `toolgym view`."""
    import numpy as np

    order = sorted(range(len(rewards)), key=lambda i: -rewards[i])
    top = order[:per_kind]
    rest = [i for i in range(len(rewards)) if i not in top]
    drawn = sorted(np.random.default_rng(seed).choice(rest, size=min(per_kind, len(rest)), replace=False).tolist()) if rest else []
    return top, drawn


def write_audit(run_dir: Path, per_kind: int = 2, seed: int = 0) -> Path | None:
    """`audit.md`: per RL step, the top-reward rollouts and as many random ones, each as a person
    reads it (instruction, calls, observations, verdict): the manual audit the evaluation
    practice asks for every step. None when the run saved no rollouts."""
    from toolgym.harness.trajectory import read_jsonl

    files = sorted((run_dir / "rollouts").glob("step-*.jsonl"))
    if not files:
        return None
    lines = [
        "# Audit sample",
        "",
        f"Per RL step: the {per_kind} highest-reward rollouts and {per_kind} drawn at "
        "random (seeded) from the rest. Read them: a high reward for the wrong reason is a reward hack.",
        "",
    ]
    for path in files:
        trajs = read_jsonl(path)
        top, drawn = audit_indices([t.reward for t in trajs], per_kind, seed)
        lines += [f"## {path.stem}", ""]
        for label, picks in (("top reward", top), ("random", drawn)):
            for i in picks:
                lines += _audit_entry(trajs[i], f"{label} #{i}")
    out = run_dir / "audit.md"
    out.write_text("\n".join(lines))
    return out


def _audit_entry(traj: Any, label: str) -> list[str]:
    """One rollout as a readable block."""

    def clip(text: Any, n: int = 600) -> str:
        text = str(text)
        return text if len(text) <= n else text[:n] + f" ... ({len(text) - n} more characters)"

    out = [
        f"### {label}: task `{traj.task_id[:12]}` ({traj.family}), reward {traj.reward:.2f}, outcome "
        f"`{traj.outcome.value}`" + (f", limit hit: {traj.limit_hit}" if traj.limit_hit else ""),
        "",
    ]
    for m in traj.messages:
        role = m.get("role", "?")
        if role == "system":
            continue
        out += [
            f"- **{role}**" + (f" ({m['name']})" if m.get("name") else "") + ":",
            "",
            "  ```",
            *["  " + line for line in clip(m.get("content", "")).splitlines()],
            "  ```",
        ]
    if traj.verdict is not None:
        out.append(f"- **verdict**: {traj.verdict.reason or traj.verdict.outcome.value}")
    if traj.side_effects:
        out.append("- **side effects**: " + ", ".join(sorted({e.get("kind", "?") for e in traj.side_effects})))
    return out + [""]


def headline_lines(headline: dict[str, Any]) -> list[str]:
    """One line per suite: `SUITE held-out pass@1: base x -> SFT y -> final z (...)`."""
    names = {"base": "base", "sft": "SFT", "initial": "initial", "final": "final"}
    out = []
    for suite, n in headline.get("suites", {}).items():
        if n.get("after") is None:
            continue
        untrained = "; evaluated only, never trained on" if n.get("evaluated_only") else ""
        if n.get("before") is None:  # an evaluation-only suite evaluated at the end alone
            lo, hi = n["after_ci"]  # set wherever "after" is
            label = names.get(n["labels"][-1], n["labels"][-1])
            out.append(f"{suite} held-out pass@1: {label} {n['after']:.3f} [{lo:.3f}, {hi:.3f}] ({n['episodes']} episodes{untrained})")
            continue
        chain = " -> ".join(
            f"{names.get(lbl, lbl)} {v:.3f}"
            for lbl, v in zip(n["labels"], [n.get("base"), n["before"], n["after"]][-len(n["labels"]) :])
            if v is not None
        )
        detail = ""
        if n.get("gain_points") is not None:
            lo, hi = n["gain_ci_points"]
            detail = (
                f" ({names.get(n['labels'][-1], n['labels'][-1])} - {names.get(n['labels'][-2], n['labels'][-2])} "
                f"{n['gain_points']:+.1f} points, 95% CI [{lo:+.1f}, {hi:+.1f}], paired; {n['episodes']} episodes"
            )
            if n.get("base_gain_points") is not None:
                blo, bhi = n["base_gain_ci_points"]
                detail += (
                    f"; {names.get(n['labels'][-1], n['labels'][-1])} - base {n['base_gain_points']:+.1f} points, "
                    f"95% CI [{blo:+.1f}, {bhi:+.1f}], paired on {n['base_episodes']} episodes"
                )
            detail += untrained + ")"
        out.append(f"{suite} held-out pass@1: {chain}{detail}")
        if n.get("sandboxed") and n.get("stages"):
            out.append(side_effect_line(suite, n["stages"], names))
    return out


def side_effect_line(suite: str, stages: dict[str, dict[str, Any]], names: dict[str, str]) -> str:
    """`SUITE held-out side effects: base 0.0% -> SFT 1.7% -> final 0.0% of episodes (...)`: a
    sandboxed suite's side-effect rate by stage, the kinds seen, and the turns per episode."""
    rates = " -> ".join(f"{names.get(lbl, lbl)} {s['side_effect_rate']:.1%}" for lbl, s in stages.items())
    kinds = "; ".join(
        f"{names.get(lbl, lbl)} " + (", ".join(f"{k} {v}" for k, v in sorted(s["side_effects"].items())) or "none")
        for lbl, s in stages.items()
    )
    turns = " -> ".join(f"{s['turns_mean']:.1f}" for s in stages.values())
    return f"{suite} held-out side effects: {rates} of episodes (events: {kinds}); turns per episode {turns}"


def write_report(run_dir: str | Path) -> dict[str, Any]:
    """Write `report.md` and `plots/` for a run; returns the headline numbers (and `lines`, the
    headline as one line per suite)."""
    run_dir = Path(run_dir)
    records = read_metrics(run_dir)
    if not records:
        raise ReportError(f"{run_dir}: no metrics.jsonl records; is this a `toolgym train` run directory?")
    plots = plot_curves(records, run_dir / "plots")
    evals = read_evaluations(run_dir)
    labels = list(evals)
    before = next((lbl for lbl in labels if lbl in ("sft", "initial")), labels[0] if labels else None)
    after = "final" if "final" in evals else (labels[-1] if labels else None)
    train = [r for r in records if r.get("kind") == "train"]
    lines = [f"# Training run `{run_dir.name}`", ""]
    headline: dict[str, Any] = {"steps": max((r["step"] for r in train), default=0), "suites": {}}
    if before and after:
        lines += heldout_section(run_dir, evals, before, after, headline)
        headline["lines"] = headline_lines(headline)
        lines[2:2] = [f"**{line}**" for line in headline["lines"]] + [""]
        lines += handoff_section(train, evals, before)
    if train:
        last = train[-1]
        lines += [
            "## Training",
            "",
            f"{len(train)} RL steps. Last step: reward {last.get('reward_mean', 0):.3f}, "
            f"pass rate {last.get('pass_rate', 0):.3f}, entropy {last.get('entropy', float('nan')):.3f}, "
            f"train/inference logprob gap mean {last.get('logprob_gap_mean', float('nan')):.2e}, mismatch KL "
            f"{last.get('mismatch_kl', float('nan')):.2e}, TIS cap {last.get('tis_cap') or 'off'} (tokens "
            f"truncated {last.get('tis_truncated_frac', 0):.2%}).",
            "",
        ]
        total = {k: sum(r.get(k, 0.0) for r in train) for k in ("time_rollout_s", "time_verify_s", "time_train_s")}
        lines += [
            f"Time: rollout {total['time_rollout_s']:.0f} s (verification inside it: "
            f"{total['time_verify_s']:.0f} s of verifier time), training {total['time_train_s']:.0f} s.",
            "",
        ]
        peak = max((r["peak_rss_gb"] for r in records if isinstance(r.get("peak_rss_gb"), (int, float))), default=None)
        if peak is not None:  # runs logged before toolgym recorded memory have none
            lines += [
                f"Memory: the process's peak resident memory {peak:.1f} GB (the train and eval rows of "
                f"`metrics.jsonl` record it as `rss_gb` / `peak_rss_gb`).",
                "",
            ]
        lines += curve_table(train) + suite_table(train)
        samplers = {k: v for k, v in last.items() if k.startswith("sampler/")}
        if samplers:
            lines += [
                "## Sampler (after the last step)",
                "",
                "| suite | active | solved (retired) | unsolvable (retired) | never tried | mean E[p(1-p)] |",
                "|---|---|---|---|---|---|",
            ]
            for key, s in samplers.items():
                lines.append(
                    f"| {key.split('/', 1)[1]} | {s['active']} | {s['retired_solved']} | {s['retired_unsolvable']} "
                    f"| {s['unseen']} | {s['mean_learnability']:.3f} |"
                )
            lines.append("")
        kinds = sorted({k for r in train for k in (r.get("side_effect_rate") or {})})
        lines += ["## Safety: side effects per episode during training", ""]
        if kinds:
            lines += ["| kind | mean rate | last step |", "|---|---|---|"]
            for k in kinds:
                rates = [(r.get("side_effect_rate") or {}).get(k, 0.0) for r in train]
                lines.append(f"| {k} | {sum(rates) / len(rates):.3f} | {rates[-1]:.3f} |")
        else:
            lines.append("No side effect was recorded.")
        lines.append("")
    audit = write_audit(run_dir)
    if audit is not None:
        lines += ["## Audit", "", f"Per step, the top-reward rollouts and as many random ones: [audit.md]({audit.name}).", ""]
    lines += ["## Curves", ""] + [f"![{p.stem}](plots/{p.name})" for p in plots] + [""]
    (run_dir / "report.md").write_text("\n".join(lines))
    headline["report"] = str(run_dir / "report.md")
    headline["plots"] = [str(p) for p in plots]
    return headline


__all__ = [
    "ReportError",
    "write_audit",
    "curve_table",
    "evaluation_only_suites",
    "handoff_section",
    "headline_lines",
    "heldout_section",
    "plot_curves",
    "sandboxed_suites",
    "side_effect_line",
    "write_report",
]
