"""Several training processes (torchrun): rank 0 runs the campaign, the others follow its updates.

`processes: N` in a campaign config makes `toolgym train` relaunch itself under
`torch.distributed.run` with N processes (`launch`). Every process builds the same model and
`Learner` (DDP or FSDP2, `rl.learner.parallel`). Rank 0 draws tasks, plays and grades the
rollouts, evaluates, logs and checkpoints, exactly as one process would; whenever it updates
the model it first tells the followers (`Coordinator.send`), and every rank trains on its
contiguous share of the same global batch. Gathering the whole model (for the rollout policy,
the servers, a checkpoint) is a collective too, so rank 0 announces it the same way.

Followers run `follow` until rank 0 says `stop`. Backends: gloo on CPU, NCCL on GPUs (one per
process, `LOCAL_RANK`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist


def under_torchrun() -> bool:
    """True in a process that torchrun started."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def init_training_processes(device: str | None) -> tuple[int, int]:
    """Join torchrun's process group (once); returns (rank, world size)."""
    if not dist.is_initialized():
        cuda = (device or "").startswith("cuda") or (device is None and torch.cuda.is_available())
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group("nccl" if cuda else "gloo")
    return dist.get_rank(), dist.get_world_size()


def launch(config_path: Path, processes: int, resume: bool) -> int:
    """Run `toolgym train CONFIG` in `processes` processes under torchrun; returns its exit code."""
    from toolgym.inference.weight_sync import free_port

    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        str(processes),
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(free_port()),
        "-m",
        "toolgym.cli",
        "train",
        str(config_path),
    ] + (["--resume"] if resume else [])
    return subprocess.call(cmd)


class Coordinator:
    """Model updates on every training process: rank 0 announces each (a broadcast of one
    object: the operation and its batch), then every rank runs it. In one process it just runs."""

    def __init__(self, learner: Any) -> None:
        self.learner = learner
        self.world = dist.get_world_size() if dist.is_initialized() else 1
        self.rank = dist.get_rank() if dist.is_initialized() else 0

    def send(self, op: str, payload: Any = None) -> None:
        """Rank 0: announce `op` (the followers then make the same collective calls)."""
        if self.world > 1:
            dist.broadcast_object_list([op, payload], src=0)

    def receive(self) -> tuple[str, Any]:
        """A follower: the next announcement."""
        box: list[Any] = [None, None]
        dist.broadcast_object_list(box, src=0)
        return box[0], box[1]

    # ---- the operations every rank runs together -----------------------------------------------

    def run(self, op: str, payload: Any = None) -> Any:
        """Do `op` on this rank (rank 0 announces it first); returns rank 0's result."""
        if self.rank == 0:
            self.send(op, payload)
        learner = self.learner
        if op == "rl":  # a TokenBatch, or (batch, anchor demonstrations, anchor coefficient)
            batch, anchor, coef = payload if isinstance(payload, tuple) else (payload, None, 0.0)
            return learner.rl_step(learner.shard(batch), anchor=learner.shard(anchor) if anchor is not None else None, anchor_coef=coef)
        if op == "sft":
            return learner.sft_step(learner.shard(payload))
        if op == "restart_optimizer":
            return learner.restart_optimizer(payload)
        if op == "set_lr":
            return learner.set_lr(payload)
        if op == "weights":
            return learner.full_state_dict()
        if op == "checkpoint":
            return learner.checkpoint_state()
        if op == "restore":  # every rank reads the checkpoint itself (one machine, or a shared disk)
            from toolgym.trainers.checkpoint import load_checkpoint

            model_state, optim_state, _ = load_checkpoint(Path(payload))
            return learner.load_checkpoint_state(model_state, optim_state)
        if op == "stop":
            return None
        raise ValueError(f"unknown training operation {op!r}")


def follow(coordinator: Coordinator) -> None:
    """A follower rank's whole life: do what rank 0 announces until it says stop."""
    while True:
        op, payload = coordinator.receive()
        coordinator.run(op, payload)
        if op == "stop":
            return


__all__ = ["Coordinator", "follow", "init_training_processes", "launch", "under_torchrun"]
