"""Trainer throughput and memory, side by side in one run.

One RL step on the same batch of real trajectories (oracle demonstrations of `records` train
tasks, or with `--suite bfcl` the main job's BFCL ones, so every configuration trains the same
tokens), or with `--step sft` SFT steps on batches of 8 of them (the main job's SFT stage), for:
full fine-tune, full fine-tune with a reference model (KL, beta > 0), LoRA, LoRA with KL (the
reference is the base with adapters off); `(padded)` configurations switch the padding-free
micro-batches off (`packing: false`, `trainers/packing.py`): rows padded to the longest.
Each configuration runs in a fresh process so its peak RSS is its own. Prints train tokens/s and
peak memory, and the ratios to the full fine-tune; and, against this machine's matmul ceiling
measured in the same run (the dtype each configuration computes in), model-FLOP utilisation as
the issue tracker defines it: 6 x parameters FLOPs per *trained* (policy) token; and beside it
the matmul FLOPs the step really executed (counted by `torch.utils.flop_counter` in one extra,
untimed pass over the timed batches: the shared prompt prefix runs once, the LM head only at policy
positions, padding inside a micro-batch runs too where it is not packed) per second against the
same ceiling. (6 x parameters x every token
in the batch would count a prompt shared by a group once per row: it gave "MFU 120%" in fp32.)
`autocast: auto` configurations compute in bf16 only where the CPU does so natively (fp32 on an
AVX2-only CPU: `inference/hardware.py`).

    python bench/trainer.py [--hidden 128 --layers 4] [--batch 32] [--out runs/bench/trainer.json]
    python bench/trainer.py --model smollm2-135m --suite bfcl --step sft --batch 64 --steps 3 \
        --configs "full + autocast auto,full + autocast auto (padded),full,full (padded)"
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

CONFIGS = {
    "full": {},
    "full (padded)": {"packing": False},
    "full + autocast auto": {"autocast": "auto"},
    "full + autocast auto (padded)": {"autocast": "auto", "packing": False},
    "full + reference (kl)": {"kl_beta": 0.05},
    "lora": {"lora": {"r": 8, "alpha": 16}},
    "lora + autocast auto": {"lora": {"r": 8, "alpha": 16}, "autocast": "auto"},
    "lora + kl": {"lora": {"r": 8, "alpha": 16}, "kl_beta": 0.05},
}


def one(
    name: str, hidden: int, layers: int, batch: int, steps: int, model: str | None = None, suite: str = "records", step: str = "rl"
) -> dict:
    """Run in a child process: build the model, collect demonstrations, time `steps` RL steps
    (`step` "sft": SFT steps on batches of 8 of them, as the main job's SFT stage runs)."""
    from torch.utils.flop_counter import FlopCounterMode

    import toolgym
    from toolgym.harness.demonstrations import collect_demonstrations
    from toolgym.inference.hf_policy import HFPolicy
    from toolgym.inference.tiny import DEFAULT_DIR, build_tiny_policy
    from toolgym.tasks import builtin_suite
    from toolgym.trainers.batching import pack
    from toolgym.trainers.learner import Learner, LearnerConfig, apply_lora

    if model is None:
        model = str(build_tiny_policy(DEFAULT_DIR.with_name(f"tiny-policy-v1-h{hidden}-l{layers}-v1024"), hidden=hidden, layers=layers))
    policy = HFPolicy(model, device="cpu", dtype="fp32")
    if suite == "bfcl":  # the main job's compact tool list
        from toolgym.inference.chat import load_template

        policy.tokenizer.chat_template = load_template("qwen2.5-compact")
    config = LearnerConfig(**CONFIGS[name])
    if config.lora is not None:
        policy.model = apply_lora(policy.model, config.lora)
    learner = Learner(policy.model, config)
    demos = collect_demonstrations(
        builtin_suite(suite).split("train").tasks[:batch], policy.tokenizer, lambda env_id: toolgym.make(env_id).unwrapped, progress=False
    )
    if step == "sft":  # batches of 8 in one fixed random order, the same in every configuration
        order = random.Random(0).sample(range(len(demos)), len(demos))
        batches = [pack([demos[i] for i in order[j : j + 8]], [0.0] * 8, policy.pad_id) for j in range(0, len(order) - 7, 8)][: steps + 2]
        run = learner.sft_step
    else:
        batches = [pack(demos, [1.0 if i % 2 else -1.0 for i in range(len(demos))], policy.pad_id)] * (steps + 2)
        run = learner.rl_step
    run(batches[0])  # warm-up
    start = time.perf_counter()
    tokens = 0
    for data in batches[1 : steps + 1]:
        m = run(data)
        tokens += m["train_tokens"]
    elapsed = time.perf_counter() - start
    counter = FlopCounterMode(display=False)
    with counter:  # the timed batches once more, untimed: what their steps really execute
        for data in batches[1 : steps + 1]:
            run(data)
    trainable = sum(p.numel() for p in policy.model.parameters() if p.requires_grad)
    params = sum(p.numel() for p in policy.model.parameters())
    timed = batches[1 : steps + 1]
    return {
        "config": name,
        "step": step,
        "train_tokens": tokens / steps,
        "real_tokens": sum(int(b.attention.sum()) for b in timed) / steps,
        "padded_tokens": sum(b.attention.numel() for b in timed) / steps,
        "params": params,
        "precision": learner.precision.dtype,
        "executed_flops": counter.get_total_flops() / steps,
        "tokens_per_s": tokens / elapsed,
        "step_s": elapsed / steps,
        "trainable_params": trainable,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    sys.stdout.reconfigure(line_buffering=True)  # progress shows in a log file too, line by line
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument(
        "--model", default=None, help="a built-in model (smollm2-135m) or directory instead of the tiny model of --hidden x --layers"
    )
    parser.add_argument(
        "--suite",
        default="records",
        help="the train tasks whose oracle demonstrations train (records, or bfcl: the main job's, with its compact tool list)",
    )
    parser.add_argument(
        "--step",
        default="rl",
        choices=["rl", "sft"],
        help="rl: one RL step on the whole batch, repeated; sft: SFT steps on batches of 8 of them, one after another",
    )
    parser.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated subset of: " + ", ".join(CONFIGS))
    parser.add_argument("--out", default="runs/bench/trainer.json")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(one(args.child, args.hidden, args.layers, args.batch, args.steps, args.model, args.suite, args.step)))
        return
    results = []
    for name in args.configs.split(","):
        extra = ["--model", args.model] if args.model else []
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--child",
                name,
                "--hidden",
                str(args.hidden),
                "--layers",
                str(args.layers),
                "--batch",
                str(args.batch),
                "--steps",
                str(args.steps),
                "--suite",
                args.suite,
                "--step",
                args.step,
                *extra,
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    import torch

    from toolgym.inference.hardware import cpu_description, gemm_ceiling

    ceilings = {d: gemm_ceiling(torch.bfloat16 if d == "bf16" else torch.float32) for d in sorted({r["precision"] for r in results})}
    base = results[0]
    model = args.model or f"tiny h{args.hidden} x {args.layers} layers"
    print(
        f"machine: {cpu_description()}; ceiling "
        + ", ".join(f"{d} {g:.1f} GFLOP/s" for d, g in ceilings.items())
        + f" (matmul, {torch.get_num_threads()} threads, measured now)"
    )
    what = "one RL step" if args.step == "rl" else "an SFT step (8 demonstrations)"
    print(
        f"{what} on {args.suite} demonstrations: {base['train_tokens']:.0f} policy tokens, "
        f"{base['real_tokens']:.0f} tokens in the batch, {base['padded_tokens']:.0f} padded to the longest row "
        f"(mean of {args.steps} steps), model {model} ({base['params'] / 1e6:.1f} M parameters), CPU:"
    )
    for r in results:
        ceiling = ceilings[r["precision"]]
        r["mfu"] = 6 * r["params"] * r["train_tokens"] / r["step_s"] / 1e9 / ceiling
        r["executed_utilisation"] = r["executed_flops"] / r["step_s"] / 1e9 / ceiling
        print(
            f"  {r['config']:<28} {r['tokens_per_s']:8.0f} train tok/s ({r['step_s']:.2f} s/step, "
            f"{r['tokens_per_s'] / base['tokens_per_s']:.2f}x full, computes in {r['precision']}, MFU {r['mfu']:.0%}; "
            f"executed {r['executed_flops'] / r['step_s'] / 1e9:.0f} GFLOP/s = {r['executed_utilisation']:.0%})  "
            f"peak RSS {r['peak_rss_mb']:.0f} MB ({r['peak_rss_mb'] / base['peak_rss_mb']:.2f}x)  "
            f"trainable {r['trainable_params']:,}"
        )
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from common import write_results  # bench/common.py

    write_results(args.out, {"machine": cpu_description(), "ceilings_gflops": ceilings, "results": results})


if __name__ == "__main__":
    main()
