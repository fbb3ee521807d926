"""Where a campaign's rollouts sample from, and how trained weights get there.

Every kind has `policy` (what the rollout agent calls), `push(model, version)` (after each
update; version = RL steps applied, 0 = the starting weights) and `close()`:

- `SharedWeights`: the in-process `HFPolicy` that shares the training model (synchronous local
  training: nothing to copy, the version is bumped).
- `CopiedWeights`: a second in-process `HFPolicy` with its own copy of the weights, so rollouts
  can run while the learner updates the original (asynchronous local training), or sample in
  another dtype than training (bf16 sampling from fp32 weights on a CPU).
- `ActorWeights`: a Ray `PolicyActor` serving every environment worker (weights through the
  object store).
- `ServerWeights`: sglang servers (or anything speaking its protocol) behind an `SGLangPolicy`;
  weights from disk (`update_weights_from_disk`, a checkpoint directory the campaign writes) or
  over a torch.distributed group (`update_weights_from_distributed`).

Every generation reports the version that sampled it, so trajectories carry a version per turn.
"""

from __future__ import annotations

import asyncio
import copy
import shutil
from pathlib import Path
from typing import Any

import torch

from toolgym.inference.hf_policy import HFPolicy


def merged_model(model: torch.nn.Module) -> torch.nn.Module:
    """The model to serve or save: LoRA adapters merged into a copy (training keeps its
    adapters), any other model as it is."""
    if hasattr(model, "merge_and_unload"):
        return copy.deepcopy(model).merge_and_unload()
    return model


def merged_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's weights as a plain CPU state dict (LoRA adapters merged in)."""
    return {k: v.detach().cpu().clone() for k, v in merged_model(model).state_dict().items()}


class SharedWeights:
    """The training model itself samples (see the module docstring)."""

    def __init__(self, policy: HFPolicy) -> None:
        self.policy = policy

    def push(self, model: torch.nn.Module, version: int, state: dict[str, torch.Tensor] | None = None) -> None:
        """Nothing to copy: the next batch already uses the new weights."""
        self.policy.version = version

    def close(self) -> None:
        """Nothing to release."""


class CopiedWeights:
    """A separate in-process copy of the policy for rollouts (see the module docstring)."""

    def __init__(self, training: HFPolicy, dtype: str | torch.dtype | None = None) -> None:
        model = training.model  # LoRA: merged into a copy; otherwise a plain copy
        model = merged_model(model) if hasattr(model, "merge_and_unload") else copy.deepcopy(model)
        self.policy = HFPolicy(
            model, tokenizer=training.tokenizer, device=str(training.device), dtype=dtype or training.dtype, name=training.name
        )

    def push(self, model: torch.nn.Module, version: int, state: dict[str, torch.Tensor] | None = None) -> None:
        """Copy the new weights (`state`, else the model's) in once the running generation batch
        is done."""
        self.policy.load_weights(state if state is not None else merged_state(model), version)

    def close(self) -> None:
        """Nothing to release."""


class ActorWeights:
    """A Ray `PolicyActor` (see the module docstring)."""

    def __init__(self, handle: Any, name: str = "ray-policy") -> None:
        from toolgym.harness.ray_pool import RemotePolicy

        self.handle = handle
        self.policy = RemotePolicy(handle, name)

    def push(self, model: torch.nn.Module, version: int, state: dict[str, torch.Tensor] | None = None) -> None:
        """Send the weights through the object store; the actor swaps them between batches."""
        import ray

        state = state if state is not None else merged_state(model)
        ray.get(self.handle.load_state_dict.remote(ray.put(state), version))

    def close(self) -> None:
        """Stop the actor."""
        import ray

        ray.kill(self.handle)


class ServerWeights:
    """sglang-protocol servers (see the module docstring)."""

    def __init__(self, urls: list[str], sync: str, weights_dir: Path, tokenizer: Any, backend: str = "gloo") -> None:
        from toolgym.inference.sglang_client import SGLangPolicy

        self.policy = SGLangPolicy(urls)
        self.sync = sync
        self.weights_dir = Path(weights_dir)
        self.tokenizer = tokenizer
        self.backend = backend
        self._sender: Any = None

    def push(self, model: torch.nn.Module, version: int, state: dict[str, torch.Tensor] | None = None) -> None:
        """Pause every server, load the new weights (`state`, else the model's), resume (the
        order sglang documents)."""
        asyncio.run(self._push(model, version, state))

    async def _push(self, model: torch.nn.Module, version: int, state: dict[str, torch.Tensor] | None) -> None:
        if self.sync == "distributed":
            from toolgym.inference.weight_sync import WeightBroadcaster

            if self._sender is None:
                self._sender = WeightBroadcaster(self.policy, backend=self.backend)
                await self._sender.connect()
            await self._sender.push(state if state is not None else merged_state(model), version)
            return
        path = self.weights_dir / f"v{version}"
        if state is not None:  # gathered from several training processes
            model.save_pretrained(path, state_dict=state)
        else:
            merged_model(model).save_pretrained(path)
        self.tokenizer.save_pretrained(path)
        await self.policy.update_weights_from_disk(str(path.resolve()), version)
        for old in self.weights_dir.glob("v*"):  # the servers have loaded it: keep only the newest
            if old != path:
                shutil.rmtree(old, ignore_errors=True)

    def close(self) -> None:
        """Leave the weight group (distributed sync)."""
        if self._sender is not None:
            asyncio.run(self._close_sender())

    async def _close_sender(self) -> None:
        await self._sender.close()
        await self.policy.aclose()
        self._sender = None


__all__ = ["ActorWeights", "CopiedWeights", "ServerWeights", "SharedWeights", "merged_model", "merged_state"]
