"""What one run will cost: :class:`RunCost`, a run's recipe beside what was measured on this machine, projected to
the recipe's batch (the step time, the device-hours, the peak memory per device) and whether that peak fits."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from vcarepro.tools.preflight.machine import GIB
from vcarepro.tools.preflight.stepping import Measured

# The timed steps of one run may disagree by this factor (slowest over fastest) before its time is not projected:
# on a quiet 2-core machine they agree within 1.15x (DeiT-T 0.129-0.138 s, DiT-S/2 0.449-0.512 s at batch 2), while
# beside another torch process both spinning OpenMP threads a step took 0.28 to 3.98 s (14x). A projection from such
# steps would be off by the same factor, so the run gets a problem line instead.
MAX_STEP_SPREAD = 2.0
# Steps shorter than this are not judged: a scheduler's time slices alone spread them (CI's slow tier, another test
# beside it: an embedded DeiT-T's three steps took 0.0107 to 0.0276 s, 2.6x), and a projection from them is seconds;
# the load the spread guards against moved DeiT-T's 0.13 s paper-scale step to 0.28-3.98 s, well above it.
MIN_JUDGED_STEP_S = 0.05
# On the CPU, the share of the time the steps' threads were ready to run that they spent waiting for a CPU (Linux's
# run delay, /proc/self/task/*/schedstat) above which another process took it. A steady load slows every step alike,
# which their spread misses: beside a torch process spinning OpenMP threads on the same 2 cores, DeiT-T's paper-scale
# steps took 0.74 to 0.99 s (1.3x apart) against 0.17 s quiet, and the projection was 5.3x the quiet one.
MAX_WAITED = 0.25


@dataclass
class RunCost:
    run: str
    branch: str  # cls or gen
    model: str
    recipe: str  # classification recipe, or the generation objective
    precision: str
    seeds: int
    devices: int
    accum_steps: int
    global_batch: int
    recipe_batch: int  # per device: global / (devices x accum_steps)
    batch_run: Optional[int] = None  # what ran; below recipe_batch the time is scaled linearly
    steps: int = 0  # optimizer steps of one seed
    step_seconds: Optional[float] = None  # one optimizer step at the recipe's batch (accum micro-steps), median
    step_seconds_measured: List[float] = field(default_factory=list)  # each timed step at the batch run
    step_spread: Optional[float] = None  # the slowest timed step over the fastest (1.0: they agree)
    waited: Optional[float] = None  # on the CPU: the share of their ready time the steps waited for a CPU
    train_gpu_hours: Optional[float] = None
    sample_gpu_hours: float = 0.0
    gpu_hours: Optional[float] = None
    peak_bytes_measured: Optional[int] = None
    peak_bytes: Optional[int] = None  # per device at the recipe batch (projected when capped)
    peak_projected: bool = False
    device_memory: int = 0
    fits: Optional[bool] = None  # the peak at the recipe's batch within device_memory (None: not measured)
    fit_note: str = ""  # why not, when it does not fit
    out_of_memory_at: Optional[int] = None
    step_images_per_s: Optional[float] = None
    loader_images_per_s: Optional[float] = None
    sampling: Optional[Dict[str, Any]] = None
    problems: List[str] = field(default_factory=list)

    @property
    def scaled(self) -> bool:
        return self.batch_run is not None and self.batch_run < self.recipe_batch


def fill_costs(cost: RunCost, measured: Measured) -> None:
    """``cost`` from what ``measured`` saw at its batch: the time scaled linearly to the recipe's batch, the peak's
    static part kept and the rest scaled, and whether that fits ``cost.device_memory``."""
    cost.batch_run = measured.batch
    cost.out_of_memory_at = measured.out_of_memory_at
    cost.peak_bytes_measured = measured.peak_bytes
    cost.step_seconds_measured = list(measured.step_seconds)
    cost.waited = measured.waited
    fastest = min(measured.step_seconds, default=0.0)
    if fastest > 0:
        cost.step_spread = max(measured.step_seconds) / fastest
    judged = max(measured.step_seconds, default=0.0) >= MIN_JUDGED_STEP_S
    if judged and cost.step_spread is not None and cost.step_spread > MAX_STEP_SPREAD:
        times = measured.step_seconds
        cost.problems.append(
            f"{cost.run}: its {len(times)} timed steps disagree ({min(times):.3g} s to {max(times):.3g} s, "
            f"{cost.step_spread:.1f}x, more than {MAX_STEP_SPREAD:g}x), so the machine was busy and its time is not "
            "projected; run the preflight again when nothing else runs here (uptime's load below the core count), "
            "or with more --steps."
        )
    elif judged and measured.waited is not None and measured.waited > MAX_WAITED:
        cost.problems.append(
            f"{cost.run}: its timed steps spent {measured.waited:.0%} of their ready time waiting for a CPU (over "
            f"{MAX_WAITED:.0%}: another process had it), so the machine was busy and its time is not projected; run "
            "the preflight again when nothing else runs here (uptime's load below the core count)."
        )
    elif measured.seconds is not None:
        micro = measured.seconds * cost.recipe_batch / measured.batch
        cost.step_seconds = micro * cost.accum_steps
        cost.step_images_per_s = cost.recipe_batch / micro
        cost.train_gpu_hours = cost.seeds * cost.steps * cost.step_seconds * cost.devices / 3600.0
        cost.gpu_hours = cost.train_gpu_hours + cost.sample_gpu_hours
    if measured.peak_bytes is not None:
        static = measured.static_bytes or 0
        growing = max(measured.peak_bytes - static, 0)
        cost.peak_bytes = round(static + growing * cost.recipe_batch / measured.batch)
        cost.peak_projected = measured.batch < cost.recipe_batch
    # Not fitting is not one of the run's problems: it is the table's fits column, and one sentence for all runs
    # (fit_summary), since on a small device it is true of most of them at once.
    gib = cost.device_memory / GIB
    if measured.out_of_memory_at is not None:
        cost.fits = False
        cost.fit_note = f"ran out of memory at batch {measured.out_of_memory_at}"
    elif cost.peak_bytes is not None:
        cost.fits = cost.peak_bytes <= cost.device_memory
        if not cost.fits:
            how = f"projected from batch {measured.batch}" if cost.peak_projected else "measured"
            cost.fit_note = f"needs about {cost.peak_bytes / GIB:.1f} of {gib:.1f} GiB ({how})"
