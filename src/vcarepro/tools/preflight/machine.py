"""The memory of the machine at hand: how much one device has, the peak a block allocates (read from ``/proc/self``
on a CPU), handing freed memory back between runs, and telling running out of memory from any other error."""

from __future__ import annotations

import gc
import os
from pathlib import Path
from typing import Optional

import torch

GIB = 1024**3


def _proc_status_kib(key: str) -> Optional[int]:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def release_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        return
    try:  # hand freed heap back to the OS, so the next run's RSS starts low
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class PeakMemory:
    """The peak memory a block allocates on ``device``, in bytes.

    GPU: ``torch.cuda.max_memory_allocated`` above what was allocated before. CPU: the growth of the
    process's peak RSS (VmHWM, reset through ``/proc/self/clear_refs``; where that cannot be reset,
    ``getrusage``'s ``ru_maxrss``, which only sees peaks above earlier ones).
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.method = "torch.cuda.max_memory_allocated" if device.type == "cuda" else "peak RSS growth"

    def __enter__(self) -> "PeakMemory":
        release_memory(self.device)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
            return self
        self.resettable = True
        try:
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:
            self.resettable = False
        self.base = (_proc_status_kib("VmRSS") or 0) * 1024
        return self

    def peak(self) -> int:
        if self.device.type == "cuda":
            return max(torch.cuda.max_memory_allocated(self.device) - self.base, 0)
        if self.resettable and _proc_status_kib("VmHWM") is not None:
            return max(_proc_status_kib("VmHWM") * 1024 - self.base, 0)
        import resource

        return max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - self.base, 0)

    def __exit__(self, *exc) -> None:
        return None


def device_memory(device: torch.device) -> int:
    """Bytes of memory one device has: the GPU's, or this machine's RAM (a cgroup limit if lower)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit.isdigit():
            total = min(total, int(limit))
    except OSError:
        pass
    return total


def is_out_of_memory(err: BaseException) -> bool:
    if isinstance(err, (torch.cuda.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(err, RuntimeError) and ("out of memory" in str(err) or "can't allocate memory" in str(err))
