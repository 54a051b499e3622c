"""Stepping a run: its training step built at a batch, one warm-up and a few timed steps (their median), the peak
memory they allocate, and on running out of memory the batch halved until a step runs."""

from __future__ import annotations

import gc
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, Tuple

import torch

from vcarepro.tools.preflight.machine import PeakMemory, is_out_of_memory, release_memory


@dataclass
class Measured:
    batch: int  # the per-device batch that ran
    seconds: Optional[float] = None  # one step at that batch: the median of the timed steps
    peak_bytes: Optional[int] = None
    static_bytes: Optional[int] = None
    out_of_memory_at: Optional[int] = None
    step_seconds: List[float] = field(default_factory=list)  # each timed step, in order
    waited: Optional[float] = None  # of the threads' time ready to run, the share spent waiting for a CPU


TIMED_STEPS = 3  # timed steps per run after the warm-up, by default (--steps)
WARMUP_STEPS = 1  # steps run before timing: allocations, kernel selection, lazy initialisation

clock = time.perf_counter  # what steps are timed with (a test gives it known durations)


def scheduler_times() -> Optional[Tuple[int, int]]:
    """(ns on a CPU, ns ready to run but waiting for one), summed over this process's threads, as Linux's scheduler
    counts them (``/proc/self/task/*/schedstat``); None where it keeps no such counts. Waiting is what another
    process takes: a thread that sleeps (an idle OpenMP worker at batch 1) is not ready, so it does not count."""
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


def step_times(fn: Callable[[], Any], repeats: int) -> List[float]:
    """Seconds of each of ``repeats`` calls of ``fn()`` (at least one), with Python's garbage collector off while
    they run (as :mod:`timeit` does): a collection of the preflight's own objects is not a step's time."""
    times: List[float] = []
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(max(1, repeats)):
            started = clock()
            fn()
            times.append(clock() - started)
    finally:
        if was_enabled:
            gc.enable()
    return times


def timed(fn: Callable[[], Any], repeats: int) -> float:
    """Median seconds of ``fn()`` over ``repeats`` calls (at least one): one slow step on a busy machine does not
    become the run's time."""
    return statistics.median(step_times(fn, repeats))


def measure_step(
    make_step: Callable[[int], Any],
    batch: int,
    device: torch.device,
    *,
    repeats: int = TIMED_STEPS,
    after: Optional[Callable[[Any], None]] = None,
) -> Measured:
    """Build the step at ``batch``, run one warm-up and ``repeats`` timed steps (median), with its peak memory.

    Out of memory, it halves the batch until a step runs (the time is still wanted) and records where
    it failed. ``after(step)`` runs on the built step before it is freed (e.g. to time sampling).
    """
    out_of_memory_at = None
    while True:
        step = None
        try:
            with PeakMemory(device) as memory:
                step = make_step(batch)
                for _ in range(WARMUP_STEPS):
                    step()
                before = scheduler_times()
                times = step_times(step, repeats)
                after_steps = scheduler_times()
                peak = memory.peak()
            static = step.static_bytes()
            if after is not None:
                after(step)
            waited = None
            if device.type == "cpu" and before is not None and after_steps is not None:
                ran, wait = after_steps[0] - before[0], after_steps[1] - before[1]
                waited = round(wait / (ran + wait), 3) if ran + wait > 0 else None
            return Measured(batch, statistics.median(times), peak, static, out_of_memory_at, times, waited)
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
    the first run's memory and time: one step of each branch at batch 1, before its runs are measured."""
    warm = None
    try:
        warm = build(run, batch=1, device=str(device))
        warm()
    except Exception:  # noqa: BLE001 - the measurement itself reports what fails
        pass
    finally:
        del warm
        release_memory(device)
