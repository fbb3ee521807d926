"""CPU generation of a real model: toolgym's batched sampler vs transformers `generate`.

SmolLM2-135M-Instruct (the built-in `smollm2-135m`), batch 32, 300-token prompts, 64 new tokens
per row, every row sampling at temperature 1 until the length (no stop token can end a row early),
measured side by side in one run, best of `--repeats`:

- **one turn**: `HFPolicy.generate_batch` (bf16 weights, the grouped-query CPU attention, a
  preallocated KV cache) vs `model.generate` on the same prompts in fp32 (transformers' default,
  the issue's baseline) and in bf16 (SDPA);
- **an episode of `--turns` turns**: each turn's prompt is the previous prompt, its completion and
  a 40-token observation, as in an agent episode. toolgym keeps each episode's keys and values
  between turns and computes only the new tokens; `generate` (bf16) re-reads the whole history
  every turn; toolgym without episode ids (no reuse) isolates what the reuse is worth.

Throughput is new (generated) tokens per second of wall time, prefill included.

    python bench/generation.py [--model smollm2-135m] [--batch 32] [--prompt 300] [--new 64] [--turns 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write_results  # noqa: E402  (bench/common.py)
from toolgym.harness.hf_policy import HFPolicy  # noqa: E402
from toolgym.harness.policy import SamplingParams  # noqa: E402
from toolgym.harness.pretrained import resolve_model  # noqa: E402

OBSERVATION = 40  # tokens appended after each completion (a tool result)


def random_rows(vocab: int, rows: int, length: int, seed: int) -> list[list[int]]:
    """`rows` random token sequences (ids away from the special tokens at both ends)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(200, vocab - 200, (rows, length), generator=gen).tolist()


def samplings(rows: int, new: int, vocab: int, turn: int) -> list[SamplingParams]:
    """Temperature-1 sampling of exactly `new` tokens per row (the stop id is out of the vocabulary)."""
    return [SamplingParams(max_new_tokens=new, temperature=1.0, seed=1000 * turn + i, stop_token_ids=(vocab + 7,))
            for i in range(rows)]


def toolgym_episode(policy: HFPolicy, prompts: list[list[int]], new: int, turns: int, reuse: bool,
                    observations: list[list[list[int]]]) -> int:
    """Run `turns` turns for every row through `generate_batch`; returns new tokens generated.
    With `reuse`, each row is an episode whose keys and values are kept between turns."""
    vocab = policy.model.config.vocab_size
    episodes = [f"bench-{i}" for i in range(len(prompts))] if reuse else None
    current, tokens = [list(p) for p in prompts], 0
    for turn in range(turns):
        gens = policy.generate_batch(current, samplings(len(current), new, vocab, turn), episodes)
        tokens += sum(len(g.token_ids) for g in gens)
        current = [c + list(g.token_ids) + observations[turn][i] for i, (c, g) in enumerate(zip(current, gens))]
    for e in episodes or []:
        policy.end_episode(e)
    return tokens


def generate_episode(model, prompts: list[list[int]], new: int, turns: int, pad_id: int,
                     observations: list[list[list[int]]]) -> int:
    """The same turns through `model.generate`, each turn re-reading the whole history."""
    current, tokens = torch.tensor(prompts), 0
    for turn in range(turns):
        with torch.no_grad():
            out = model.generate(input_ids=current, attention_mask=torch.ones_like(current), do_sample=True,
                                 temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=new, min_new_tokens=new,
                                 pad_token_id=pad_id)
        tokens += (out.shape[1] - current.shape[1]) * current.shape[0]
        current = torch.cat([out, torch.tensor([o for o in observations[turn]])], dim=1)
    return tokens


def best_rate(fn, repeats: int) -> dict:
    """New tokens per second of `fn()`, best of `repeats` (after one warm-up)."""
    fn()
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        tokens = fn()
        rates.append(tokens / (time.perf_counter() - start))
    return {"tokens_per_s": max(rates), "all": rates}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--prompt", type=int, default=300)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default="runs/bench/generation.json")
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    source = resolve_model(args.model)
    policy = HFPolicy(source, device="cpu", dtype="bf16")
    vocab = policy.model.config.vocab_size
    fp32 = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    bf16 = AutoModelForCausalLM.from_pretrained(source, dtype=torch.bfloat16).eval()
    prompts = random_rows(vocab, args.batch, args.prompt, seed=0)
    observations = [random_rows(vocab, args.batch, OBSERVATION, seed=1 + t) for t in range(args.turns)]
    pad = policy.pad_id
    print(f"{args.model} on the CPU ({torch.get_num_threads()} threads): batch {args.batch}, {args.prompt}-token prompts, "
          f"{args.new} new tokens per turn, best of {args.repeats}")

    one = {
        "toolgym_bf16": best_rate(lambda: toolgym_episode(policy, prompts, args.new, 1, False, observations),
                                  args.repeats),
        "generate_fp32": best_rate(lambda: generate_episode(fp32, prompts, args.new, 1, pad, observations),
                                   args.repeats),
        "generate_bf16": best_rate(lambda: generate_episode(bf16, prompts, args.new, 1, pad, observations),
                                   args.repeats),
    }
    base = one["generate_fp32"]["tokens_per_s"]
    print("one turn:")
    for label, r in one.items():
        print(f"  {label:<22} {r['tokens_per_s']:6.0f} new tok/s  ({r['tokens_per_s'] / base:.2f}x generate fp32)")
    print(f"  toolgym vs generate bf16 (same dtype): "
          f"{one['toolgym_bf16']['tokens_per_s'] / one['generate_bf16']['tokens_per_s']:.2f}x")

    multi = {
        "toolgym_episode_kv": best_rate(lambda: toolgym_episode(policy, prompts, args.new, args.turns, True,
                                                                observations), args.repeats),
        "toolgym_no_reuse": best_rate(lambda: toolgym_episode(policy, prompts, args.new, args.turns, False,
                                                              observations), args.repeats),
        "generate_bf16": best_rate(lambda: generate_episode(bf16, prompts, args.new, args.turns, pad, observations),
                                   args.repeats),
    }
    base = multi["generate_bf16"]["tokens_per_s"]
    print(f"an episode of {args.turns} turns (+{OBSERVATION} observation tokens after each):")
    for label, r in multi.items():
        print(f"  {label:<22} {r['tokens_per_s']:6.0f} new tok/s  ({r['tokens_per_s'] / base:.2f}x generate bf16)")
    print(f"  keeping each episode's KV cache: {multi['toolgym_episode_kv']['tokens_per_s'] / multi['toolgym_no_reuse']['tokens_per_s']:.2f}x "
          f"vs recomputing the history")
    write_results(args.out, {"args": vars(args), "one_turn": one, "episode": multi,
                             "ratio_vs_generate_fp32": one["toolgym_bf16"]["tokens_per_s"] / one["generate_fp32"]["tokens_per_s"]})


if __name__ == "__main__":
    main()
