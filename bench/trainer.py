"""Trainer throughput and memory, side by side in one run.

One RL step on the same batch of real trajectories (oracle demonstrations of `records` train
tasks, so every configuration trains the same tokens), for: full fine-tune, full fine-tune with a
reference model (KL, beta > 0), LoRA, LoRA with KL (the reference is the base with adapters off).
Each configuration runs in a fresh process so its peak RSS is its own. Prints train tokens/s and
peak memory, and the ratios to the full fine-tune; and, against this machine's matmul ceiling
measured in the same run (the dtype each configuration computes in), model-FLOP utilisation as
the issue tracker defines it: 6 x parameters FLOPs per *trained* (policy) token; and beside it
the matmul FLOPs the step really executed (counted by `torch.utils.flop_counter` in one extra,
untimed step: the shared prompt prefix runs once, the LM head only at policy positions, padding
inside a micro-batch runs too) per second against the same ceiling. (6 x parameters x every token
in the batch would count a prompt shared by a group once per row: it gave "MFU 120%" in fp32.)
`autocast: auto` configurations compute in bf16 only where the CPU does so natively (fp32 on an
AVX2-only CPU: `harness/hardware.py`).

    python bench/trainer.py [--hidden 128 --layers 4] [--batch 32] [--out runs/bench/trainer.json]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

CONFIGS = {
    "full": {},
    "full + autocast auto": {"autocast": "auto"},
    "full + reference (kl)": {"kl_beta": 0.05},
    "lora": {"lora": {"r": 8, "alpha": 16}},
    "lora + autocast auto": {"lora": {"r": 8, "alpha": 16}, "autocast": "auto"},
    "lora + kl": {"lora": {"r": 8, "alpha": 16}, "kl_beta": 0.05},
}


def one(name: str, hidden: int, layers: int, batch: int, steps: int, model: str | None = None) -> dict:
    """Run in a child process: build the model, collect demonstrations, time `steps` RL steps."""
    from torch.utils.flop_counter import FlopCounterMode

    import toolgym
    from toolgym.harness.demonstrations import collect_demonstrations
    from toolgym.harness.hf_policy import HFPolicy
    from toolgym.harness.tiny import DEFAULT_DIR, build_tiny_policy
    from toolgym.tasks import builtin_suite
    from toolgym.trainers.batching import pack
    from toolgym.trainers.learner import Learner, LearnerConfig, apply_lora

    if model is None:
        model = str(build_tiny_policy(DEFAULT_DIR.with_name(f"tiny-policy-v1-h{hidden}-l{layers}-v1024"),
                                      hidden=hidden, layers=layers))
    policy = HFPolicy(model, device="cpu", dtype="fp32")
    config = LearnerConfig(**CONFIGS[name])
    if config.lora is not None:
        policy.model = apply_lora(policy.model, config.lora)
    learner = Learner(policy.model, config)
    demos = collect_demonstrations(builtin_suite("records").split("train").tasks[:batch], policy.tokenizer,
                                   lambda env_id: toolgym.make(env_id).unwrapped, progress=False)
    data = pack(demos, [1.0 if i % 2 else -1.0 for i in range(len(demos))], policy.pad_id)
    learner.rl_step(data)  # warm-up
    start = time.perf_counter()
    for _ in range(steps):
        m = learner.rl_step(data)
    elapsed = time.perf_counter() - start
    counter = FlopCounterMode(display=False)
    with counter:  # one more step, untimed: what the step really executes
        learner.rl_step(data)
    trainable = sum(p.numel() for p in policy.model.parameters() if p.requires_grad)
    params = sum(p.numel() for p in policy.model.parameters())
    return {"config": name, "train_tokens": m["train_tokens"], "padded_tokens": int(data.attention.sum()),
            "params": params, "precision": learner.precision.dtype, "executed_flops": counter.get_total_flops(),
            "tokens_per_s": m["train_tokens"] * steps / elapsed, "step_s": elapsed / steps,
            "trainable_params": trainable, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    sys.stdout.reconfigure(line_buffering=True)  # progress shows in a log file too, line by line
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--model", default=None, help="a built-in model (smollm2-135m) or directory instead of "
                        "the tiny model of --hidden x --layers")
    parser.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated subset of: " + ", ".join(CONFIGS))
    parser.add_argument("--out", default="runs/bench/trainer.json")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(one(args.child, args.hidden, args.layers, args.batch, args.steps, args.model)))
        return
    results = []
    for name in args.configs.split(","):
        extra = ["--model", args.model] if args.model else []
        out = subprocess.run([sys.executable, __file__, "--child", name, "--hidden", str(args.hidden), "--layers",
                              str(args.layers), "--batch", str(args.batch), "--steps", str(args.steps), *extra],
                             capture_output=True, text=True, check=True)
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    import torch

    from toolgym.harness.hardware import cpu_description, gemm_ceiling

    ceilings = {d: gemm_ceiling(torch.bfloat16 if d == "bf16" else torch.float32)
                for d in sorted({r["precision"] for r in results})}
    base = results[0]
    model = args.model or f"tiny h{args.hidden} x {args.layers} layers"
    print(f"machine: {cpu_description()}; ceiling " + ", ".join(f"{d} {g:.1f} GFLOP/s" for d, g in ceilings.items())
          + f" (matmul, {torch.get_num_threads()} threads, measured now)")
    print(f"one RL step, {base['train_tokens']} policy tokens ({base['padded_tokens']} tokens forwarded), "
          f"model {model} ({base['params'] / 1e6:.1f} M parameters), CPU:")
    for r in results:
        ceiling = ceilings[r["precision"]]
        r["mfu"] = 6 * r["params"] * r["train_tokens"] / r["step_s"] / 1e9 / ceiling
        r["executed_utilisation"] = r["executed_flops"] / r["step_s"] / 1e9 / ceiling
        print(f"  {r['config']:<22} {r['tokens_per_s']:8.0f} train tok/s ({r['step_s']:.2f} s/step, "
              f"{r['tokens_per_s'] / base['tokens_per_s']:.2f}x full, computes in {r['precision']}, MFU {r['mfu']:.0%}; "
              f"executed {r['executed_flops'] / r['step_s'] / 1e9:.0f} GFLOP/s = {r['executed_utilisation']:.0%})  "
              f"peak RSS {r['peak_rss_mb']:.0f} MB ({r['peak_rss_mb'] / base['peak_rss_mb']:.2f}x)  "
              f"trainable {r['trainable_params']:,}")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from common import write_results  # bench/common.py

    write_results(args.out, {"machine": cpu_description(), "ceilings_gflops": ceilings, "results": results})


if __name__ == "__main__":
    main()
