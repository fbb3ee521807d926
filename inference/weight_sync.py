"""Weights from the trainer to inference servers over a torch.distributed group (no disk).

sglang's `/init_weights_update_group` makes every server join a process group of its own (not
the trainer's torchrun group) with the trainer as rank 0; `/update_weights_from_distributed`
then receives each named tensor by broadcast from rank 0. `join_weight_group` builds that group
on either side the way sglang does (a TCP rendezvous, a store prefixed by the group name, a
process group registered with torch so collectives accept it); `WeightBroadcaster` is the
trainer's side. Backend `nccl` on GPUs, `gloo` on CPU (what the tests use against
`harness.protocol_server` processes).
"""

from __future__ import annotations

import asyncio
import socket
from datetime import timedelta
from typing import Any

import torch

from toolgym.inference.sglang_client import SGLangPolicy


def free_port() -> int:
    """A TCP port nothing listens on right now (for the group's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def join_weight_group(
    backend: str, master_address: str, master_port: int, world_size: int, rank: int, group_name: str, timeout_s: float = 300.0
) -> Any:
    """Join (rank 0: create) the weight-update process group; returns the process group."""
    import inspect

    from torch.distributed.distributed_c10d import Backend, PrefixStore, _new_process_group_helper, _world, rendezvous

    timeout = timedelta(seconds=timeout_s)
    store, rank, world_size = next(rendezvous(f"tcp://{master_address}:{master_port}", rank, world_size, timeout=timeout))
    store.set_timeout(timeout)
    store = PrefixStore(group_name, store)
    # the options argument was renamed across torch versions
    options = "backend_options" if "backend_options" in inspect.signature(_new_process_group_helper).parameters else "pg_options"
    group, _ = _new_process_group_helper(
        world_size, rank, [], Backend(backend), store, group_name=group_name, timeout=timeout, **{options: None}
    )
    _world.pg_group_ranks[group] = {i: i for i in range(world_size)}
    return group


def leave_weight_group(group: Any) -> None:
    """Tear a group from `join_weight_group` down."""
    torch.distributed.destroy_process_group(group)


def dtype_name(dtype: torch.dtype) -> str:
    """sglang's spelling of a dtype ("bfloat16", "float32")."""
    return str(dtype).removeprefix("torch.")


class WeightBroadcaster:
    """The trainer's side of distributed weight updates to every server of an `SGLangPolicy`."""

    def __init__(
        self,
        policy: SGLangPolicy,
        backend: str = "nccl",
        master_address: str = "127.0.0.1",
        master_port: int | None = None,
        group_name: str = "toolgym-weights",
    ) -> None:
        self.policy = policy
        self.backend = backend
        self.master_address = master_address
        self.master_port = master_port or free_port()
        self.group_name = group_name
        self.group: Any = None

    async def connect(self) -> None:
        """Form the group: every server joins while this process joins as rank 0."""
        world = 1 + len(self.policy.urls)
        joined: dict[str, Any] = {}

        async def join() -> None:
            joined["group"] = await asyncio.to_thread(
                join_weight_group, self.backend, self.master_address, self.master_port, world, 0, self.group_name
            )

        await self.policy.init_weights_update_group(self.master_address, self.master_port, self.group_name, self.backend, join=join())
        self.group = joined["group"]

    async def push(self, state: dict[str, torch.Tensor], version: int) -> None:
        """Send `state` (name -> tensor) to every server as weight version `version`."""
        if self.group is None:
            raise RuntimeError("WeightBroadcaster.push before connect()")
        names = list(state)
        tensors = [state[n].detach().contiguous() for n in names]

        def send() -> None:
            for t in tensors:
                torch.distributed.broadcast(t, src=0, group=self.group)

        await self.policy.update_weights_from_distributed(
            names,
            [dtype_name(t.dtype) for t in tensors],
            [list(t.shape) for t in tensors],
            self.group_name,
            broadcast=asyncio.to_thread(send),
            version=version,
        )

    async def close(self) -> None:
        """Servers leave the group; this process tears it down."""
        if self.group is not None:
            await self.policy.destroy_weights_update_group(self.group_name)
            leave_weight_group(self.group)
            self.group = None


__all__ = ["WeightBroadcaster", "dtype_name", "free_port", "join_weight_group", "leave_weight_group"]
