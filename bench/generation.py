"""CPU generation of a real model: toolgym's batched sampler vs transformers `generate`, and how
close it runs to this machine's own ceiling.

SmolLM2-135M-Instruct (the built-in `smollm2-135m`), batch 32, 300-token prompts, 64 new tokens
per row, every row sampling at temperature 1 until the length (no stop token can end a row early),
measured side by side in one run, best of `--repeats`:

- **the ceiling**: this machine's matmul throughput (GFLOP/s, all threads) in the dtype toolgym
  samples in, measured in the same run; **model-FLOP utilisation** (MFU) = new tokens/s x
  2 x parameters / ceiling (prefill and attention are not counted as model FLOPs: MFU is a floor);
- **one turn**: `HFPolicy.generate_batch` in the dtype the hardware computes fastest (bf16 only
  where it is native: `inference/hardware.py`; fp32 on an AVX2-only CPU) vs `model.generate` on the
  same prompts in fp32 (transformers' default) and, where bf16 is native, in bf16;
- **an episode of `--turns` turns**: each turn's prompt is the previous prompt, its completion and
  a 40-token observation, as in an agent episode. toolgym keeps each episode's keys and values
  between turns and computes only the new tokens; `generate` re-reads the whole history every
  turn; toolgym without episode ids (no reuse) isolates what the reuse is worth.

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

from toolgym.inference.hardware import choose_bf16, cpu_description, gemm_ceiling  # noqa: E402
from toolgym.inference.hf_policy import HFPolicy  # noqa: E402
from toolgym.inference.policy import SamplingParams  # noqa: E402
from toolgym.inference.pretrained import resolve_model  # noqa: E402

OBSERVATION = 40  # tokens appended after each completion (a tool result)


def random_rows(vocab: int, rows: int, length: int, seed: int) -> list[list[int]]:
    """`rows` random token sequences (ids away from the special tokens at both ends)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(200, vocab - 200, (rows, length), generator=gen).tolist()


def samplings(rows: int, new: int, vocab: int, turn: int) -> list[SamplingParams]:
    """Temperature-1 sampling of exactly `new` tokens per row (the stop id is out of the vocabulary)."""
    return [SamplingParams(max_new_tokens=new, temperature=1.0, seed=1000 * turn + i, stop_token_ids=(vocab + 7,)) for i in range(rows)]


def toolgym_episode(
    policy: HFPolicy, prompts: list[list[int]], new: int, turns: int, reuse: bool, observations: list[list[list[int]]]
) -> int:
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


def generate_episode(model, prompts: list[list[int]], new: int, turns: int, pad_id: int, observations: list[list[list[int]]]) -> int:
    """The same turns through `model.generate`, each turn re-reading the whole history."""
    current, tokens = torch.tensor(prompts), 0
    for turn in range(turns):
        with torch.no_grad():
            out = model.generate(
                input_ids=current,
                attention_mask=torch.ones_like(current),
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=new,
                min_new_tokens=new,
                pad_token_id=pad_id,
            )
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
    sys.stdout.reconfigure(line_buffering=True)  # progress shows in a log file too, line by line
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
    precision = choose_bf16("auto", "cpu")
    dtype = torch.bfloat16 if precision.dtype == "bf16" else torch.float32
    policy = HFPolicy(source, device="cpu", dtype=precision.dtype)
    vocab = policy.model.config.vocab_size
    params = sum(p.numel() for p in policy.model.parameters())
    fp32 = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    same = fp32 if dtype == torch.float32 else AutoModelForCausalLM.from_pretrained(source, dtype=dtype).eval()
    prompts = random_rows(vocab, args.batch, args.prompt, seed=0)
    observations = [random_rows(vocab, args.batch, OBSERVATION, seed=1 + t) for t in range(args.turns)]
    pad = policy.pad_id
    ceiling = gemm_ceiling(dtype)
    print(f"machine: {cpu_description()}")
    print(f"toolgym samples in {precision.dtype} ({precision.reason})")
    print(f"ceiling: {ceiling:.1f} GFLOP/s ({precision.dtype} matmul, {torch.get_num_threads()} threads, measured now)")
    print(
        f"{args.model} ({params / 1e6:.0f} M parameters): batch {args.batch}, {args.prompt}-token prompts, "
        f"{args.new} new tokens per turn, best of {args.repeats}"
    )

    def mfu(rate: float) -> float:
        return rate * 2 * params / 1e9 / ceiling

    one = {
        f"toolgym_{precision.dtype}": best_rate(lambda: toolgym_episode(policy, prompts, args.new, 1, False, observations), args.repeats),
        "generate_fp32": best_rate(lambda: generate_episode(fp32, prompts, args.new, 1, pad, observations), args.repeats),
    }
    if dtype != torch.float32:
        one["generate_bf16"] = best_rate(lambda: generate_episode(same, prompts, args.new, 1, pad, observations), args.repeats)
    if policy.whole_buffer_at > 0:
        # bf16 on a CPU: the same turns with attention over the filled KV columns only (a view the
        # bf16 matmul copies every step) instead of the whole buffer (`kv_cache.BufferLayer`)
        whole, policy.whole_buffer_at = policy.whole_buffer_at, 0.0
        one[f"toolgym_{precision.dtype}_filled_only"] = best_rate(
            lambda: toolgym_episode(policy, prompts, args.new, 1, False, observations), args.repeats
        )
        policy.whole_buffer_at = whole
    mine = one[f"toolgym_{precision.dtype}"]["tokens_per_s"]
    base = one["generate_fp32"]["tokens_per_s"]
    print("one turn:")
    for label, r in one.items():
        print(
            f"  {label:<22} {r['tokens_per_s']:6.0f} new tok/s  ({r['tokens_per_s'] / base:.2f}x generate fp32; "
            f"{r['tokens_per_s'] * 2 * params / 1e9:.1f} GFLOP/s of model work, MFU {mfu(r['tokens_per_s']):.0%})"
        )

    filled = one.get(f"toolgym_{precision.dtype}_filled_only")
    if filled:
        print(f"  attending over the whole KV buffer once half full: {mine / filled['tokens_per_s']:.2f}x the filled columns only")
    generate_label = f"generate_{precision.dtype}"
    multi = {
        "toolgym_episode_kv": best_rate(lambda: toolgym_episode(policy, prompts, args.new, args.turns, True, observations), args.repeats),
        "toolgym_no_reuse": best_rate(lambda: toolgym_episode(policy, prompts, args.new, args.turns, False, observations), args.repeats),
        generate_label: best_rate(lambda: generate_episode(same, prompts, args.new, args.turns, pad, observations), args.repeats),
    }
    base = multi[generate_label]["tokens_per_s"]
    print(f"an episode of {args.turns} turns (+{OBSERVATION} observation tokens after each):")
    for label, r in multi.items():
        print(
            f"  {label:<22} {r['tokens_per_s']:6.0f} new tok/s  ({r['tokens_per_s'] / base:.2f}x {generate_label}; "
            f"MFU {mfu(r['tokens_per_s']):.0%})"
        )
    print(
        f"  keeping each episode's KV cache: {multi['toolgym_episode_kv']['tokens_per_s'] / multi['toolgym_no_reuse']['tokens_per_s']:.2f}x "
        f"vs recomputing the history"
    )
    print(f"batch-{args.batch} generation: {mine:.0f} new tok/s = MFU {mfu(mine):.0%} of the {ceiling:.0f} GFLOP/s ceiling")
    write_results(
        args.out,
        {
            "args": vars(args),
            "machine": cpu_description(),
            "precision": precision.as_dict(),
            "ceiling_gflops": ceiling,
            "params": params,
            "mfu_one_turn": mfu(mine),
            "one_turn": one,
            "episode": multi,
            "ratio_vs_generate_fp32": mine / one["generate_fp32"]["tokens_per_s"],
        },
    )


if __name__ == "__main__":
    main()
