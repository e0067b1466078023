"""Several processes, one model: process-group setup, model wrapping and the collectives we use.

Run `torchrun --nproc_per_node=N -m attn.app.cli train ...`; torchrun sets RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR and MASTER_PORT, and `init_distributed` reads them (gloo on the CPU, nccl on GPUs, one GPU per
process). Without them everything here is a no-op on one process. The model is wrapped in DistributedDataParallel,
or sharded with FSDP2; both average gradients over ranks (`attn.training.update` scales the losses to match).
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)

from attn.artifacts.devices import resolve_device
from attn.core.blocks import Block
from attn.training.config_sections import Strategy


@dataclass(frozen=True)
class DistContext:
    """Where this process stands: its rank among `world_size` and its device."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    owns_group: bool = False  # this process created the process group and must destroy it

    @property
    def is_main(self) -> bool:
        """Rank 0 writes checkpoints, metrics and the progress bar."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def init_distributed(device: str = "auto") -> DistContext:
    """Joins the process group described by torchrun's environment variables, if any.

    A single process gets rank 0 of 1 and no process group. `device` is "auto" (this rank's GPU when there is
    one, else the CPU), "cpu", "cuda" or "cuda:N".

    Raises:
        ConfigError: a CUDA device was asked for but none is available.
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", str(rank)))
    chosen = resolve_device(device, local_rank if world_size > 1 else None)
    if chosen.type == "cuda":
        torch.cuda.set_device(chosen)
    if world_size == 1 or dist.is_initialized():
        return DistContext(rank, world_size, local_rank, chosen)
    backend = "nccl" if chosen.type == "cuda" else "gloo"
    dist.init_process_group(backend, rank=rank, world_size=world_size)
    return DistContext(rank, world_size, local_rank, chosen, owns_group=True)


def shutdown(ctx: DistContext) -> None:
    """Leaves the process group if `init_distributed` created it.

    A DDP wrapper left in a reference cycle holds the gloo group; were it collected after the group
    is destroyed, the group's destructor would join its worker threads while holding the GIL, which
    a worker may need to free a tensor: a deadlock (a rank hung at exit under load). Collecting
    first makes `destroy_process_group` drop the last reference, with the GIL released.
    """
    if ctx.owns_group and dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()


def wrap_model(model: nn.Module, ctx: DistContext, strategy: Strategy, find_unused: bool = False) -> nn.Module:
    """Wraps a model (already on `ctx.device`) for data-parallel training; unchanged on one process.

    Returns a DistributedDataParallel wrapper, or `model` itself, which FSDP2 shards in place (each self-attention
    block, then the root). `find_unused` lets DDP cope with parameters a step does not use (an encoder's MLM head
    while it classifies).
    """
    if not ctx.distributed:
        return model
    if strategy == Strategy.FSDP:
        from torch.distributed.fsdp import fully_shard

        # Decoder blocks stay in the root's group: the encoder-decoder computes every block's
        # cross-attention keys and values before running the blocks, outside their forward hooks.
        for module in model.modules():
            if isinstance(module, Block):
                fully_shard(module)
        fully_shard(model)
        return model
    device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(model, device_ids=device_ids, find_unused_parameters=find_unused)


@contextlib.contextmanager
def gradient_sync(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Lets backward passes inside all-reduce the gradients of `model` (what `wrap_model` returned), or not (the
    first k-1 of k micro-batches)."""
    if enabled:
        yield
    elif isinstance(model, nn.parallel.DistributedDataParallel):
        with model.no_sync():
            yield
    elif hasattr(model, "set_requires_gradient_sync"):  # sharded by FSDP2
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    else:
        yield


def all_reduce_sum(values: Tensor, ctx: DistContext) -> Tensor:
    """The element-wise sum over ranks (the tensor itself on one process)."""
    if ctx.distributed:
        values = values.clone()
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values


def all_gather_objects(value: Any, ctx: DistContext) -> list[Any]:
    """One picklable value from every rank, in rank order."""
    if not ctx.distributed:
        return [value]
    gathered: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(gathered, value)
    return gathered


def barrier(ctx: DistContext) -> None:
    """Waits for every rank."""
    if ctx.distributed:
        dist.barrier()


_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def full_model_state(model: nn.Module) -> dict[str, Tensor]:
    """The model's complete weights on the CPU, gathered from the shards under FSDP (call on every rank); under
    FSDP with several ranks only rank 0 receives them, the others an empty dict."""
    return get_model_state_dict(model, options=_FULL)


def reshard(model: nn.Module) -> None:
    """Registers the sharded parameters again on every FSDP2 module of `model` (a no-op otherwise).

    FSDP2 leaves the root's parameters gathered after a forward pass, expecting a backward pass to
    follow; after an evaluation none does, and the optimizer's state then names parameters the
    model no longer holds (torch's `get_optimizer_state_dict` fails with a KeyError).
    """
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def optimizer_state(model: nn.Module, optimizers: Sequence[torch.optim.Optimizer]) -> dict[str, Any]:
    """The optimizers' complete state keyed by parameter name (call on every rank; see `full_model_state`)."""
    return get_optimizer_state_dict(model, optimizers, options=_FULL)


def load_optimizer_state(model: nn.Module, optimizers: Sequence[torch.optim.Optimizer], state: dict[str, Any]) -> None:
    """Loads a state from `optimizer_state` into optimizers over the same (possibly sharded) model; parameters
    that never received a gradient (a head the task does not use) have no state."""
    set_optimizer_state_dict(model, optimizers, state, options=StateDictOptions(full_state_dict=True, strict=False))
