"""The one timer of the bench, the preflight and the GPU check: a training step built at a batch, its warm-up, timed
steps with Python's garbage collector off, their median and spread, the share of their time another process took,
and the peak memory; out of memory, the batch halves until a step runs. docs/performance.md says how to read them."""

from __future__ import annotations

import gc
import os
import platform
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from vcarepro.report.environment import cpu_name

GIB = 1024**3
TIMED_STEPS = 3  # timed steps per run after the warm-up, by default (the preflight's --steps)
WARMUP_STEPS = 1  # steps run before timing: allocations, kernel selection, lazy initialisation
# One thread (torch.utils.benchmark's default): the least noisy figure on a shared machine.
TIMED_THREADS = 1
# Below this share of a core for the timed thread (its CPU time over the wall time it was timed), another process held
# the core part of the time: the figure is the machine's, not the code's.
LOADED_SHARE = 0.9
# The timed steps of one run may disagree by this factor (slowest over fastest) before their time is not trusted: on a
# quiet 2-core machine they agree within 1.15x, while beside another torch process spinning OpenMP threads a DeiT-T
# step took 0.28 to 3.98 s (14x).
MAX_STEP_SPREAD = 2.0
# Steps shorter than this are not judged: a scheduler's time slices alone spread them (an embedded DeiT-T's steps took
# 0.0107 to 0.0276 s beside another test), and a projection from them is seconds.
MIN_JUDGED_STEP_S = 0.05
# On the CPU, the share of the steps' ready time spent waiting for a CPU (Linux's run delay) above which another
# process took it. A steady load slows every step alike, which the spread misses: beside a spinning torch process
# DeiT-T's steps took 0.74 to 0.99 s (1.3x apart) against 0.17 s quiet.
MAX_WAITED = 0.25

clock = time.perf_counter  # what steps are timed with (a test gives it known durations)


def sync(device: torch.device | str) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def call_times(
    fn: Callable[[], Any], repeats: int, *, device: Optional[torch.device] = None, min_seconds: float = 0.0
) -> List[float]:
    """Seconds of each call of ``fn()``: at least ``repeats`` (and one) calls, and more until ``min_seconds`` have
    passed, with Python's garbage collector off (as :mod:`timeit` does) and ``device`` synchronised around each."""
    times: List[float] = []
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        while len(times) < max(1, repeats) or sum(times) < min_seconds:
            if device is not None:
                sync(device)
            started = clock()
            fn()
            if device is not None:
                sync(device)
            times.append(clock() - started)
    finally:
        if was_enabled:
            gc.enable()
    return times


def timed(fn: Callable[[], Any], repeats: int, **kw) -> float:
    """Median seconds of ``fn()`` over :func:`call_times`: one slow call on a busy machine is not the figure."""
    return statistics.median(call_times(fn, repeats, **kw))


def time_ms(stmt, min_run_time: float) -> float:
    return timed_ms(stmt, min_run_time)[0]


def timed_ms(stmt, min_run_time: float) -> Tuple[float, Optional[float]]:
    """(median ms of blocked runs of ``stmt`` on one torch thread, the share of a core this thread had meanwhile;
    None on a GPU, where the time is not this thread's). For layers, whose calls are too short to time one by one."""
    import torch.utils.benchmark as benchmark  # here: it imports torch's extension builder, which logs about CUDA

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


# ----------------------------------------------------------------------------- memory


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
    """The peak memory a block allocates on ``device``, in bytes: on a GPU ``torch.cuda.max_memory_allocated`` above
    what was allocated before; on a CPU the growth of the peak RSS (VmHWM, reset through ``/proc/self/clear_refs``;
    where that cannot be reset, ``ru_maxrss``, which only sees peaks above earlier ones)."""

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


# ----------------------------------------------------------------------------- a step


def scheduler_times() -> Optional[Tuple[int, int]]:
    """(ns on a CPU, ns ready to run but waiting for one), summed over this process's threads, as Linux's scheduler
    counts them (``/proc/self/task/*/schedstat``); None where it keeps no such counts. A sleeping thread (an idle
    OpenMP worker) is not ready, so only what another process takes counts as waiting."""
    on_cpu = waiting = 0
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/schedstat") as f:
                ran, waited = f.read().split()[:2]
            on_cpu, waiting = on_cpu + int(ran), waiting + int(waited)
        except (OSError, ValueError):  # a thread that ended meanwhile; a kernel without the counts
            continue
    return on_cpu, waiting


@dataclass
class Measured:
    batch: int  # the per-device batch that ran
    seconds: Optional[float] = None  # one step at that batch: the median of the timed steps
    peak_bytes: Optional[int] = None
    static_bytes: Optional[int] = None
    out_of_memory_at: Optional[int] = None
    step_seconds: List[float] = field(default_factory=list)  # each timed step, in order
    waited: Optional[float] = None  # of the threads' time ready to run, the share spent waiting for a CPU
    warmup_seconds: List[float] = field(default_factory=list)

    @property
    def spread(self) -> Optional[float]:
        """The slowest timed step over the fastest (1.0: they agree)."""
        fastest = min(self.step_seconds, default=0.0)
        return max(self.step_seconds) / fastest if fastest > 0 else None

    @property
    def judged(self) -> bool:
        """Whether the steps are long enough for the load guards to judge."""
        return max(self.step_seconds, default=0.0) >= MIN_JUDGED_STEP_S

    @property
    def disagree(self) -> bool:
        """Judged steps whose spread is above :data:`MAX_STEP_SPREAD` (more timed steps may settle it)."""
        return self.judged and self.spread is not None and self.spread > MAX_STEP_SPREAD

    def under_load(self) -> Optional[str]:
        """Why another process's load makes these steps' time untrustworthy, or None (also for steps too short to
        judge)."""
        times = self.step_seconds
        if not self.judged:
            return None
        if self.disagree:
            return (
                f"its {len(times)} timed steps disagree ({min(times):.3g} s to {max(times):.3g} s, {self.spread:.1f}x, "
                f"more than {MAX_STEP_SPREAD:g}x)"
            )
        if self.waited is not None and self.waited > MAX_WAITED:
            return (
                f"its timed steps spent {self.waited:.0%} of their ready time waiting for a CPU "
                f"(over {MAX_WAITED:.0%}: another process had it)"
            )
        return None


def measure_step(
    make_step: Callable[[int], Any],
    batch: int,
    device: torch.device,
    *,
    repeats: int = TIMED_STEPS,
    warmup: int = WARMUP_STEPS,
    min_seconds: float = 0.0,
    after: Optional[Callable[[Any], None]] = None,
) -> Measured:
    """Build the step at ``batch``, run ``warmup`` steps and then :func:`call_times` of it, with its peak memory.

    Out of memory, it halves the batch until a step runs (the time is still wanted) and records where it failed.
    ``after(step)`` runs on the built step before it is freed (to time sampling, or read what the steps did).
    """
    out_of_memory_at = None
    while True:
        step = None
        try:
            with PeakMemory(device) as memory:
                step = make_step(batch)
                warm = [call_times(step, 1)[0] for _ in range(warmup)]
                before = scheduler_times()
                times = call_times(step, repeats, min_seconds=min_seconds)
                after_steps = scheduler_times()
                peak = memory.peak()
            static = step.static_bytes()
            if after is not None:
                after(step)
            waited = None
            if device.type == "cpu" and before is not None and after_steps is not None:
                ran, wait = after_steps[0] - before[0], after_steps[1] - before[1]
                waited = round(wait / (ran + wait), 3) if ran + wait > 0 else None
            return Measured(batch, statistics.median(times), peak, static, out_of_memory_at, times, waited, warm)
        except Exception as err:  # noqa: BLE001 - only running out of memory is handled
            if not is_out_of_memory(err):
                raise
            out_of_memory_at = out_of_memory_at or batch
            if batch == 1:
                return Measured(batch, out_of_memory_at=out_of_memory_at)
            batch //= 2
        finally:
            del step
            release_memory(device)


def throw_away_step(build: Callable[..., Any], run, device: torch.device) -> None:
    """The process's first step pays one-time costs (thread pools, lazy imports, allocator arenas) that would count as
    the first run's memory and time: one step at batch 1 before a branch's runs are measured."""
    warm = None
    try:
        warm = build(run, batch=1, device=str(device))
        warm()
    except Exception:  # noqa: BLE001 - the measurement itself reports what fails
        pass
    finally:
        del warm
        release_memory(device)
