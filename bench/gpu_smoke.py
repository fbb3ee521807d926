"""GPU smoke test for the `hf` policy, run as it is on a lent device machine (see ../shared/GPU.md).

Builds a Qwen2 model from a config (about 0.27 B parameters, random weights, bf16) with the tiny
policy's tokenizer (no download), then:
  1. runs the rollout runner on `records` held-out with 1, 32 and 128 concurrent episodes and
     prints generated tok/s and the outcome counts (an `infra_error` means the CUDA path broke);
  2. prints our batched sampling loop against transformers' `generate` at batch 1, 32 and 128.

    python bench/gpu_smoke.py [--device cuda] [--layers 24 --hidden 1024] [--out runs/bench/gpu_smoke.json]

On a CPU machine pass small sizes (`--device cpu --layers 2 --hidden 64`) to check the script.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import qwen2_from_config, write_results  # noqa: E402  (bench/common.py)

import toolgym  # noqa: E402
from harness import bench_vs_generate  # noqa: E402  (bench/harness.py)
from toolgym.harness import RolloutLimits, RolloutRunner, SamplingParams, TokenAgent  # noqa: E402
from toolgym.inference.hf_policy import HFPolicy  # noqa: E402
from toolgym.tasks import builtin_suite  # noqa: E402


def build_model(layers: int, hidden: int, device: str, dtype: str | None) -> HFPolicy:
    """A Qwen2-architecture model from a config with the tiny policy's tokenizer."""
    model, tokenizer = qwen2_from_config(layers, hidden)
    policy = HFPolicy(model, tokenizer, device=device, dtype=dtype, name=f"qwen2-{layers}x{hidden}")
    params = sum(p.numel() for p in model.parameters())
    print(f"model: {params / 1e6:.0f} M parameters on {policy.device} ({policy.dtype})")
    return policy


def rollouts(policy: HFPolicy, concurrency: int, max_new: int = 48) -> dict:
    """Episodes on records held-out with `concurrency` in flight: tok/s and outcomes."""
    agent = TokenAgent(policy, policy.tokenizer, SamplingParams(max_new_tokens=max_new, temperature=1.0))
    tasks = builtin_suite("records").split("held-out").tasks[:concurrency]
    runner = RolloutRunner(
        lambda: toolgym.make("records-v0").unwrapped,
        agent,
        concurrency=concurrency,
        progress=False,
        limits=RolloutLimits(max_turns=2, max_new_tokens_per_turn=max_new),
    )
    start = time.perf_counter()
    trajs = runner.run(tasks, seed=0)
    elapsed = time.perf_counter() - start
    tokens = sum(sum(t.loss_mask) for t in trajs)
    outcomes = Counter(t.outcome.value for t in trajs)
    errors = sorted({t.error for t in trajs if t.error})[:3]
    return {
        "episodes": len(trajs),
        "tokens": tokens,
        "seconds": elapsed,
        "tokens_per_s": tokens / elapsed,
        "outcomes": dict(outcomes),
        "errors": errors,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default=None, help="default: cuda if present")
    parser.add_argument("--dtype", default=None, help="default: bf16 on CUDA, fp32 on CPU")
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--out", default="runs/bench/gpu_smoke.json")
    args = parser.parse_args()
    policy = build_model(args.layers, args.hidden, args.device, args.dtype)
    results: dict = {"device": str(policy.device), "dtype": str(policy.dtype)}
    if policy.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for conc in (1, 32, 128):
        r = rollouts(policy, conc)
        results[f"rollouts_{conc}"] = r
        print(
            f"rollouts, {conc:3d} concurrent: {r['tokens_per_s']:.0f} tok/s ({r['tokens']} tokens, "
            f"{r['seconds']:.1f} s), outcomes {r['outcomes']}" + (f", errors {r['errors']}" if r["errors"] else "")
        )
    for batch in (1, 32, 128):
        r = bench_vs_generate(policy, batch=batch)
        results[f"vs_generate_{batch}"] = r
        print(
            f"batch {batch:3d}: toolgym {r['toolgym']['tokens_per_s']:.0f} tok/s, transformers generate "
            f"{r['generate']['tokens_per_s']:.0f} tok/s, ratio {r['ratio']:.2f}x"
        )
    if policy.device.type == "cuda":
        results["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
        print(f"peak GPU memory {results['peak_memory_gib']:.1f} GiB")
    write_results(args.out, results)


if __name__ == "__main__":
    main()
