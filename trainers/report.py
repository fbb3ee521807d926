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
    ("optimisation", ["loss", "grad_norm"]),
    ("lengths", ["response_tokens_mean", "episode_tokens_mean", "truncation_rate"]),
    ("tools", ["tool_calls_mean", "tool_errors_mean", "turns_mean"]),
    ("throughput", ["rollout_tokens_per_s", "train_tokens_per_s"]),
    ("time", ["time_rollout_s", "time_verify_s", "time_train_s"]),
]


class ReportError(ValueError):
    """The directory is not a training run."""


def _evals(run_dir: Path) -> dict[str, dict[str, dict[str, Any]]]:
    """{label: {suite: report.json}} in the order the campaign wrote them."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    root = run_dir / "eval"
    if root.is_dir():
        for label_dir in sorted(root.iterdir(), key=lambda p: p.stat().st_mtime):
            for suite_dir in sorted(label_dir.iterdir()):
                path = suite_dir / "report.json"
                if path.exists():
                    out.setdefault(label_dir.name, {})[suite_dir.name] = json.loads(path.read_text())
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


def write_report(run_dir: str | Path) -> dict[str, Any]:
    """Write `report.md` and `plots/` for a run; returns the headline numbers."""
    run_dir = Path(run_dir)
    records = read_metrics(run_dir)
    if not records:
        raise ReportError(f"{run_dir}: no metrics.jsonl records; is this a `toolgym train` run directory?")
    plots = plot_curves(records, run_dir / "plots")
    evals = _evals(run_dir)
    labels = list(evals)
    before = next((lbl for lbl in labels if lbl in ("sft", "initial")), labels[0] if labels else None)
    after = "final" if "final" in evals else (labels[-1] if labels else None)
    train = [r for r in records if r.get("kind") == "train"]
    lines = [f"# Training run `{run_dir.name}`", ""]
    headline: dict[str, Any] = {"steps": max((r["step"] for r in train), default=0), "suites": {}}
    if before and after:
        lines += [f"## Held-out: `{before}` checkpoint vs `{after}`", "",
                  "pass@1 with 95% bootstrap CIs over tasks; same sampling settings for both.", "",
                  "| suite | slice | before | after | change |", "|---|---|---|---|---|"]
        for suite in sorted(set(evals[before]) | set(evals.get(after, {}))):
            b, a = evals[before].get(suite), evals.get(after, {}).get(suite)
            slices = [("all", (b or {}).get("overall"), (a or {}).get("overall"))]
            for fam in sorted(set((b or {}).get("by_family", {})) | set((a or {}).get("by_family", {}))):
                slices.append((fam, (b or {}).get("by_family", {}).get(fam), (a or {}).get("by_family", {}).get(fam)))
            for name, gb, ga in slices:
                eb = (gb or {}).get("pass_at", {}).get("1")
                ea = (ga or {}).get("pass_at", {}).get("1")
                delta = (ea["value"] - eb["value"]) if eb and ea and eb.get("tasks") and ea.get("tasks") else None
                lines.append(f"| {suite} | {name} | {_fmt(eb)} | {_fmt(ea)} | "
                             f"{'n/a' if delta is None else f'{delta * 100:+.1f} points'} |")
                if name == "all":
                    headline["suites"][suite] = {"before": eb and eb["value"], "after": ea and ea["value"],
                                                 "gain_points": None if delta is None else delta * 100}
        lines.append("")
    if train:
        last = train[-1]
        lines += ["## Training", "", f"{len(train)} RL steps. Last step: reward {last.get('reward_mean', 0):.3f}, "
                  f"pass rate {last.get('pass_rate', 0):.3f}, entropy {last.get('entropy', float('nan')):.3f}, "
                  f"train/inference logprob gap mean {last.get('logprob_gap_mean', float('nan')):.2e}.", ""]
        total = {k: sum(r.get(k, 0.0) for r in train) for k in ("time_rollout_s", "time_verify_s", "time_train_s")}
        lines += [f"Time: rollout {total['time_rollout_s']:.0f} s (verification inside it: "
                  f"{total['time_verify_s']:.0f} s of verifier time), training {total['time_train_s']:.0f} s.", ""]
        samplers = {k: v for k, v in last.items() if k.startswith("sampler/")}
        if samplers:
            lines += ["## Sampler (after the last step)", "", "| suite | active | solved (retired) | unsolvable (retired) "
                      "| never tried | mean E[p(1-p)] |", "|---|---|---|---|---|---|"]
            for key, s in samplers.items():
                lines.append(f"| {key.split('/', 1)[1]} | {s['active']} | {s['retired_solved']} | {s['retired_unsolvable']} "
                             f"| {s['unseen']} | {s['mean_learnability']:.3f} |")
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
    lines += ["## Curves", ""] + [f"![{p.stem}](plots/{p.name})" for p in plots] + [""]
    (run_dir / "report.md").write_text("\n".join(lines))
    headline["report"] = str(run_dir / "report.md")
    headline["plots"] = [str(p) for p in plots]
    return headline


__all__ = ["ReportError", "plot_curves", "write_report"]
