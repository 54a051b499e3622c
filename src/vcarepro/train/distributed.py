"""Process-group set-up for training stages launched by ``vcarepro.launch``.

One process: no process group at all. Several: the launcher sets RANK, WORLD_SIZE,
LOCAL_RANK (torchrun does the same) and, for single-node runs over a file store,
VCAREPRO_DIST_INIT=file://...; NCCL on GPUs, gloo on CPUs.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def init_distributed() -> DistInfo:
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    if world_size > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, init_method=os.environ.get("VCAREPRO_DIST_INIT", "env://"),
                                rank=rank, world_size=world_size)
    return DistInfo(rank, world_size, local_rank, device)


def say(info: DistInfo, message: str) -> None:
    """Print ``message`` on rank 0 only."""
    if info.is_main:
        print(message, flush=True)


def barrier(info: DistInfo) -> None:
    if info.distributed:
        dist.barrier()


def all_reduce_mean(value: float, info: DistInfo) -> float:
    if not info.distributed:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=info.device)
    dist.all_reduce(t)
    return t.item() / info.world_size


def shutdown(info: DistInfo) -> None:
    if info.distributed and dist.is_initialized():
        dist.destroy_process_group()


def any_rank(flag: bool, info: DistInfo) -> bool:
    """True on every rank if ``flag`` is true on any (a SIGTERM may reach only some ranks)."""
    if not info.distributed:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=info.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())
