"""One RL step, one SFT step and one RL step with an SFT anchor of the Learner on a fixed global batch, in 1 process or under
torchrun (each rank takes its contiguous shard). Rank 0 writes the final weights and losses.

    python tests/_ddp_step.py OUT.pt                                  # one process
    python -m torch.distributed.run --nproc_per_node 2 tests/_ddp_step.py OUT.pt [ddp|fsdp2]
"""

import os
import sys

import torch
import torch.distributed as dist

from toolgym.inference.tiny import build_tiny_policy
from toolgym.trainers.batching import TokenBatch, select
from toolgym.trainers.learner import Learner, LearnerConfig


def global_batch(vocab: int) -> TokenBatch:
    g = torch.Generator().manual_seed(0)
    lengths = [40, 33, 57, 21, 48, 60, 29, 52]
    width = max(lengths)
    ids = torch.zeros((len(lengths), width), dtype=torch.long)
    attention = torch.zeros_like(ids)
    mask = torch.zeros((len(lengths), width - 1))
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.randint(10, vocab, (n,), generator=g)
        attention[i, :n] = 1
        mask[i, n // 3 : n - 1] = 1.0  # the "policy" tokens: a different share of each row
    adv = torch.randn(len(lengths), generator=g)
    return TokenBatch(ids, attention, mask, torch.zeros_like(mask), adv)


def main(out: str, parallel: str = "ddp") -> None:
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(build_tiny_policy()), dtype=torch.float32)
    batch = global_batch(model.config.vocab_size)
    rows = list(range(batch.input_ids.shape[0]))
    share = len(rows) // world
    mine = select(batch, rows[rank * share : (rank + 1) * share])
    # a small token budget: several micro-batches per rank, a different number on each rank
    learner = Learner(model, LearnerConfig(lr=1e-2, token_budget=128, loss="ppo", agg="token-mean", parallel=parallel))
    reductions: list[int] = []  # DDP: gradient buckets all-reduced, per step
    if parallel == "ddp" and world > 1:
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        def counting_allreduce(state, bucket):
            reductions[-1] += 1
            return allreduce_hook(state, bucket)

        learner.forward_model.register_comm_hook(None, counting_allreduce)
    reductions.append(0)
    rl = learner.rl_step(mine)
    after_rl = learner.full_state_dict()  # FSDP2: gathered from the shards onto rank 0
    reductions.append(0)
    sft = learner.sft_step(mine)
    state = learner.full_state_dict()
    # an RL step anchored by demonstrations (here the same rows): PPO-ptx's extra NLL backward
    reductions.append(0)
    anchored = learner.rl_step(mine, anchor=mine, anchor_coef=0.5)
    after_anchor = learner.full_state_dict()
    if rank == 0:
        torch.save(
            {
                "after_rl": after_rl,
                "state": state,
                "after_anchor": after_anchor,
                "rl_loss": rl["loss"],
                "sft_loss": sft["sft_loss"],
                "anchor_nll": anchored["anchor_nll"],
                "grad_norm": rl["grad_norm"],
                "world": world,
                "reductions": reductions,
                "micro_batches": [rl["micro_batches"], sft.get("micro_batches"), anchored["micro_batches"]],
            },
            out,
        )
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
