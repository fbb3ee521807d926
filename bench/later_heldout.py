"""Does a campaign's gain hold on tasks it never evaluated on? SFT model against final model of
finished runs, on a suite the campaign neither trained nor evaluated on, with the run's own budget.

    python bench/later_heldout.py runs/demo-seed0 runs/demo-seed2 [--suite bfcl-live] [--tasks 200]
    python bench/later_heldout.py runs/demo-sandboxed --suite mcp-inventory --skip 60 --tasks 60

For each run: `RUN/sft-model` and `RUN/final-model` (a campaign with an SFT stage exports both)
are evaluated on the first `--tasks` held-out tasks of `--suite` (default `bfcl-live`: BFCL's live
categories, all held out, never trained on; `--skip N` starts after the first N, e.g. the 60
mcp-inventory held-out tasks `toolgym demo --sandboxed` evaluates at every stage) with the run's
greedy evaluation budget read from `RUN/config.yaml` (tokens per turn, per episode, turns, temperature) and the precision its
`hardware.json` records. Tasks whose first prompt leaves less than one turn's answer budget
within the episode's token budget are skipped (counted): under the run's budget no model could
answer them, and they would only dilute the comparison. Prints each run's paired final - SFT
difference with its 95% CI and the per-category accuracies, then the spread over runs; writes
`RUN/later/SUITE/{sft,final}/` (the usual evaluation folders, which `toolgym compare` reads) and
`runs/bench/later_heldout.json`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import first_prompt_ids, write_results  # noqa: E402

STAGES = ("sft", "final")


def run_budget(run: Path) -> dict[str, Any]:
    """The evaluation budget and precision `run` used (its config.yaml and hardware.json)."""
    config = yaml.safe_load((run / "config.yaml").read_text())
    rollout, evaluation = config["rollout"], config["eval"]
    hardware = run / "hardware.json"
    dtype = json.loads(hardware.read_text())["rollout"]["dtype"] if hardware.exists() else "auto"
    return {
        "max_new_tokens": rollout["max_new_tokens"],
        "max_total_tokens": rollout["max_total_tokens"],
        "max_turns": evaluation.get("max_turns") or rollout["max_turns"],
        "temperature": evaluation["temperature"],
        "concurrency": rollout["concurrency"],
        "seed": config["seed"],
        "dtype": dtype,
    }


def answerable(suite: Any, model: Path, budget: dict[str, Any], count: int, skip: int = 0) -> tuple[Any, int]:
    """The first `count` held-out tasks of `suite` after its first `skip` whose first prompt
    (rendered as the run renders it, with `model`'s tokenizer and chat template) leaves a whole
    turn's answer budget; and how many were skipped before them."""
    from transformers import AutoTokenizer

    import toolgym
    from toolgym.tasks import TaskSuite

    tokenizer = AutoTokenizer.from_pretrained(str(model))
    room = budget["max_total_tokens"] - budget["max_new_tokens"]
    kept, skipped, envs = [], 0, {}
    for task in suite.split("held-out").tasks[skip:]:
        env = envs.setdefault(task.env_id, toolgym.make(task.env_id).unwrapped)
        if len(first_prompt_ids(tokenizer, env, task)) <= room:
            kept.append(task)
        else:
            skipped += 1
        if len(kept) == count:
            break
    for env in envs.values():
        env.close()
    return TaskSuite(suite.name, kept, suite.version), skipped


def evaluate_run(run: Path, suite_name: str, tasks: int, skip: int = 0) -> dict[str, Any]:
    """SFT and final model of `run` on `suite_name`'s first `tasks` held-out tasks after its first
    `skip`; the paired gain."""
    from toolgym.cli.app import load_suite
    from toolgym.harness.eval_run import run_eval
    from toolgym.harness.evaluate import paired_difference
    from toolgym.harness.rollout import RolloutLimits
    from toolgym.harness.trajectory import read_jsonl
    from toolgym.inference.policy import SamplingParams

    budget = run_budget(run)
    suite, skipped = answerable(load_suite(suite_name), run / "final-model", budget, tasks, skip)
    limits = RolloutLimits(
        max_turns=budget["max_turns"], max_new_tokens_per_turn=budget["max_new_tokens"], max_total_tokens=budget["max_total_tokens"]
    )
    sampling = SamplingParams(max_new_tokens=budget["max_new_tokens"], temperature=budget["temperature"])
    out: dict[str, Any] = {
        "run": str(run),
        "suite": suite_name,
        "budget": budget,
        "after": skip,
        "tasks": len(suite),
        "skipped_too_long": skipped,
    }
    trajectories = {}
    for stage in STAGES:
        model = run / f"{stage}-model"
        if not (model / "config.json").exists():
            raise SystemExit(
                f"{model}: no exported model (campaigns export sft-model and final-model; rerun the campaign with this version of toolgym)"
            )
        where = run / "later" / suite_name / stage
        started = time.perf_counter()
        report, paths = run_eval(
            f"hf:{model}",
            suite,
            "held-out",
            1,
            [1],
            tasks,
            budget["concurrency"],
            budget["seed"],
            where,
            limits,
            sampling,
            dtype=budget["dtype"],
        )
        trajectories[stage] = read_jsonl(paths["trajectories"])
        pass1 = report.overall.pass_at["1"]
        out[stage] = {
            "pass@1": pass1.value,
            "ci": [pass1.low, pass1.high],
            "episodes": report.overall.episodes,
            "limits_hit": report.overall.limits_hit,
            "seconds": round(time.perf_counter() - started, 1),
            "by_category": {f: g.pass_at["1"].value for f, g in report.by_family.items() if "1" in g.pass_at},
        }
        print(
            f"{run} {stage}: {suite_name} pass@1 {pass1.value:.3f} [{pass1.low:.3f}, {pass1.high:.3f}] "
            f"({report.overall.episodes} episodes, {out[stage]['seconds']:.0f} s)",
            flush=True,
        )
    diff = paired_difference(trajectories["sft"], trajectories["final"], seed=budget["seed"])
    out["final_minus_sft"] = {"points": diff.value * 100, "ci": [diff.low * 100, diff.high * 100]}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="finished campaign directories")
    parser.add_argument("--suite", default="bfcl-live", help="a suite the runs neither trained nor evaluated on")
    parser.add_argument("--tasks", type=int, default=200, help="its first N held-out tasks")
    parser.add_argument("--skip", type=int, default=0, help="start after the first N held-out tasks (those the run evaluated)")
    parser.add_argument("--out", default="runs/bench/later_heldout.json")
    args = parser.parse_args()
    import toolgym  # noqa: F401 (registers the suites)

    results = [evaluate_run(run, args.suite, args.tasks, args.skip) for run in args.runs]
    print()
    for r in results:
        g = r["final_minus_sft"]
        cats = ", ".join(f"{c} {r['sft']['by_category'].get(c, 0):.2f}->{v:.2f}" for c, v in sorted(r["final"]["by_category"].items()))
        print(
            f"{r['run']}: {r['suite']} pass@1 SFT {r['sft']['pass@1']:.3f} -> final {r['final']['pass@1']:.3f} "
            f"(final - SFT {g['points']:+.1f} points, 95% CI [{g['ci'][0]:+.1f}, {g['ci'][1]:+.1f}], paired; "
            f"{r['final']['episodes']} episodes; {r['skipped_too_long']} longer prompts skipped)\n"
            f"  by category: {cats}"
        )
    gains = [r["final_minus_sft"]["points"] for r in results]
    if len(gains) > 1:
        print(
            f"over {len(gains)} runs: final - SFT mean {statistics.mean(gains):+.1f} points, "
            f"sd {statistics.stdev(gains):.1f}, min {min(gains):+.1f}, max {max(gains):+.1f}"
        )
    write_results(args.out, results)


if __name__ == "__main__":
    main()
