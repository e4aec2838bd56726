"""Multi-process data parallel helpers (``torchrun``: gloo on CPU, NCCL on GPU)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn


@dataclass(frozen=True)
class ProcessGroup:
    """This process's place in the job (rank 0 logs and writes checkpoints)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_from_environment(device_type: str) -> ProcessGroup:
    """Join the process group when launched by ``torchrun`` (WORLD_SIZE > 1), else a single process."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return ProcessGroup()
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device_type == "cuda" else "gloo")
    return ProcessGroup(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def wrap(module: nn.Module, group: ProcessGroup, device: torch.device) -> nn.Module:
    """DistributedDataParallel around ``module`` when there are several processes."""
    if group.world_size <= 1:
        return module
    device_ids = [device.index] if device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(module, device_ids=device_ids)


def unwrap(module: nn.Module) -> nn.Module:
    """The module inside a DistributedDataParallel wrapper (or the module itself)."""
    return module.module if isinstance(module, nn.parallel.DistributedDataParallel) else module


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum over processes (identity with one process)."""
    if dist.is_available() and dist.is_initialized():
        tensor = tensor.clone()
        dist.all_reduce(tensor)
    return tensor


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def shutdown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
