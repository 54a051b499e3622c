"""Process-group set-up for training stages launched by ``vcarepro.train.launch``.

One process: no process group. Several: RANK, WORLD_SIZE, LOCAL_RANK (as torchrun sets them) and, on one
node, VCAREPRO_DIST_INIT=file://...; NCCL on GPUs, gloo on CPUs. A rank missing after
VCAREPRO_RDZV_TIMEOUT seconds ends the others with one sentence naming it (:class:`RendezvousTimeout`). The
limit is ours, not ``init_process_group(timeout=...)``'s, which would also bound every collective (a barrier
while rank 0 evaluates).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import List, Mapping, Optional

import torch
import torch.distributed as dist
from torch.distributed.constants import default_pg_timeout

from vcarepro.core.errors import BadInput, UserError
from vcarepro.train.launch import DEFAULT_RDZV_TIMEOUT, RDZV_TIMEOUT_ENV


class RendezvousTimeout(UserError, TimeoutError):
    """Not every rank reached the rendezvous in time."""


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
        store = rendezvous(os.environ.get("VCAREPRO_DIST_INIT", "env://"), rank, world_size)
        dist.init_process_group(
            backend, store=dist.PrefixStore("default_pg", store), rank=rank, world_size=world_size
        )  # as init_method would, with the store already joined
    return DistInfo(rank, world_size, local_rank, device)


def rendezvous_timeout(env: Optional[Mapping[str, str]] = None) -> float:
    """Seconds a rank waits for the others at the rendezvous (VCAREPRO_RDZV_TIMEOUT)."""
    env = os.environ if env is None else env
    value = env.get(RDZV_TIMEOUT_ENV) or str(DEFAULT_RDZV_TIMEOUT)
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise BadInput(
            f"{RDZV_TIMEOUT_ENV}={value!r} is not a positive number of seconds; set it to one "
            f"(e.g. {DEFAULT_RDZV_TIMEOUT}) or unset it."
        )
    return seconds


def rendezvous(init_method: str, rank: int, world_size: int, timeout: Optional[float] = None):
    """The store every rank has reached, within ``timeout`` seconds; :class:`RendezvousTimeout` if one has not."""
    timeout = rendezvous_timeout() if timeout is None else timeout
    limit = timedelta(seconds=timeout)
    try:
        store, rank, world_size = next(dist.rendezvous(init_method, rank, world_size, timeout=limit))
    except RuntimeError as err:  # a TCP store (env://) that does not answer in time; DistStoreError is one
        if "time" not in str(err).lower():
            raise
        raise RendezvousTimeout(
            f"rank {rank}: the rendezvous at {init_method} did not complete within {timeout:g} s; check that "
            f"every rank started, or give the launcher a longer --rdzv-timeout ({RDZV_TIMEOUT_ENV})."
        ) from None
    store.set_timeout(limit)
    # one key per rank and per attempt (torchrun's restarts share its store)
    keys = [f"vcarepro/arrived/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{r}" for r in range(world_size)]
    store.set(keys[rank], "1")
    try:
        store.wait(keys, limit)
    except RuntimeError:  # torch raises a bare RuntimeError("Wait timeout") (or a DistStoreError)
        missing = _missing(store, keys)
        if not missing:  # the last one arrived just as the wait gave up
            return store
        names = f"rank {missing[0]}" if len(missing) == 1 else "ranks " + ", ".join(map(str, missing))
        raise RendezvousTimeout(
            f"rank {rank}: {names} did not reach the rendezvous within {timeout:g} s (died while starting, or "
            f"still starting); see {'its' if len(missing) == 1 else 'their'} errors, or give the launcher a "
            f"longer --rdzv-timeout ({RDZV_TIMEOUT_ENV}) if the ranks start slowly."
        ) from None
    # past the rendezvous, the process group's own timeout (a short rendezvous bound must not cut NCCL's
    # set-up at the first collective while rank 0 is still verifying data/gen, say)
    store.set_timeout(default_pg_timeout)
    return store


def _missing(store, keys: List[str]) -> List[int]:
    return [rank for rank, key in enumerate(keys) if not store.check([key])]


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
