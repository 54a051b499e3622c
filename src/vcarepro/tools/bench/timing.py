"""Timing helpers the benchmarks share: one timed thread, median milliseconds, the machine they ran on."""

from __future__ import annotations

import os
import platform
from typing import Dict

import torch
import torch.utils.benchmark as benchmark

from vcarepro.report.environment import cpu_name

# One thread (torch.utils.benchmark's default): the least noisy figure on a shared machine.
TIMED_THREADS = 1


def time_ms(stmt, min_run_time: float) -> float:
    timer = benchmark.Timer(stmt="stmt()", globals={"stmt": stmt}, num_threads=TIMED_THREADS)
    return timer.blocked_autorange(min_run_time=min_run_time).median * 1e3


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
