"""How much of a campaign's RL gain is the seed's luck? GRPO from one SFT checkpoint, several seeds.

    python bench/rl_seeds.py runs/demo [--seeds 0 1 2] [--out runs/rl-seeds]
    python bench/rl_seeds.py runs/demo --samplers learnability uniform [--out runs/sampler-arms]
    python bench/rl_seeds.py runs/demo --advantages grpo none --seeds 0 [--out runs/reward-ablation]
    python bench/rl_seeds.py runs/demo --arms rl.learner.lr=2e-5 rl.learner.lr=1e-4 rollout.temperature=0.6 --seeds 0

For each seed, `toolgym train RUN/config.yaml` (the run's own recipe) starts from `RUN/sft-model`
(the very weights the run's SFT numbers came from) with the SFT stage and the base evaluation off
and `seed` set: it evaluates that model (`initial`; greedy, so it must reproduce the run's own SFT
score), runs the recipe's GRPO steps and evaluates again (`final`) on the same held-out tasks.
Only the RL stage differs between seeds: which tasks are drawn and which rollouts are sampled.
Prints each seed's paired final - initial difference with its 95% CI and per-category accuracies,
then the spread over seeds; each seed's run is a normal run directory under `--out`, and the
numbers go to `runs/bench/rl_seeds.json`. A seed whose run directory already holds a final
evaluation is read, not rerun (an interrupted bench resumes where it stopped).

`--samplers A B` runs every seed once per task sampler (`sampler.kind`, all else equal: the
learnability sampler's bench on the run's own pool) and compares them: the share of rollouts
that fell in zero-variance groups (no gradient), its ratio, and the final held-out accuracy of
A minus B, paired by seed and task, with a 95% CI.

`--advantages grpo none` is the reward ablation (`rl.advantage`, all else equal): `none` sets every
advantage to 0, so its RL stage trains on the SFT anchor's demonstrations alone, with the same
steps, sampler, rollouts per step and anchor draws. The recipe's final minus the ablation's final, paired by seed and
task, is what the reward taught beyond replaying the demonstrations.

`--arms A B ...` compares any config changes the same way: each arm is a set of `field=value`
overrides (several joined by `;`), the first arm is the reference and every other arm is compared
with it (a learning-rate sweep, a sampling temperature).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_results  # noqa: E402

#: the fields an arm may vary: command-line option -> config field
ARM_FIELDS = {"samplers": "sampler.kind", "advantages": "rl.advantage"}


def train_from_sft(run: Path, seed: int, out: Path, overrides: list[str] = ()) -> float:
    """One GRPO run of `run`'s recipe from `run/sft-model` with `seed` (and the arm's config
    `overrides`, `field=value`), into `out`: its wall seconds (0 when `out` already holds a
    finished run)."""
    if (out / "eval" / "final").is_dir() and (out / "final-model").is_dir():
        print(f"{out}: finished earlier, read as it is", flush=True)
        return 0.0
    command = [
        "toolgym",
        "train",
        str(run / "config.yaml"),
        "--out",
        str(out),
        "--set",
        f"model.init={run / 'sft-model'}",
        "--set",
        "sft.steps=0",
        "--set",
        "eval.base_tasks=0",
        "--set",
        f"seed={seed}",
    ]
    for override in overrides:
        command += ["--set", override]
    print("$ " + " ".join(command), flush=True)
    started = time.perf_counter()
    code = subprocess.run(command).returncode  # its progress goes straight to this terminal / log
    if code != 0:
        raise SystemExit(
            f"seed {seed}: `toolgym train` exited {code}; its messages are above (the seeds already finished are in {out.parent})"
        )
    return time.perf_counter() - started


def arm_prefix(option: str | None, kind: str | None) -> str:
    """The folder-name prefix of an arm's runs (none for the run's own recipe)."""
    if kind is None:
        return ""
    if option == "samplers":
        return f"{kind}-"
    if option == "advantages":
        return f"advantage-{kind}-"
    return "arm-" + re.sub(r"[^A-Za-z0-9.=-]+", "_", kind) + "-"


def arm_overrides(option: str | None, kind: str | None) -> list[str]:
    """The `--set` overrides of an arm: a sampler or an advantage, or the arm's own `field=value`s."""
    if kind is None:
        return []
    if option == "arms":
        pairs = [p.strip() for p in kind.split(";") if p.strip()]
        bad = [p for p in pairs if "=" not in p]
        if bad:
            raise SystemExit(f"--arms {kind!r}: {bad[0]!r} is not field=value")
        return pairs
    return [f"{ARM_FIELDS[option]}={kind}"]


def stage_numbers(run: Path, stage: str, suite: str) -> tuple[float, dict[str, float], list[Any], dict[str, int]]:
    """A stage's held-out pass@1, per-category pass@1, trajectories and episodes cut by each limit
    (from its eval folder)."""
    from toolgym.harness.trajectory import read_jsonl

    where = run / "eval" / stage / suite
    report = json.loads((where / "report.json").read_text())
    by_category = {family: group["pass_at"]["1"]["value"] for family, group in report["by_family"].items() if "1" in group["pass_at"]}
    overall = report["overall"]
    return (overall["pass_at"]["1"]["value"], by_category, read_jsonl(where / "trajectories.jsonl"), overall["limits_hit"])


def zero_variance_share(run: Path) -> tuple[int, int]:
    """(rollouts in groups whose rewards were all equal, all rollouts) over a run's GRPO steps,
    from its saved rollouts: the rollouts that carried no gradient."""
    from collections import defaultdict

    from toolgym.harness.trajectory import read_jsonl

    zero = total = 0
    for step in sorted((run / "rollouts").glob("step-*.jsonl")):
        groups: dict[str, list[float]] = defaultdict(list)
        for traj in read_jsonl(step):
            groups[traj.group_id.rsplit(":", 1)[0]].append(traj.reward)
        total += sum(len(g) for g in groups.values())
        zero += sum(len(g) for g in groups.values() if len(set(g)) == 1)
    return zero, total


def compare_arms(results: list[dict], finals: dict[tuple[str, int, str], list], a: str, b: str, suite: str) -> dict:
    """Arm `a` (a sampler, an advantage) against `b` over the seeds both ran: zero-variance shares
    and their ratio, and final held-out accuracy a - b paired by (seed, task) with its bootstrap
    CI. `finals`: each (arm, seed, suite)'s final trajectories, as `main` read them."""
    from toolgym.harness.evaluate import paired_difference

    def pooled(kind: str) -> list:
        return [
            t.model_copy(update={"task_id": f"{seed}:{t.task_id}"})
            for (k, seed, s), trajs in sorted(finals.items(), key=lambda item: item[0])
            if k == kind and s == suite
            for t in trajs
        ]

    share = {}
    for kind in (a, b):
        rows = [r for r in results if r["arm"] == kind and r["suite"] == suite]
        share[kind] = sum(r["zero_variance_rollouts"] for r in rows) / max(1, sum(r["rollouts"] for r in rows))
    diff = paired_difference(pooled(b), pooled(a), seed=0)
    return {
        "suite": suite,
        "a": a,
        "b": b,
        "zero_variance_share": share,
        "ratio_b_over_a": share[b] / share[a] if share[a] else None,
        "final_a_minus_b": {"points": diff.value * 100, "ci": [diff.low * 100, diff.high * 100]},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a finished campaign directory with sft-model/")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=Path("runs/rl-seeds"), help="where the seeds' runs go")
    arms = parser.add_mutually_exclusive_group()
    arms.add_argument(
        "--samplers",
        nargs="+",
        default=None,
        help="task samplers to compare (sampler.kind), each run on every seed; default: the run's own",
    )
    arms.add_argument(
        "--advantages", nargs="+", default=None, help="advantage estimators to compare (rl.advantage; `none` is the reward ablation)"
    )
    arms.add_argument(
        "--arms",
        nargs="+",
        default=None,
        help="config overrides to compare, one arm each (`field=value`, several joined by `;`); the first is the reference",
    )
    parser.add_argument("--json", default="runs/bench/rl_seeds.json")
    args = parser.parse_args()
    from toolgym.harness.evaluate import paired_difference

    if not (args.run / "sft-model" / "config.json").exists():
        raise SystemExit(f"{args.run}/sft-model: missing (a campaign with an SFT stage exports it; `toolgym sft` makes one)")
    config = yaml.safe_load((args.run / "config.yaml").read_text())
    suites = [mix["suite"] for mix in config["envs"]]
    run_sft = {suite: stage_numbers(args.run, "sft", suite)[0] for suite in suites}  # the run's own SFT score
    results, finals = [], {}
    option = next((name for name in (*ARM_FIELDS, "arms") if getattr(args, name)), None)
    chosen = getattr(args, option) if option else [None]
    for kind, seed in [(kind, seed) for kind in chosen for seed in args.seeds]:
        out = args.out / f"{arm_prefix(option, kind)}seed-{seed}"
        seconds = train_from_sft(args.run, seed, out, arm_overrides(option, kind))
        sampler = kind if option == "samplers" else config["sampler"]["kind"]
        arm = kind or sampler
        zero, rollouts = zero_variance_share(out)
        for suite in suites:
            initial, initial_cats, before, _ = stage_numbers(out, "initial", suite)
            final, final_cats, after, limits_hit = stage_numbers(out, "final", suite)
            diff = paired_difference(before, after, seed=0)  # the bootstrap the run's own report uses
            finals[(arm, seed, suite)] = after
            results.append(
                {
                    "seed": seed,
                    "arm": arm,
                    "sampler": sampler,
                    "suite": suite,
                    "run": str(out),
                    "seconds": round(seconds, 1),
                    "rollouts": rollouts,
                    "zero_variance_rollouts": zero,
                    "run_sft_pass@1": run_sft[suite],
                    "initial": initial,
                    "final": final,
                    "final_minus_initial": {"points": diff.value * 100, "ci": [diff.low * 100, diff.high * 100]},
                    "episodes": len(after),
                    "final_limits_hit": limits_hit,
                    "by_category": {"initial": initial_cats, "final": final_cats},
                }
            )
    print()
    for r in results:
        g = r["final_minus_initial"]
        cats = ", ".join(f"{c} {r['by_category']['initial'].get(c, 0):.2f}->{v:.2f}" for c, v in sorted(r["by_category"]["final"].items()))
        same = "reproduces" if abs(r["initial"] - r["run_sft_pass@1"]) < 1e-9 else "DIFFERS FROM"
        print(
            f"{r['arm']} seed {r['seed']}: {r['suite']} held-out pass@1 SFT {r['initial']:.3f} ({same} the run's SFT "
            f"{r['run_sft_pass@1']:.3f}) -> final {r['final']:.3f} (final - SFT {g['points']:+.1f} points, "
            f"95% CI [{g['ci'][0]:+.1f}, {g['ci'][1]:+.1f}], paired; {r['episodes']} episodes; "
            f"limits hit {r['final_limits_hit'] or 'none'}; {r['seconds'] / 60:.1f} min)\n  rollouts "
            f"{r['rollouts']}, in zero-variance groups {r['zero_variance_rollouts'] / max(1, r['rollouts']):.0%}; "
            f"by category: {cats}"
        )
    comparisons = []
    for suite in suites:
        for kind in dict.fromkeys(r["arm"] for r in results):
            gains = [r["final_minus_initial"]["points"] for r in results if r["suite"] == suite and r["arm"] == kind]
            if len(gains) > 1:
                print(
                    f"{suite}, {kind}, {len(gains)} seeds of GRPO from one SFT checkpoint: final - SFT mean "
                    f"{statistics.mean(gains):+.1f} points, sd {statistics.stdev(gains):.1f}, "
                    f"min {min(gains):+.1f}, max {max(gains):+.1f}"
                )
        for other in chosen[1:] if option and (len(chosen) == 2 or option == "arms") else []:
            c = compare_arms(results, finals, chosen[0], other, suite)
            comparisons.append(c)
            s, g = c["zero_variance_share"], c["final_a_minus_b"]
            ratio = f"{c['ratio_b_over_a']:.2f}x" if c["ratio_b_over_a"] else "n/a"
            print(
                f"{suite}: rollouts in zero-variance groups {c['a']} {s[c['a']]:.0%}, {c['b']} {s[c['b']]:.0%} "
                f"({c['b']} / {c['a']} = {ratio}); final held-out {c['a']} - {c['b']} {g['points']:+.1f} points, "
                f"95% CI [{g['ci'][0]:+.1f}, {g['ci'][1]:+.1f}], paired by seed and task"
            )
    key = {"samplers": "sampler_comparison", "advantages": "advantage_comparison", "arms": "arm_comparison"}.get(option or "")
    write_results(args.json, {"seeds": results, key: comparisons} if comparisons else results)


if __name__ == "__main__":
    main()
