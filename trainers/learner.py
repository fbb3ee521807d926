"""The update: masked policy-gradient (or SFT) steps on a model, in micro-batches by token budget.

`Learner` owns the optimizer. One `rl_step` takes a packed batch of trajectories with their
advantages: the model's log-probabilities of the sampled tokens are recomputed (the mismatch
with the rollout logprobs is measured), the registered loss of `core_algos` is applied to policy
tokens only, gradients accumulate over micro-batches with the normalisation of the whole batch,
then one optimizer step per mini-batch. `sft_step` is the same path with a masked NLL loss, so
SFT trains exactly the tokens RL later trains.

The policy that samples (`HFPolicy`) shares this model object: after a step its next batch
already uses the new weights (in-process weight sync). LoRA goes through `peft`.
"""

from __future__ import annotations

import copy
import time
from typing import Any

import torch

from toolgym.inference.hardware import choose_bf16
from toolgym.trainers import core_algos as ca
from toolgym.trainers.batching import TokenBatch, micro_batches, select, sequence_logprobs
from toolgym.trainers.learner_config import DEFAULT_TIS_CAP, LOSS_DEFAULTS, LearnerConfig, LoraSettings, loss_settings  # noqa: F401  (re-exported)
from toolgym.trainers.memory import auto_token_budget, check_fits, release_memory


def apply_lora(model: torch.nn.Module, lora: LoraSettings) -> torch.nn.Module:
    """Wrap `model` with LoRA adapters (peft); only the adapters train."""
    from peft import LoraConfig, get_peft_model

    names = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    targets = [t for t in lora.target_modules if t in names]
    if not targets:
        raise ValueError(f"LoRA target modules {lora.target_modules} match no module of the model")
    return get_peft_model(
        model, LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=targets, task_type="CAUSAL_LM")
    )


def _micro_weight(agg: str, mask: torch.Tensor, total_tokens: float, total_seqs: float, total_nonempty: float) -> float:
    """The share of the whole batch's normaliser one micro-batch carries (so gradients accumulated
    over micro-batches equal the gradient of the loss over the whole batch)."""
    if agg == "token-mean":
        return float(mask.sum()) / max(total_tokens, 1.0)
    if agg == "seq-mean-token-mean":
        return float((mask.sum(1) > 0).sum()) / max(total_nonempty, 1.0)
    return float(mask.shape[0]) / max(total_seqs, 1.0)


class Learner:
    """Optimizer and update steps for one model (see the module docstring)."""

    def __init__(
        self,
        model: torch.nn.Module,
        config: LearnerConfig | None = None,
        off_policy: bool = False,
        generation_budget: int | None = None,
        temperature: float = 1.0,
    ) -> None:
        """`off_policy`: the batches are sampled by something other than this model (a copy in
        another dtype, stale weights, a server): `tis_cap: auto` corrects for it.
        `generation_budget`: policy tokens an episode may sample at most, Dr.GRPO's constant
        normaliser when `agg_norm` is not set.
        `temperature`: the rollouts' sampling temperature. The RL losses train the policy that
        sampled them, softmax(logits / T), as verl does; the SFT loss and the anchor's stay at 1."""
        self.config = config or LearnerConfig()
        self.model = model
        self.off_policy = off_policy
        self.generation_budget = generation_budget
        self.temperature = temperature
        self.loss = loss_settings(self.config)
        self.ref_model = None
        if self.config.kl_beta > 0 and self.config.lora is None:
            self.ref_model = copy.deepcopy(model).eval()  # frozen reference (LoRA: the base with adapters off)
            for p in self.ref_model.parameters():
                p.requires_grad_(False)
        self.device = next(model.parameters()).device
        # `auto` is resolved once, from the hardware: bf16 autocast on an AVX2-only CPU would be
        # emulated, about 50x slower than fp32 (inference/hardware.py)
        self.precision = choose_bf16(self.config.autocast, self.device)
        # padding-free micro-batches (trainers/packing.py): measured on the CPU, where they made an
        # SFT step 1.4x faster (bench/trainer.py --step sft); CUDA keeps padded batches (`auto`)
        self.packing = self.config.packing if self.config.packing != "auto" else self.device.type == "cpu"
        # Data-parallel under torchrun: each rank passes its shard of the global batch; gradients
        # are averaged over ranks (DDP all-reduce, FSDP2 reduce-scatter) and the loss normalisers
        # are the global batch's (see _totals).
        self.world = dist_world()
        self.sharded = self.world > 1 and self.config.parallel == "fsdp2"
        self.forward_model: torch.nn.Module = model
        if self.sharded:
            shard_model(model, self.device)  # before the optimizer: it must hold the sharded parameters
        elif self.world > 1:
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device.index] if self.device.type == "cuda" else None
            self.forward_model = DistributedDataParallel(model, device_ids=ids)
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=self.config.lr, betas=self.config.betas, weight_decay=self.config.weight_decay)
        self.last_micro_batches, self.last_token_budget = 0, 0

    # ---- shared -----------------------------------------------------------------------------

    def _micro_batches(self, batch: TokenBatch, what: str) -> list[list[int] | None]:
        """Rows grouped into micro-batches within the token budget (`auto`: sized from the model
        and the free memory), rows that share a prefix together; refuses, with a message, a
        micro-batch that would not fit."""
        budget = self.config.token_budget
        if budget == "auto":
            budget = auto_token_budget(self.model, self.device)
        lengths = batch.attention.sum(1).tolist()
        sequences = [row[:n] for row, n in zip(batch.input_ids.tolist(), lengths)]
        groups = micro_batches(lengths, budget, sequences if self.world == 1 else None)
        check_fits(self.model, self.device, max(len(g) * max(lengths[i] for i in g) for g in groups), what)
        self.last_micro_batches, self.last_token_budget = len(groups), budget  # for the step's metrics
        return self._even(groups)

    def _precision(self):
        """The autocast context of forward passes (`autocast: bf16`), or none."""
        from contextlib import nullcontext

        if self.precision.dtype != "bf16":
            return nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)

    def _ref_logp(self, mb: TokenBatch) -> torch.Tensor:
        with torch.no_grad(), self._precision():
            if self.ref_model is not None:
                return sequence_logprobs(
                    self.ref_model, mb.input_ids, mb.attention, mask=mb.mask, temperature=self.temperature, pack=self.packing
                )[0]
            with self.model.disable_adapter():  # peft: the base model is the reference
                return sequence_logprobs(
                    self.model, mb.input_ids, mb.attention, mask=mb.mask, temperature=self.temperature, pack=self.packing
                )[0]

    def _totals(self, *values: float, op: str = "sum") -> list[float]:
        """Batch-wide normalisers, summed (or their `op="max"`) over ranks when data-parallel."""
        if self.world == 1:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        ops = torch.distributed.ReduceOp
        torch.distributed.all_reduce(t, op=ops.MAX if op == "max" else ops.SUM)
        return t.tolist()

    def _sync_scope(self, last: bool) -> Any:
        """Where one micro-batch's forward and backward run: data-parallel ranks reduce gradients
        only in the last micro-batch of an optimizer step. DDP decides at forward time whether the
        backward reduces (`no_sync` around the backward alone still reduces every micro-batch),
        so the scope holds both."""
        from contextlib import nullcontext

        if self.world == 1:
            return nullcontext()
        if self.sharded:
            self.model.set_requires_gradient_sync(last)
            return nullcontext()
        return nullcontext() if last else self.forward_model.no_sync()

    def _backward(self, loss: torch.Tensor) -> None:
        """Backward of one micro-batch (inside its `_sync_scope`). DDP averages gradients over
        ranks: the loss is scaled back up so that the step sums the ranks' shares."""
        (loss * self.world if self.world > 1 else loss).backward()

    def _even(self, groups: list[list[int]]) -> list[list[int] | None]:
        """FSDP2 gathers parameters in every forward, a collective: every rank must run as many
        micro-batches. Ranks with fewer get `None` entries (a zero-weight pass on one row)."""
        if not self.sharded:
            return list(groups)
        (most,) = self._totals(float(len(groups)), op="max")
        return list(groups) + [None] * (int(most) - len(groups))

    def _idle_pass(self, batch: TokenBatch, last: bool) -> None:
        """A zero-weight forward and backward on one row: keeps FSDP2's collectives in step with
        ranks that have more micro-batches (see `_even`)."""
        with self._sync_scope(last):
            self._backward(self._logprobs(select(batch, [0]))[0].sum() * 0.0)

    def shard(self, batch: TokenBatch) -> TokenBatch:
        """This rank's contiguous share of a global batch (the whole batch in one process)."""
        if self.world == 1:
            return batch
        rank, rows = torch.distributed.get_rank(), batch.input_ids.shape[0]
        bounds = [rows * r // self.world for r in range(self.world + 1)]
        return select(batch, list(range(bounds[rank], bounds[rank + 1])))

    def restart_optimizer(self, lr: float) -> None:
        """A fresh optimizer state at learning rate `lr` (a new training stage: SFT, then RL)."""
        self.optimizer.state.clear()
        self.set_lr(lr)

    def set_lr(self, lr: float) -> None:
        """The learning rate of the next updates (a schedule's step), the optimizer state kept."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def checkpoint_state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(model, optimizer) state dicts of the whole model, on the CPU. Data-parallel: a
        collective every rank calls; rank 0 gets them (FSDP2 gathers the shards)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

        if self.world == 1:  # live references: the caller saves them right away
            return self.model.state_dict(), self.optimizer.state_dict()
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return (get_model_state_dict(self.model, options=options), get_optimizer_state_dict(self.model, self.optimizer, options=options))

    def load_checkpoint_state(self, model_state: dict[str, Any], optim_state: dict[str, Any]) -> None:
        """Load what `checkpoint_state` returned (every rank passes the whole dicts)."""
        if self.world == 1:
            self.model.load_state_dict(model_state)
            self.optimizer.load_state_dict(optim_state)
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

        options = StateDictOptions(full_state_dict=True)
        set_model_state_dict(self.model, model_state, options=options)
        set_optimizer_state_dict(self.model, self.optimizer, optim_state, options=options)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The whole model's weights on the CPU (sharded: gathered, a collective every rank calls;
        only rank 0 gets them, the others an empty dict)."""
        if not self.sharded:
            return {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def _logprobs(self, mb: TokenBatch, with_entropy: bool = False, tempered: bool = True):
        # Only policy tokens are computed (the rest has no loss). DDP expects one forward per
        # backward: the shared-prefix path (two forwards) is for one process. `tempered`: the
        # sampling policy's logprobs (RL); the NLL of demonstrations is the model's own (T = 1).
        with self._precision():
            return sequence_logprobs(
                self.forward_model,
                mb.input_ids,
                mb.attention,
                with_entropy=with_entropy,
                share_prefix=self.world == 1,
                mask=mb.mask,
                temperature=self.temperature if tempered else 1.0,
                pack=self.packing,
            )

    def _reduce_stats(self, sums: dict[str, float], weights: dict[str, float]) -> None:
        if self.world == 1:
            return
        import torch.distributed as dist

        for k in sorted(sums):
            op = dist.ReduceOp.MIN if k == "ratio_min" else dist.ReduceOp.MAX if k == "ratio_max" else dist.ReduceOp.SUM
            pair = torch.tensor([sums[k], weights.get(k, 0.0)], dtype=torch.float64, device=self.device)
            dist.all_reduce(pair, op=op)
            sums[k] = float(pair[0])
            if k in weights:
                weights[k] = float(pair[1])

    def _step(self) -> float:
        params = [p for p in self.model.parameters() if p.requires_grad]
        norm = torch.nn.utils.clip_grad_norm_(params, self.config.grad_clip)
        norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)  # sharded: a DTensor
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    # ---- RL -----------------------------------------------------------------------------------

    def rl_step(self, batch: TokenBatch, anchor: TokenBatch | None = None, anchor_coef: float = 0.0) -> dict[str, Any]:
        """One policy-gradient update on `batch`; returns the step's metrics. With `anchor`
        (demonstrations) and `anchor_coef` > 0, every optimizer step also minimises `anchor_coef`
        times their token-mean NLL (InstructGPT's PPO-ptx, with the SFT data as the anchor)."""
        c = self.config
        anchored = anchor is not None and anchor_coef > 0
        start = time.perf_counter()
        batch = batch.to(self.device)
        lengths = batch.attention.sum(1).tolist()
        chunks = _split(list(range(len(lengths))), c.updates_per_batch)
        old: dict[int, torch.Tensor] = {}
        if c.updates_per_batch > 1:  # later mini-batches need the logprobs from before any update
            with torch.no_grad():
                for group in self._micro_batches(batch, "RL step"):
                    logp, _ = self._logprobs(select(batch, group if group is not None else [0]))
                    for row, i in enumerate(group or []):
                        old[i] = logp[row]
        sums: dict[str, float] = {}
        weights_seen: dict[str, float] = {}
        gap_max = 0.0
        norms, anchor_nll = [], []
        agg, norm, cap = self.loss["agg"], self._agg_norm(batch), self.tis_cap()
        eps_low = self.loss["eps_low"]
        if eps_low is None and c.loss != "cispo":
            eps_low = 1.0  # no lower clip: the ratio's floor is 0
        for chunk in chunks:
            sub = select(batch, chunk)
            total_tokens, total_seqs, nonempty = self._totals(
                float(sub.mask.sum()), float(sub.mask.shape[0]), float((sub.mask.sum(1) > 0).sum())
            )
            groups = self._micro_batches(sub, "RL step")
            for n_group, group in enumerate(groups):
                if group is None:
                    self._idle_pass(sub, last=not anchored and n_group == len(groups) - 1)
                    continue
                mb = select(sub, group)
                with self._sync_scope(last=not anchored and n_group == len(groups) - 1):
                    logp, entropy = self._logprobs(mb, with_entropy=True)
                    if old:  # each row's logprobs from the micro-batch it fell in then, to this one's width
                        old_logp = torch.stack([_fit(old[chunk[g]], logp.shape[1]) for g in group]).to(logp.device)
                    else:
                        old_logp = logp.detach()
                    adv = ca.broadcast(mb.advantages, mb.mask)
                    # tokens the rollout's tool exploration forced have no behaviour logprob (NaN):
                    # counted as on-policy, so the reward can raise a tool the policy rarely picks
                    rollout_logp = torch.where(torch.isnan(mb.rollout_logp), old_logp.detach(), mb.rollout_logp)
                    # the behaviour policy's logprobs correct what the sampler did differently
                    tis = ca.truncated_is_weights(old_logp, rollout_logp, cap) if cap else None
                    loss, stats = ca.policy_loss(
                        c.loss,
                        logp,
                        old_logp,
                        adv,
                        mb.mask,
                        eps_low=eps_low,
                        eps_high=self.loss["eps_high"],
                        agg=agg,
                        norm=norm,
                        weights=tis,
                    )
                    if c.kl_beta > 0:
                        kl = ca.aggregate(ca.kl_k3(logp, self._ref_logp(mb)), mb.mask, agg, norm)
                        loss = loss + c.kl_beta * kl
                        stats["kl"] = float(kl.detach())
                    w = _micro_weight(agg, mb.mask, total_tokens, total_seqs, nonempty)
                    self._backward(loss * w)
                gap = ca.mismatch_stats(old_logp, rollout_logp, mb.mask, cap)
                gap_max = max(gap_max, gap.pop("logprob_gap_max"))
                stats.update(loss=float(loss.detach()), entropy=float((entropy * mb.mask).sum() / mb.mask.sum().clamp(min=1)), **gap)
                for k, v in stats.items():
                    if k in ("ratio_min",):
                        sums[k] = min(sums.get(k, v), v)
                    elif k in ("ratio_max",):
                        sums[k] = max(sums.get(k, v), v)
                    else:
                        sums[k] = sums.get(k, 0.0) + v * w / len(chunks)
                        weights_seen[k] = weights_seen.get(k, 0.0) + w / len(chunks)
            if anchored:  # after the RL micro-batches: the step's metrics describe those
                micro = (self.last_micro_batches, self.last_token_budget)
                anchor_nll.append(self._nll_pass(anchor, anchor_coef, "RL step's SFT anchor")[0])
                self.last_micro_batches, self.last_token_budget = micro
            norms.append(self._step())
        self._reduce_stats(sums, weights_seen)
        out = {k: (v / weights_seen[k] if k in weights_seen and weights_seen[k] > 0 else v) for k, v in sums.items()}
        release_memory()
        elapsed = time.perf_counter() - start
        out.update(
            logprob_gap_max=gap_max,
            tis_cap=cap or 0.0,
            grad_norm=max(norms),
            train_tokens=batch.tokens,
            train_seconds=elapsed,
            train_tokens_per_s=batch.tokens / max(elapsed, 1e-9),
            micro_batches=self.last_micro_batches,
            token_budget=self.last_token_budget,
        )
        if anchored:
            out.update(anchor_nll=sum(anchor_nll) / len(anchor_nll), anchor_coef=anchor_coef, anchor_tokens=int(anchor.mask.sum()))
        return out

    def tis_cap(self) -> float | None:
        """The truncated-importance-sampling cap in force (`auto`: on only when off-policy)."""
        cap = self.config.tis_cap
        if cap == "auto":
            return DEFAULT_TIS_CAP if self.off_policy else None
        return cap

    def _agg_norm(self, batch: TokenBatch) -> float | None:
        """Dr.GRPO's constant for `seq-mean-token-sum-norm`: the configured one, else the
        generation budget, else the longest response of the whole batch (never a micro-batch's
        padded width, which would make the loss depend on how the batch was split)."""
        if self.loss["agg"] != "seq-mean-token-sum-norm":
            return self.config.agg_norm
        if self.config.agg_norm:
            return self.config.agg_norm
        if self.generation_budget:
            return float(self.generation_budget)
        (longest,) = self._totals(float(batch.mask.sum(1).max()) if batch.mask.numel() else 1.0, op="max")
        return max(longest, 1.0)

    # ---- SFT ----------------------------------------------------------------------------------

    def _nll_pass(self, batch: TokenBatch, coef: float, what: str) -> tuple[float, float, float]:
        """Backward of `coef` times the token-mean NLL of `batch`'s policy tokens (accumulated into
        the gradients, no optimizer step); returns (that NLL, policy tokens, tokens the model
        ranks first), batch-wide."""
        batch = batch.to(self.device)
        (total,) = self._totals(float(batch.mask.sum()))
        nll_sum, correct = 0.0, 0.0
        groups = self._micro_batches(batch, what)
        for n_group, group in enumerate(groups):
            if group is None:
                self._idle_pass(batch, last=n_group == len(groups) - 1)
                continue
            mb = select(batch, group)
            with self._sync_scope(last=n_group == len(groups) - 1):
                logp, _ = self._logprobs(mb, tempered=False)
                self._backward(-(logp * mb.mask).sum() * (coef / max(total, 1.0)))
            nll_sum += float(-(logp.detach() * mb.mask).sum())
            correct += float(((logp.detach() > -0.6931) * mb.mask).sum())  # p > 1/2: the argmax token
        nll_sum, correct = self._totals(nll_sum, correct)
        return nll_sum / max(total, 1.0), total, correct

    def sft_step(self, batch: TokenBatch) -> dict[str, Any]:
        """One masked-NLL step on the policy tokens of `batch` (token-mean over the batch)."""
        start = time.perf_counter()
        nll, total, correct = self._nll_pass(batch, 1.0, "SFT step")
        norm = self._step()
        # no malloc_trim per step (generation has one): the peak is the step's own activations, and
        # trimming every SFT step kept it (8.8 vs 8.2 GB) at 1.17x the time (bench/host_memory.py, f6b9973)
        elapsed = time.perf_counter() - start
        return {
            "sft_loss": nll,
            "sft_token_accuracy": correct / max(total, 1.0),
            "grad_norm": norm,
            "train_tokens": int(total),
            "train_seconds": elapsed,
            "train_tokens_per_s": total / max(elapsed, 1e-9),
        }


def shard_model(model: torch.nn.Module, device: torch.device) -> None:
    """FSDP2 in place: each transformer block is its own shard unit (its parameters are gathered
    just for its forward and backward), then the rest of the model."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (dist_world(),))
    blocks = [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]
    for block in blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)


def dist_world() -> int:
    """The number of data-parallel processes (1 unless torch.distributed is initialised)."""
    return torch.distributed.get_world_size() if torch.distributed.is_available() and torch.distributed.is_initialized() else 1


def _fit(row: torch.Tensor, width: int) -> torch.Tensor:
    """A row of per-token values cut or zero-padded to `width`: a row's real tokens fit in any
    micro-batch it joins, only padding columns differ."""
    return row[:width] if row.shape[0] >= width else torch.nn.functional.pad(row, (0, width - row.shape[0]))


def _split(items: list[int], parts: int) -> list[list[int]]:
    parts = max(1, min(parts, len(items)))
    size = -(-len(items) // parts)
    return [items[i : i + size] for i in range(0, len(items), size)]


__all__ = [
    "DEFAULT_TIS_CAP",
    "LOSS_DEFAULTS",
    "Learner",
    "LearnerConfig",
    "LoraSettings",
    "apply_lora",
    "dist_world",
    "loss_settings",
    "shard_model",
]
