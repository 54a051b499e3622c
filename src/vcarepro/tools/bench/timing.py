"""Timing helpers the benchmarks share: one timed thread, median milliseconds, the machine they ran on."""

from __future__ import annotations

import os
import platform
import time
from typing import Dict, Optional, Tuple

import torch
import torch.utils.benchmark as benchmark

from vcarepro.report.environment import cpu_name

# One thread (torch.utils.benchmark's default): the least noisy figure on a shared machine.
TIMED_THREADS = 1


# Below this share of a core for the timed thread (its CPU time over the wall time it was timed), a figure was
# measured under load: another process held the core part of the time, so the figure is the machine's, not the
# code's, and a target judged on it would be judged on the load.
LOADED_SHARE = 0.9


def time_ms(stmt, min_run_time: float) -> float:
    return timed_ms(stmt, min_run_time)[0]


def timed_ms(stmt, min_run_time: float) -> Tuple[float, Optional[float]]:
    """(median ms, the share of a core the timed thread had while it was timed: its CPU time over the wall time).

    The timer runs ``stmt`` on this thread with one torch thread, so on an idle core the share is about 1; a share
    below :data:`LOADED_SHARE` means it waited for the core. None on a GPU, where the time is not this thread's.
    """
    timer = benchmark.Timer(stmt="stmt()", globals={"stmt": stmt}, num_threads=TIMED_THREADS)
    wall, cpu = time.perf_counter(), time.thread_time()
    median = timer.blocked_autorange(min_run_time=min_run_time).median * 1e3
    wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
    share = None if torch.cuda.is_available() and torch.cuda.is_initialized() else min(cpu / wall, 1.0)
    return median, share


def describe_machine() -> Dict[str, object]:
    return {
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        # torch.utils.benchmark.Timer runs the timed statement on one thread whatever torch_threads says
        "timed_threads": TIMED_THREADS,
        "torch": torch.__version__,
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "python": platform.python_version(),
    }


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
