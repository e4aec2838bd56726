"""Multi-process data parallel helpers (``torchrun``: gloo on CPU, NCCL on GPU)."""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

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
    """Join the process group when launched by ``torchrun`` (WORLD_SIZE > 1), else a single process.

    Processes other than rank 0 then keep quiet: warnings, and the package's log records below
    errors, are dropped, so that a warning about the data prints once, not once per process.
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return ProcessGroup()
    if not dist.is_initialized():
        backend = "nccl" if device_type == "cuda" else "gloo"
        store = _store_of_this_attempt(world_size)
        if store is None:
            dist.init_process_group(backend)
        else:
            dist.init_process_group(backend, store=store, rank=int(os.environ["RANK"]), world_size=world_size)
    group = ProcessGroup(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))
    if not group.is_main:  # every process reads the same data: rank 0 alone says what it found
        logging.getLogger("captioning").setLevel(logging.ERROR)
        warnings.simplefilter("ignore")
    return group


SINGLE_PROCESS = ProcessGroup()


def launched_as_main() -> bool:
    """Whether this process is rank 0 of its job (or alone), read from torchrun's environment
    without joining the process group (which needs the device type)."""
    return int(os.environ.get("RANK", "0")) == 0


def _store_of_this_attempt(world_size: int) -> dist.Store | None:
    """On one node under ``torchrun --max-restarts``: the agent's store, with keys of this attempt only.

    torchrun lends its own key-value store to the processes it starts and keeps it across restarts,
    so a restarted process can read the previous attempt's addresses before its peers overwrite
    them, and connecting fails (pytorch/pytorch#135712). On one node all processes share one restart
    count, which then names their keys. With several nodes the counts can differ: there
    ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (set for torchrun) gives every attempt a new store.
    None when the default rendezvous is safe.
    """
    restarts = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0"))
    shared = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    if not (shared and restarts > 0 and os.environ.get("GROUP_WORLD_SIZE") == "1"):
        return None
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size, is_master=False
    )
    return dist.PrefixStore(f"captioning/attempt_{os.environ['TORCHELASTIC_RESTART_COUNT']}", store)


ModuleT = TypeVar("ModuleT", bound=nn.Module)


def wrap(
    module: ModuleT, group: ProcessGroup, device: torch.device
) -> ModuleT | nn.parallel.DistributedDataParallel:
    """DistributedDataParallel around ``module`` when there are several processes, else ``module``."""
    if group.world_size <= 1:
        return module
    device_ids = [device.index] if device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(module, device_ids=device_ids)


def unwrap(module: ModuleT) -> ModuleT:
    """The module inside a DistributedDataParallel wrapper (or the module itself).

    An attribute that may hold the wrapper (``Captioner.decoder``) is typed as the module it wraps,
    so the inner module is that type.
    """
    if isinstance(module, nn.parallel.DistributedDataParallel):
        return cast(ModuleT, module.module)
    return module


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum over processes (identity with one process)."""
    if dist.is_available() and dist.is_initialized():
        tensor = tensor.clone()
        dist.all_reduce(tensor)
    return tensor


def all_reduce_max(tensor: torch.Tensor) -> torch.Tensor:
    """Maximum over processes (identity with one process)."""
    if dist.is_available() and dist.is_initialized():
        tensor = tensor.clone()
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor


def average_gradients(parameters: Iterable[nn.Parameter], world_size: int) -> None:
    """Average the gradients of ``parameters`` over the processes, in place, with one all-reduce.

    DistributedDataParallel averages only the gradients of its own forward pass. This is for the
    rest: the self-critical rollout, which steps the unwrapped decoder, and a fine-tuned encoder,
    which runs before the wrapped decoder. A parameter without a gradient counts as zero, so
    every process reduces the same tensors.
    """
    params = [p for p in parameters if p.requires_grad]
    if world_size <= 1 or not params:
        return
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
    dist.all_reduce(flat)
    flat /= world_size
    for param, grad in zip(params, flat.split([p.numel() for p in params]), strict=True):
        param.grad = grad.view_as(param)


def broadcast_parameters(module: nn.Module) -> None:
    """Give every process rank 0's parameters (what DistributedDataParallel does for the module it wraps)."""
    if dist.is_available() and dist.is_initialized():
        for param in module.parameters():
            dist.broadcast(param.data, src=0)


def all_gather_objects(value: object) -> list:
    """``value`` of every process, in rank order (``[value]`` with one process)."""
    if not (dist.is_available() and dist.is_initialized()):
        return [value]
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered


def gather_to_main(value: object, group: ProcessGroup) -> list | None:
    """``value`` of every process, in rank order, on rank 0; None on the others (``[value]`` alone)."""
    if group.world_size <= 1:
        return [value]
    gathered: list | None = [None] * group.world_size if group.is_main else None
    dist.gather_object(value, gathered, dst=0)
    return gathered


ValueT = TypeVar("ValueT")


def broadcast_object(value: ValueT) -> ValueT:
    """Rank 0's ``value`` on every process (``value`` itself with one process).

    Every process passes a value of the type rank 0's has (others often None: give ``X | None``).
    """
    if not (dist.is_available() and dist.is_initialized()):
        return value
    holder: list[Any] = [value]
    dist.broadcast_object_list(holder, src=0)
    return cast(ValueT, holder[0])


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def shutdown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
