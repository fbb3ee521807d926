"""Harness benchmarks, measured side by side in one run (these machines are noisy).

1. Harness overhead per turn: a null policy that returns a fixed, valid tool call, against the
   in-process records environment. Per-turn time = time between consecutive policy calls of one
   episode (env step, thread hop, message bookkeeping). Target: p50 <= 1 ms.
2. HF backend with the tiny policy: generated tokens/s with 32 concurrent episodes (batched)
   vs the same episodes one at a time. Target: >= 3x.
3. Our HF policy's batched sampling loop vs transformers' own `generate` on the same model,
   batch and lengths (sampling, no early stop). Target: >= 1x at batch 128.
4. More episodes at once than a batch holds (an evaluation of 314 BFCL entries, 128 at a time,
   where an fp32 KV cache of 2 GB holds 94 rows): batches refilled with the episodes that start
   as answered ones end (`HFPolicy.refill_batches`) against a batch of the leftovers alone,
   interleaved: batches run, wall time, their ratio.

    python bench/harness.py [--out runs/bench/harness.json] [--device cuda --dtype bf16 --model DIR]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_results  # noqa: E402  (bench/common.py)

import toolgym
from toolgym.harness import FixedAgent, RolloutLimits, RolloutRunner, SamplingParams, TokenAgent
from toolgym.inference.hf_policy import HFPolicy
from toolgym.inference.tiny import build_tiny_policy
from toolgym.tasks import builtin_suite


class StampingAgent(FixedAgent):
    """A null policy that records when each turn asks it for an action."""

    def __init__(self) -> None:
        super().__init__('<tool_call>{"name": "get", "arguments": {"record_id": "P01"}}</tool_call>', name="null")
        self.stamps: dict[int, list[float]] = {}

    async def respond(self, messages, tools, task):
        self.stamps.setdefault(id(messages), []).append(time.perf_counter())
        return self.text


def bench_overhead(episodes: int = 20, turns: int = 100) -> dict:
    agent = StampingAgent()
    tasks = builtin_suite("records").tasks[:episodes]
    runner = RolloutRunner(
        lambda: toolgym.make("records-v0").unwrapped, agent, concurrency=1, progress=False, limits=RolloutLimits(max_turns=turns)
    )
    runner.run(tasks)
    gaps = np.concatenate([np.diff(s) for s in agent.stamps.values()]) * 1000
    return {"turns": int(gaps.size), "p50_ms": float(np.percentile(gaps, 50)), "p95_ms": float(np.percentile(gaps, 95))}


def bench_batching(episodes: int = 32, max_new: int = 32, turns: int = 2) -> dict:
    policy = HFPolicy(str(build_tiny_policy()), name="tiny")
    agent = TokenAgent(policy, policy.tokenizer, SamplingParams(max_new_tokens=max_new))
    tasks = builtin_suite("records").tasks[:episodes]
    limits = RolloutLimits(max_turns=turns, max_new_tokens_per_turn=max_new)
    out = {}
    for label, conc in (("one_at_a_time", 1), ("concurrent_32", 32)):
        runner = RolloutRunner(lambda: toolgym.make("records-v0").unwrapped, agent, concurrency=conc, progress=False, limits=limits)
        start = time.perf_counter()
        trajs = runner.run(tasks, seed=0)
        elapsed = time.perf_counter() - start
        tokens = sum(sum(t.loss_mask) for t in trajs)
        out[label] = {"seconds": elapsed, "tokens": tokens, "tokens_per_s": tokens / elapsed}
    out["speedup"] = out["concurrent_32"]["tokens_per_s"] / out["one_at_a_time"]["tokens_per_s"]
    return out


def bench_refill(policy: HFPolicy, episodes: int = 120, concurrency: int = 48, rows: int = 32, max_new: int = 32, repeats: int = 2) -> dict:
    """Single-turn episodes, `concurrency` at a time, at most `rows` a batch: each arm's batches
    and seconds (best of `repeats`, arms interleaved)."""
    agent = TokenAgent(policy, policy.tokenizer, SamplingParams(max_new_tokens=max_new, temperature=1.0))
    tasks = builtin_suite("records").tasks[:episodes]
    limits = RolloutLimits(max_turns=1, max_new_tokens_per_turn=max_new)
    saved = policy.max_batch, policy.refill_batches
    out: dict = {"episodes": episodes, "concurrency": concurrency, "rows_per_batch": rows, "max_new": max_new}
    try:
        policy.max_batch = rows
        for _ in range(repeats):
            for label, refill in (("leftovers_alone", False), ("refilled", True)):
                policy.refill_batches = refill
                policy.batch_sizes.clear()
                runner = RolloutRunner(
                    lambda: toolgym.make("records-v0").unwrapped, agent, concurrency=concurrency, progress=False, limits=limits
                )
                start = time.perf_counter()
                runner.run(tasks, seed=0)
                elapsed = time.perf_counter() - start
                best = out.get(label)
                if best is None or elapsed < best["seconds"]:
                    out[label] = {"seconds": elapsed, "batches": len(policy.batch_sizes), "batch_sizes": list(policy.batch_sizes)}
    finally:
        policy.max_batch, policy.refill_batches = saved
    out["time_ratio"] = out["leftovers_alone"]["seconds"] / out["refilled"]["seconds"]
    return out


def bench_vs_generate(policy: HFPolicy, batch: int = 128, prompt_len: int = 64, new_tokens: int = 32, repeats: int = 3) -> dict:
    """tok/s of `policy.generate_batch` and of `model.generate` on identical prompts and lengths."""
    import torch

    vocab = policy.model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(10, vocab - 10, (batch, prompt_len), generator=gen)
    never = (vocab + 7,)  # a stop id no sample can hit: every row generates exactly `new_tokens`
    samplings = [SamplingParams(max_new_tokens=new_tokens, temperature=1.0, seed=i, stop_token_ids=never) for i in range(batch)]
    ids = prompts.to(policy.device)
    attn = torch.ones_like(ids)

    def ours() -> int:
        return sum(len(g.token_ids) for g in policy.generate_batch(prompts.tolist(), samplings))

    def theirs() -> int:
        with torch.no_grad():
            out = policy.model.generate(
                input_ids=ids,
                attention_mask=attn,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                pad_token_id=policy.pad_id,
            )
        return int((out.shape[1] - prompt_len) * batch)

    def sync() -> None:
        if policy.device.type == "cuda":
            torch.cuda.synchronize()

    result = {"batch": batch, "prompt_len": prompt_len, "new_tokens": new_tokens, "device": str(policy.device), "dtype": str(policy.dtype)}
    for label, fn in (("toolgym", ours), ("generate", theirs)):
        fn()  # warm-up
        rates = []
        for _ in range(repeats):  # interleaved would be fairer still; best-of-N tames the noise
            sync()
            start = time.perf_counter()
            tokens = fn()
            sync()
            rates.append(tokens / (time.perf_counter() - start))
        result[label] = {"tokens_per_s": max(rates), "all": rates}
    result["ratio"] = result["toolgym"]["tokens_per_s"] / result["generate"]["tokens_per_s"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/bench/harness.json")
    parser.add_argument("--model", default=None, help="model dir (default: the tiny policy)")
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--only-generate", action="store_true", help="run only the comparison with generate")
    parser.add_argument("--only-refill", action="store_true", help="run only the refilled-batches comparison")
    args = parser.parse_args()
    policy = HFPolicy(args.model or str(build_tiny_policy()), device=args.device, dtype=args.dtype)
    results = {}
    refill = bench_refill(policy)
    a, b = refill["leftovers_alone"], refill["refilled"]
    print(
        f"{refill['episodes']} episodes, {refill['concurrency']} at a time, {refill['rows_per_batch']} rows a batch: "
        f"leftovers alone {a['batches']} batches {a['seconds']:.1f} s; refilled {b['batches']} batches "
        f"{b['seconds']:.1f} s; time ratio {refill['time_ratio']:.2f}x"
    )
    results["refill"] = refill
    if args.only_refill:
        write_results(args.out, results)
        return
    for batch in (1, 32, 128):
        r = bench_vs_generate(policy, batch=batch)
        results[f"vs_generate_{batch}"] = r
        print(
            f"batch {batch:3d} on {r['device']} ({r['dtype']}): toolgym {r['toolgym']['tokens_per_s']:.0f} tok/s, "
            f"transformers generate {r['generate']['tokens_per_s']:.0f} tok/s, ratio {r['ratio']:.2f}x"
            + ("  (target >= 1x)" if batch == 128 else "")
        )
    if args.only_generate:
        write_results(args.out, results)
        return
    overhead = bench_overhead()
    print(
        f"harness overhead per turn (null policy, {overhead['turns']} turns): "
        f"p50 {overhead['p50_ms']:.3f} ms, p95 {overhead['p95_ms']:.3f} ms  (target p50 <= 1 ms)"
    )
    batching = bench_batching()
    a, b = batching["one_at_a_time"], batching["concurrent_32"]
    print(
        f"tiny HF policy: one at a time {a['tokens_per_s']:.0f} tok/s ({a['tokens']} tokens, {a['seconds']:.1f} s); "
        f"32 concurrent {b['tokens_per_s']:.0f} tok/s ({b['tokens']} tokens, {b['seconds']:.1f} s); "
        f"ratio {batching['speedup']:.1f}x  (target >= 3x)"
    )
    write_results(args.out, {"overhead": overhead, "batching": batching, **results})


if __name__ == "__main__":
    main()
