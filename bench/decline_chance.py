"""How often does a run's SFT model decline to call, when sampled? The chance that its answer opens
no tool call, on BFCL train irrelevance prompts, at temperature 1 (the rollouts' temperature).

    python bench/decline_chance.py runs/p-cap16cos-s0 runs/p-cap32-s0 [--tasks 40]

For each run, `RUN/sft-model` (fp32) scores the last `--tasks` train irrelevance entries of the
`bfcl` suite the way the RL stage's screen does with `sampler.screen_declines`: 1 - p(the answer
opens `<tool_call>`), from one forward pass over prompt + opener (`ReferenceScreen`). A policy
whose chance is near 0 never declines in a group of rollouts, so the reward has nothing to
sharpen there; greedy evaluation shows only which side of 0.5 each prompt falls. Prints mean,
median and largest per run, and writes `runs/bench/decline_chance.json`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_results  # noqa: E402


def decline_chances(model_dir: Path, tasks: list) -> list[float]:
    """1 - p(opener) for each task under the model in `model_dir` (fp32, temperature 1)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import toolgym
    from toolgym.trainers.screening import ReferenceScreen

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    screen = ReferenceScreen(tokenizer, lambda env_id: toolgym.make(env_id).unwrapped, declines=True)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return list(screen.predicted_pass_rates(model, tasks, pad_id).values())


def main() -> None:
    """Score every run given and print one line each."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--tasks", type=int, default=40)
    args = parser.parse_args()

    from toolgym.tasks import builtin_suite

    train = [t for t in builtin_suite("bfcl").tasks if t.split == "train" and t.family == "irrelevance"]
    tasks = train[-args.tasks :]  # the last ones: the main job demonstrates the first ones
    results = {}
    for run in args.runs:
        chances = decline_chances(run / "sft-model", tasks)
        results[str(run)] = {
            "tasks": len(chances),
            "mean": statistics.mean(chances),
            "median": statistics.median(chances),
            "max": max(chances),
        }
        r = results[str(run)]
        print(
            f"{run}: p(no call) on {r['tasks']} train irrelevance prompts, T=1: mean {r['mean']:.4f}, "
            f"median {r['median']:.4f}, largest {r['max']:.4f}",
            flush=True,
        )
    write_results("runs/bench/decline_chance.json", results)


if __name__ == "__main__":
    main()
