"""A few campaign steps on a GPU with a 0.3-0.5 B model built from a config (see ../shared/GPU.md).

Builds a Qwen2 model from a config (random weights, no download) with the tiny policy's tokenizer,
saves it as a `from_pretrained` directory, and runs the real `Campaign` on it (`model.init` = that
directory, CUDA, bf16): a short SFT stage on oracle demonstrations, then GRPO steps on `records`
with the learnability sampler, held-out evaluation before and after. Prints per-step rollout,
training and total time, train tokens/s and peak GPU memory; writes them to `--out`.

    python bench/gpu_campaign.py [--layers 24 --hidden 1024] [--rl-steps 4]

On a CPU machine pass small sizes (`--device cpu --dtype fp32 --layers 2 --hidden 64`) to check it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import qwen2_from_config, write_results  # noqa: E402  (bench/common.py)

from toolgym.trainers.campaign import Campaign  # noqa: E402
from toolgym.trainers.checkpoint import read_metrics  # noqa: E402
from toolgym.trainers.config import CampaignConfig  # noqa: E402


def build_model_dir(out: Path, layers: int, hidden: int) -> tuple[Path, int]:
    """A Qwen2 model of the given size with the tiny tokenizer, written with `save_pretrained`."""
    model, tokenizer = qwen2_from_config(layers, hidden)
    params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out, params


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--rl-steps", type=int, default=4)
    parser.add_argument("--tasks-per-step", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--lora", action="store_true", help="LoRA (r=16) instead of a full fine-tune")
    parser.add_argument("--run-dir", default="runs/gpu-campaign")
    parser.add_argument("--out", default="runs/bench/gpu_campaign.json")
    args = parser.parse_args()

    model_dir, params = build_model_dir(Path(args.run_dir) / "init-model", args.layers, args.hidden)
    print(f"model: {params / 1e6:.0f} M parameters, {args.device} {args.dtype}")
    learner = {"lr": 1e-5, "loss": "ppo", "agg": "token-mean", "kl_beta": 0.0}  # token_budget: auto
    if args.lora:
        learner["lora"] = {"r": 16, "alpha": 32}
    config = CampaignConfig.model_validate(
        {
            "name": "gpu-campaign",
            "seed": 0,
            "out_dir": str(Path(args.run_dir) / "run"),
            "model": {"init": str(model_dir), "device": args.device, "dtype": args.dtype},
            "envs": [{"env": "records-v0", "suite": "records", "eval_tasks": 64}],
            "sft": {"steps": 10, "batch_size": 32, "lr": 1e-4, "demos_per_suite": 256},
            "rl": {
                "steps": args.rl_steps,
                "tasks_per_step": args.tasks_per_step,
                "group_size": args.group_size,
                # random weights pass nothing, so every group has zero variance: train on them anyway
                # (advantages 0, the full forward/backward still runs) to time the update
                "drop_zero_variance": False,
                "learner": learner,
            },
            "rollout": {"max_turns": 6, "max_new_tokens": 48, "max_total_tokens": 2048, "concurrency": 128},
            "checkpoint": {"every": 1000, "keep": 1},
        }
    )
    if args.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    campaign = Campaign(config, progress=False)
    campaign.run()
    wall = time.perf_counter() - start
    records = read_metrics(config.out_dir)
    steps = [r for r in records if r.get("kind") == "train"]
    sft = [r for r in records if r.get("kind") == "sft"]
    results = {
        "params_m": params / 1e6,
        "device": args.device,
        "dtype": args.dtype,
        "lora": args.lora,
        "wall_s": wall,
        "steps": [],
        "sft_step_s": sum(r["train_seconds"] for r in sft) / max(1, len(sft)),
        "sft_tokens_per_s": sum(r["train_tokens"] for r in sft) / max(1e-9, sum(r["train_seconds"] for r in sft)),
        "evals": [r for r in records if r.get("kind") == "eval"],
    }
    print(f"SFT: {results['sft_step_s']:.2f} s per step, {results['sft_tokens_per_s']:.0f} policy tokens/s")
    for row in steps:
        keep = {
            k: row.get(k)
            for k in (
                "step",
                "time_step_s",
                "time_rollout_s",
                "time_train_s",
                "train_tokens",
                "train_tokens_per_s",
                "rollout_tokens_per_s",
                "episodes",
                "pass_rate",
                "logprob_gap_mean",
                "logprob_gap_max",
                "grad_norm",
                "infra_or_verifier_errors",
            )
        }
        results["steps"].append(keep)
        print(
            f"step {keep['step']}: {keep['time_step_s']:.1f} s (rollout {keep['time_rollout_s']:.1f} s, train "
            f"{keep['time_train_s']:.1f} s), {keep['episodes']} episodes, train {keep['train_tokens_per_s'] or 0:.0f} "
            f"tok/s, rollout {keep['rollout_tokens_per_s']:.0f} tok/s, logprob gap mean {keep['logprob_gap_mean']}, "
            f"infra {keep['infra_or_verifier_errors']}"
        )
    if args.device.startswith("cuda"):
        results["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
        print(f"peak GPU memory {results['peak_memory_gib']:.1f} GiB")
    print(f"campaign wall time {wall:.0f} s")
    write_results(args.out, results)


if __name__ == "__main__":
    main()
