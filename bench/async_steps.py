"""Wall time of a campaign step, synchronous vs asynchronous rollouts (max_staleness 1), same work.

Both runs train the same tiny policy on the same tasks (sandboxed `shell-ops` in bwrap, so
episodes spend time in the environment as well as in generation) for the same number of GRPO
steps with the same seeds; only `rollout.max_staleness` differs. The step time is the wall time
between consecutive step ends (steps 2..N: the first has nothing to overlap), read from each run's
metrics. Rounds alternate sync and async (this machine is noisy); the medians are compared.

    python bench/async_steps.py [--steps 6] [--rounds 2] [--out runs/bench/async_steps.json]
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

from toolgym.trainers.campaign import Campaign  # noqa: E402
from toolgym.trainers.config import CampaignConfig  # noqa: E402


def run(max_staleness: int, steps: int, out_dir: Path) -> dict:
    config = CampaignConfig.model_validate(
        {
            "name": f"staleness-{max_staleness}",
            "seed": 0,
            "out_dir": str(out_dir),
            "model": {"device": "cpu", "dtype": "fp32", "tiny": {"hidden": 128, "layers": 4}},
            "envs": [{"env": "shell-ops-v0", "suite": "shell-ops", "train_tasks": 64, "eval_tasks": 1, "sandbox": {"backend": "bwrap"}}],
            "sft": {"steps": 0},
            "rl": {
                "steps": steps,
                "tasks_per_step": 8,
                "group_size": 4,
                "drop_zero_variance": False,
                "learner": {"lr": 1e-4, "weight_decay": 0.01, "token_budget": 8192},
            },
            "sampler": {"kind": "uniform"},
            "checkpoint": {"every": 1000},
            "rollout": {"max_turns": 3, "max_new_tokens": 32, "concurrency": 32, "max_staleness": max_staleness},
        }
    )
    Campaign(config, progress=False).run()
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r.get("kind") == "train"]
    later = train[1:]
    return {
        "step_s": [r["time_step_s"] for r in later],
        "mean_step_s": statistics.mean(r["time_step_s"] for r in later),
        "rollout_s": statistics.mean(r["time_rollout_s"] for r in later),
        "train_s": statistics.mean(r["time_train_s"] for r in later),
        "staleness_mean": statistics.mean(r["staleness_mean"] for r in later),
        "stale_dropped": sum(r["stale_dropped"] for r in train),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default="runs/bench/async_steps.json")
    args = parser.parse_args()
    results: dict = {"sync": [], "async": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for name, k in (("sync", 0), ("async", 1)):
                res = run(k, args.steps, Path(tmp) / f"{name}-{r}")
                results[name].append(res)
                print(
                    f"round {r + 1} {name:5s}: {res['mean_step_s']:.2f} s/step (rollout {res['rollout_s']:.2f} s, "
                    f"train {res['train_s']:.2f} s, staleness {res['staleness_mean']:.2f}, "
                    f"dropped {res['stale_dropped']})"
                )
    sync = statistics.median(x["mean_step_s"] for x in results["sync"])
    asyn = statistics.median(x["mean_step_s"] for x in results["async"])
    results["ratio_async_over_sync"] = asyn / sync
    print(f"median s/step: sync {sync:.2f}, async {asyn:.2f}  ->  async/sync = {asyn / sync:.2f}x")
    write_results(args.out, results)


if __name__ == "__main__":
    main()
