"""What one run will cost: :class:`RunCost`, a run's recipe beside what was measured on this machine, projected to
the recipe's batch (the step time, the device-hours, the peak memory per device) and whether that peak fits."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from vcarepro.tools.bench.timing import GIB, Measured


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
    cost.step_spread = measured.spread
    load = measured.under_load()
    if load:
        cost.problems.append(
            f"{cost.run}: {load}, so the machine was busy and its time is not projected; run the preflight again "
            "when nothing else runs here (uptime's load below the core count)"
            + (", or with more --steps." if measured.disagree else ".")
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
