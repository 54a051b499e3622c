"""Classification and generation as one path. What differs between the two branches is held as data, a
:class:`Branch`: how a run is sized (:mod:`.sizing`), which training step is built, and whether the run samples;
:func:`run_cost` steps a run of either branch and projects its cost."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

import torch

from vcarepro.tools.bench.timing import measure_step
from vcarepro.tools.preflight.cost import RunCost, fill_costs
from vcarepro.tools.preflight.sampling import sampling_cost
from vcarepro.tools.preflight.sizing import Dataset, size_cls_run, size_gen_run


@dataclass
class Branch:
    name: str  # cls or gen
    title: str  # what the inputs section calls it
    runs: List[Any]  # the selected runs' specs (vcarepro.params.runs)
    dataset: Dataset
    size: Callable[[Any, Dataset, int], RunCost]  # (run, dataset, devices) -> the cost's recipe half, no timing
    step: Callable[..., Any]  # the training step's builder (vcarepro.tools.bench.train_step)
    step_options: Dict[str, Any]  # what the builder takes beyond the run, the batch and the device
    samples: bool = False  # the run's cost includes sampling


def classification(runs: List[Any], dataset: Dataset, *, num_classes: int) -> Branch:
    from vcarepro.tools.bench.train_step import classification_step

    return Branch(
        "cls", "classification", runs, dataset, size_cls_run, classification_step, {"num_classes": num_classes}
    )


def generation(runs: List[Any], dataset: Dataset) -> Branch:
    from vcarepro.tools.bench.train_step import generation_step

    return Branch("gen", "generation", runs, dataset, size_gen_run, generation_step, {}, samples=True)


def run_cost(
    branch: Branch, run, *, devices: int, cap: Optional[int], device: torch.device, memory: int, repeats: int
) -> RunCost:
    """``run`` of ``branch`` sized for ``devices`` of ``memory`` bytes, its training step run on ``device`` at the
    recipe's per-device batch (or ``cap`` where smaller), a generation run's sampling timed on the built model, and
    its cost projected to the recipe. A run whose batch cannot be split over the devices is sized, not stepped."""
    cost = branch.size(run, branch.dataset, devices)
    cost.device_memory = memory
    if cost.recipe_batch < 1:
        return cost
    sample: Dict[str, Any] = {}

    def time_sampling(step) -> None:
        sample.update(sampling_cost(run, step, seeds=cost.seeds, cap=cap, device=device, repeats=repeats))

    batch = min(cost.recipe_batch, cap) if cap else cost.recipe_batch
    measured = measure_step(
        lambda b: branch.step(run, batch=b, device=str(device), **branch.step_options),
        batch,
        device,
        repeats=repeats,
        after=time_sampling if branch.samples else None,
    )
    if sample:
        cost.sampling = sample
        cost.sample_gpu_hours = sample["gpu_hours"]
    fill_costs(cost, measured)
    return cost
