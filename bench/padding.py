"""What the batch's padding savers are worth on real agent prompts: prefill in chunks of similar
length, identical prompts computed once, and decoding that drops the rows already done.

Three batches of real prompts, each run both ways side by side in one run (interleaved, best of
`--repeats`), on SmolLM2-135M-Instruct in the dtype the hardware computes fastest:

- **mixed lengths**: `--rows` BFCL held-out prompts (its function lists make prompts of about
  100 to 700 tokens) rendered with the campaign's compact template. Padded: one forward with
  every row padded to the longest; chunked: rows in chunks of similar length
  (`HFPolicy.chunk_prefill`).
- **a GRPO step**: `--tasks` BFCL train prompts, each `--group` times (a group's samples share
  their prompt). Each row computed: `share_identical_prompts` off; shared: each prompt once.
- **answers of different lengths**: the `--rows` held-out prompts, row i allowed between 16 and
  128 new tokens (spread evenly, as a BFCL evaluation's answers are: most short, some long).
  Every row decoded until the longest is done (`shrink_batch` off) vs the rows still running only,
  once at most half are (on).

The first two generate `--new` tokens per row (greedy, no stop); their figure is prompt tokens per
second of the whole call. The third's is new tokens per second. Each line gives the ratio.

    python bench/padding.py [--rows 64] [--tasks 8] [--group 6] [--new 16] [--repeats 2]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import first_prompt_ids, write_results  # noqa: E402  (bench/common.py)

import toolgym  # noqa: E402
from toolgym.inference.chat import load_template  # noqa: E402
from toolgym.inference.hardware import choose_bf16, cpu_description  # noqa: E402
from toolgym.inference.hf_policy import HFPolicy  # noqa: E402
from toolgym.inference.policy import SamplingParams  # noqa: E402
from toolgym.tasks.generators import builtin_suite  # noqa: E402


def bfcl_prompts(tokenizer, split: str, count: int) -> list[list[int]]:
    """The first `count` BFCL prompts of `split`, as a campaign renders them (compact template)."""
    env = toolgym.make("bfcl-v0").unwrapped
    return [first_prompt_ids(tokenizer, env, task) for task in builtin_suite("bfcl").split(split).tasks[:count]]


def timed(policy: HFPolicy, prompts: list[list[int]], new: int | list[int]) -> float:
    """Seconds for one `generate_batch` of `prompts` (greedy, exactly `new` tokens each, or
    `new[i]` for row i)."""
    vocab = policy.model.config.vocab_size
    budgets = new if isinstance(new, list) else [new] * len(prompts)
    sampling = [SamplingParams(max_new_tokens=b, temperature=0.0, stop_token_ids=(vocab + 7,)) for b in budgets]
    start = time.perf_counter()
    policy.generate_batch(prompts, sampling)
    return time.perf_counter() - start


def compare(policy: HFPolicy, prompts: list[list[int]], new: int | list[int], repeats: int, switch: str) -> dict:
    """Best-of-`repeats` seconds with `policy.<switch>` off and on, interleaved."""
    best = {"off": float("inf"), "on": float("inf")}
    for _ in range(repeats):
        for state in ("off", "on"):
            setattr(policy, switch, state == "on")
            best[state] = min(best[state], timed(policy, prompts, new))
    setattr(policy, switch, True)
    tokens = sum(new) if isinstance(new, list) else sum(len(p) for p in prompts)
    return {
        "rows": len(prompts),
        "tokens": tokens,
        "longest": max(len(p) for p in prompts),
        "seconds_off": best["off"],
        "seconds_on": best["on"],
        "tokens_per_s_off": tokens / best["off"],
        "tokens_per_s_on": tokens / best["on"],
        "speedup": best["off"] / best["on"],
    }


def main() -> None:
    """Run both comparisons and print them."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--group", type=int, default=6)
    parser.add_argument("--new", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default="runs/bench/padding.json")
    args = parser.parse_args()
    precision = choose_bf16("auto", "cpu")
    policy = HFPolicy("smollm2-135m", device="cpu", dtype=precision.dtype, max_batch=1024, batch_gb=16)
    policy.tokenizer.chat_template = load_template("qwen2.5-compact")
    print(f"{cpu_description()}; {precision.dtype} ({precision.reason})", flush=True)
    mixed = compare(policy, bfcl_prompts(policy.tokenizer, "held-out", args.rows), args.new, args.repeats, "chunk_prefill")
    print(
        f"mixed lengths, {mixed['rows']} BFCL prompts ({mixed['tokens']} tokens, longest {mixed['longest']}): "
        f"padded {mixed['tokens_per_s_off']:.0f} tok/s, chunked {mixed['tokens_per_s_on']:.0f} tok/s, "
        f"{mixed['speedup']:.2f}x",
        flush=True,
    )
    group = [p for p in bfcl_prompts(policy.tokenizer, "train", args.tasks) for _ in range(args.group)]
    grpo = compare(policy, group, args.new, args.repeats, "share_identical_prompts")
    print(
        f"GRPO step, {args.tasks} prompts x {args.group}: each row computed {grpo['tokens_per_s_off']:.0f} tok/s, "
        f"each prompt once {grpo['tokens_per_s_on']:.0f} tok/s, {grpo['speedup']:.2f}x",
        flush=True,
    )
    held_out = bfcl_prompts(policy.tokenizer, "held-out", args.rows)
    budgets = [16 + (i * 37) % 113 for i in range(len(held_out))]
    ragged = compare(policy, held_out, budgets, args.repeats, "shrink_batch")
    print(
        f"answers of 16-128 tokens, {len(held_out)} rows ({ragged['tokens']} new tokens): every row to the end "
        f"{ragged['tokens_per_s_off']:.0f} new tok/s, the running rows only {ragged['tokens_per_s_on']:.0f} new tok/s, "
        f"{ragged['speedup']:.2f}x",
        flush=True,
    )
    write_results(
        args.out,
        {
            "cpu": cpu_description(),
            "dtype": precision.dtype,
            "new_tokens": args.new,
            "mixed_lengths": mixed,
            "grpo_step": grpo,
            "ragged_answers": ragged,
        },
    )


if __name__ == "__main__":
    main()
