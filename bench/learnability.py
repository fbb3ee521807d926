"""The learnability sampler vs uniform sampling: the same campaign budget, several seeds.

Both arms start from one SFT checkpoint of the records recipe (`examples/records.yaml`:
SmolLM2-135M, SFT on records oracle demonstrations, made once here) and run the same number of
GRPO steps with the same tasks per step, G, learning rate and seeds; only `sampler.kind` differs. Measured per arm:

- a fixed probe of train tasks (2 samples of each of the first `--probe` train tasks at the
  rollout temperature, the same seeds for every arm) every `--probe-every` steps, as a function of rollouts spent: rollouts needed to
  reach each of `--targets` (linear interpolation between probes; "not reached" counts as the
  whole budget, so a ratio with unreached targets is a lower bound);
- held-out pass@1 (greedy) at the end, on the first `--heldout` held-out tasks;
- the share of rollouts that carried a gradient (their group had reward variance).

The train pass rate of the sampled tasks is not compared: each sampler chooses what it measures.

    python bench/learnability.py [--seeds 0,1] [--steps 6] [--targets 0.5,0.6] [--out runs/bench/learnability.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write_results  # noqa: E402  (bench/common.py)

from toolgym.harness.eval_run import run_eval  # noqa: E402
from toolgym.trainers.campaign import Campaign  # noqa: E402
from toolgym.trainers.config import CampaignConfig, load_config  # noqa: E402

RECORDS_RECIPE = Path(__file__).resolve().parent.parent / "examples" / "records.yaml"


def recipe_config(out_dir: Path, **overrides) -> CampaignConfig:
    """The records recipe (examples/records.yaml) with `overrides` (dotted keys) applied."""
    return load_config(RECORDS_RECIPE, {"out_dir": str(out_dir), **overrides})


def sft_checkpoint(out_dir: Path) -> Path:
    """The records recipe's SFT stage, once: its exported model directory."""
    Campaign(recipe_config(out_dir, **{"eval.base_tasks": 0, "envs.0.eval_tasks": 1}), progress=False).run(sft_only=True)
    return out_dir / "sft-model"


def probe(campaign: Campaign, tasks: int, out: Path) -> float:
    """The train pass rate at the rollout temperature, on a fixed set: 2 samples of each of the
    first `tasks` train tasks of records, the same seeds for every arm. (Greedy, the SFT model
    already passes about 0.78 of them: every target would be reached before the first step.)"""
    report, _ = run_eval(
        "probe",
        campaign.suites["records"],
        "train",
        2,
        [1],
        tasks,
        campaign.config.rollout.concurrency,
        0,
        out,
        campaign.limits(),
        progress=False,
        agent=campaign.agent(campaign.config.rollout.temperature),
        env_factory=campaign.make_env,
    )
    return report.overall.pass_at["1"].value


def arm(kind: str, seed: int, init: Path, args: argparse.Namespace, out_dir: Path) -> dict:
    """One campaign with sampler `kind`: probe curve, held-out pass@1, gradient share."""
    config = recipe_config(
        out_dir,
        **{
            "model.init": str(init),
            "sft.steps": 0,
            "eval.base_tasks": 0,
            "seed": seed,
            "sampler.kind": kind,
            "rl.steps": args.steps,
            "rollout.save": False,
            "envs.0.eval_tasks": args.heldout,
            "checkpoint.every": 10_000,
        },
    )
    campaign = Campaign(config, progress=False)
    campaign.run_dir.mkdir(parents=True, exist_ok=True)
    from toolgym.trainers.checkpoint import MetricsLog

    campaign.metrics = MetricsLog(campaign.run_dir)
    per_step = config.rl.tasks_per_step * config.rl.group_size
    curve, carried = [(0, probe(campaign, args.probe, out_dir / "probe-0"))], 0
    campaign.publish(0)
    try:
        for step in range(1, args.steps + 1):
            campaign.step = step
            metrics = campaign.learn(campaign.collect(step))
            carried += metrics.get("trained_trajectories", 0)
            if step % args.probe_every == 0 or step == args.steps:
                curve.append((step * per_step, probe(campaign, args.probe, out_dir / f"probe-{step}")))
        heldout = campaign.evaluate("final")["records"]["pass@1"]
    finally:
        campaign.close()
    return {
        "kind": kind,
        "seed": seed,
        "curve": curve,
        "heldout": heldout,
        "rollouts_to_target": {str(t): rollouts_to(curve, t) for t in args.targets},
        "rollouts": args.steps * per_step,
        "gradient_share": carried / (args.steps * per_step),
    }


def rollouts_to(curve: list[tuple[int, float]], target: float) -> float | None:
    """Rollouts at which the probe first reaches `target` (linear between probes), None if never."""
    for (r0, p0), (r1, p1) in zip(curve, curve[1:]):
        if p0 >= target:
            return float(r0)
        if p1 >= target:
            return r0 + (r1 - r0) * (target - p0) / (p1 - p0)
    return float(curve[0][0]) if curve[0][1] >= target else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--probe", type=int, default=40, help="train tasks in the fixed probe")
    parser.add_argument("--probe-every", type=int, default=2)
    parser.add_argument("--heldout", type=int, default=60)
    parser.add_argument("--targets", default="0.5,0.6", help="probe pass rates to reach (comma-separated)")
    parser.add_argument("--init", default=None, help="an SFT model directory (default: made here once)")
    parser.add_argument("--out", default="runs/bench/learnability.json")
    args = parser.parse_args()
    args.targets = [float(t) for t in args.targets.split(",")]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        init = Path(args.init) if args.init else sft_checkpoint(Path(tmp) / "sft")
        for seed in (int(s) for s in args.seeds.split(",")):
            for kind in ("learnability", "uniform"):  # alternated: this machine is noisy
                res = arm(kind, seed, init, args, Path(tmp) / f"{kind}-{seed}")
                results.append(res)
                print(json.dumps(res), flush=True)
    budget = results[0]["rollouts"]
    print(
        f"\n{len(results) // 2} seeds x {args.steps} GRPO steps ({budget} rollouts per arm); probe: first {args.probe} "
        f"train tasks x 2 samples at the rollout temperature"
    )
    summary = {}
    for kind in ("learnability", "uniform"):
        mine = [r for r in results if r["kind"] == kind]
        reach = {str(t): [r["rollouts_to_target"][str(t)] for r in mine] for t in args.targets}
        summary[kind] = {
            "rollouts_to_target": {t: statistics.mean(x if x is not None else float(budget) for x in xs) for t, xs in reach.items()},
            "reached": {t: sum(x is not None for x in xs) for t, xs in reach.items()},
            "heldout": statistics.mean(r["heldout"] for r in mine),
            "gradient_share": statistics.mean(r["gradient_share"] for r in mine),
        }
        s = summary[kind]
        targets = "  ".join(
            f"to {t}: {s['rollouts_to_target'][t]:4.0f} ({s['reached'][t]}/{len(mine)} reached)" for t in s["rollouts_to_target"]
        )
        print(
            f"  {kind:<13} rollouts {targets}  held-out pass@1 {s['heldout']:.3f} "
            f"{[round(r['heldout'], 3) for r in mine]}  rollouts with a gradient {s['gradient_share']:.0%}"
        )
    ratio = {
        t: summary["uniform"]["rollouts_to_target"][t] / max(summary["learnability"]["rollouts_to_target"][t], 1e-9)
        for t in summary["uniform"]["rollouts_to_target"]
    }
    for t, r in ratio.items():
        print(f"  target {t}: uniform needs {r:.2f}x the rollouts of learnability")
    write_results(args.out, {"args": vars(args), "runs": results, "summary": summary, "ratio": ratio})


if __name__ == "__main__":
    main()
