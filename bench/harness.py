"""Harness benchmarks, measured side by side in one run (these machines are noisy).

1. Harness overhead per turn: a null policy that returns a fixed, valid tool call, against the
   in-process records environment. Per-turn time = time between consecutive policy calls of one
   episode (env step, thread hop, message bookkeeping). Target: p50 <= 1 ms.
2. HF backend with the tiny policy: generated tokens/s with 32 concurrent episodes (batched)
   vs the same episodes one at a time. Target: >= 3x.

    python bench/harness.py [--out runs/bench/harness.json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

import toolgym
from toolgym.harness import FixedAgent, RolloutLimits, RolloutRunner, SamplingParams, TokenAgent
from toolgym.harness.hf_policy import HFPolicy
from toolgym.harness.tiny import build_tiny_policy
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
    runner = RolloutRunner(lambda: toolgym.make("records-v0").unwrapped, agent, concurrency=1, progress=False,
                           limits=RolloutLimits(max_turns=turns))
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
        runner = RolloutRunner(lambda: toolgym.make("records-v0").unwrapped, agent, concurrency=conc,
                               progress=False, limits=limits)
        start = time.perf_counter()
        trajs = runner.run(tasks, seed=0)
        elapsed = time.perf_counter() - start
        tokens = sum(sum(t.loss_mask) for t in trajs)
        out[label] = {"seconds": elapsed, "tokens": tokens, "tokens_per_s": tokens / elapsed}
    out["speedup"] = out["concurrent_32"]["tokens_per_s"] / out["one_at_a_time"]["tokens_per_s"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/bench/harness.json")
    args = parser.parse_args()
    overhead = bench_overhead()
    print(f"harness overhead per turn (null policy, {overhead['turns']} turns): "
          f"p50 {overhead['p50_ms']:.3f} ms, p95 {overhead['p95_ms']:.3f} ms  (target p50 <= 1 ms)")
    batching = bench_batching()
    a, b = batching["one_at_a_time"], batching["concurrent_32"]
    print(f"tiny HF policy: one at a time {a['tokens_per_s']:.0f} tok/s ({a['tokens']} tokens, {a['seconds']:.1f} s); "
          f"32 concurrent {b['tokens_per_s']:.0f} tok/s ({b['tokens']} tokens, {b['seconds']:.1f} s); "
          f"ratio {batching['speedup']:.1f}x  (target >= 3x)")
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"overhead": overhead, "batching": batching}, indent=2))
    print(f"written to {path}")


if __name__ == "__main__":
    main()
