"""Whether the loader or the device bounds each classification run's step.

One CPU core's rate for each distinct input path (and, for the fast path, its device side at the run's batch)
times the node's workers, one a core and at most the recipe's ``workers``, against the images/s the step consumes.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import torch

from vcarepro.core.errors import UserError
from vcarepro.core.recipes import input_path
from vcarepro.params.runs import CLS_DATA
from vcarepro.tools.bench.timing import LOADED_SHARE
from vcarepro.tools.preflight.cost import RunCost
from vcarepro.tools.preflight.sizing import Dataset
from vcarepro.tools.preflight.table import fmt

# The device side's batch is the run's per-device batch, up to these (a CPU takes seconds a crop-and-augment batch).
DEVICE_BATCH_CAP = {"cuda": 1024, "cpu": 32}


def device_batch(recipe_batch: int, device: torch.device) -> int:
    return min(recipe_batch, DEVICE_BATCH_CAP.get(device.type, DEVICE_BATCH_CAP["cpu"]))


def loader_rates(
    runs, *, dataset: Dataset, seconds: float, device: torch.device, batches: Dict[str, int], log: Callable[[str], None]
) -> Dict[str, Dict[str, Any]]:
    """Each run's loader: images/s a core delivers on its input path and, on the fast path, its device side's
    milliseconds per image at the run's per-device batch (``batches``, capped by :func:`device_batch`). Runs that
    share a loader share its entry; a transform that raises (a bad augmentation level, an unreadable image) is a
    problem, not a crash."""
    from vcarepro.tools.bench.loader import cpu_rates, device_side, write_imagenet_like_jpegs
    from vcarepro.train.classification import build_transforms

    by_key: Dict[tuple, Dict[str, Any]] = {}
    per_run: Dict[str, Dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="preflight-jpegs-") as tmp:
        generated = None
        for run in runs:
            path = input_path(run.recipe)
            key = (path, repr(build_transforms(run.recipe, training=True)))
            if dataset.prepared:
                root, source = Path(CLS_DATA), f"the prepared {CLS_DATA}"
            else:
                if generated is None:
                    generated = write_imagenet_like_jpegs(Path(tmp) / "jpegs")
                root, source = generated, "64 photographs cut to ImageNet's size (no dataset prepared)"
            entry = by_key.setdefault(key, {"recipes": [], "input_path": path, "source": source})
            try:
                if "images_per_s" not in entry and "error" not in entry:
                    log(f"timing the {path} path of recipe {run.recipe_name}")
                    entry.update(cpu_rates(root, run.recipe, seconds=seconds, rounds=1, paths=(path,))[path])
                batch = device_batch(batches.get(run.name, 1), device)
                timed = entry.setdefault("device_side", {})
                if path == "fast" and str(batch) not in timed and "error" not in entry:
                    side = device_side(root, run.recipe, batch=batch, device=device)
                    timed[str(batch)] = side["ms_per_image"]
                    entry["device_name"] = side["device"]
            except UserError:
                raise
            except Exception as err:  # noqa: BLE001 - the transform's own failure is the finding
                first = (str(err).strip().splitlines() or [""])[-1]
                entry["error"] = (
                    f"the {path} input path of recipe {run.recipe_name} failed on {source}: "
                    f"{type(err).__name__}: {first}"
                )
            if run.recipe_name not in entry["recipes"]:
                entry["recipes"].append(run.recipe_name)
            per_run[run.name] = entry
    return per_run


def distinct(per_run: Dict[str, Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Each loader timed once, in the order first timed (:func:`loader_rates` gives runs that share one the same)."""
    return list({id(entry): entry for entry in per_run.values()}.values())


def feeding_workers(cores: float, workers: int) -> float:
    """The loader processes that feed a device at full speed: one a core, the training process keeping a core of its
    own (it launches the device's work and pins the batches), and no more than the recipe's ``workers``."""
    return min(workers, max(cores - 1, 1)) if workers > 0 else min(cores, 1)


def what_bounds(
    cost: RunCost, entry: Optional[Dict[str, Any]], cores: float, workers: int, device: torch.device
) -> Optional[str]:
    """One line: whether the run's device or its loader bounds its step when ``cores`` cores and the recipe's
    ``workers`` loader processes feed each device.

    The device consumes the recipe's per-device images over the step's time (plus the fast path's device side);
    the loader delivers :func:`feeding_workers` x one core's rate. Loader-bound, the device waits the rest of each step.
    """
    if entry is None or cost.branch != "cls":
        return None
    path = "PIL path" if entry["input_path"] == "pil" else "fast path"
    if "error" in entry or cost.step_seconds is None:
        return f"{cost.run} ({path}): not judged: its {'loader failed' if 'error' in entry else 'step was not timed'}"
    if entry["share"] < LOADED_SHARE:
        return (
            f"{cost.run} ({path}): not judged: the loader was timed while another process held the core "
            f"({entry['share']:.0%} of it); run the preflight again when nothing else runs here"
        )
    images = cost.recipe_batch * cost.accum_steps
    side = entry.get("device_side", {}).get(str(device_batch(cost.recipe_batch, device)), 0.0)
    step = cost.step_seconds + side * images / 1e3
    consumed, per_core = images / step, entry["images_per_s"]
    feeding = feeding_workers(cores, workers)
    fed = per_core * feeding
    against = " (against this CPU's projected step, not a GPU's)" if device.type == "cpu" else ""
    if fed >= consumed:
        return (
            f"{cost.run} ({path}): GPU-bound{against}: the loader feeds {fmt(fed, 3)} images/s ({feeding:g} x "
            f"{fmt(per_core, 3)} a core), the step takes {fmt(consumed, 3)}"
        )
    needed = math.ceil(consumed / per_core)
    fix = f"{needed} loader workers on a core each (the recipe has {workers}, the node {fmt(cores, 3)} cores a device)"
    other = "" if entry["input_path"] == "fast" else ", or the fast path (input_path: fast)"
    return (
        f"{cost.run} ({path}): loader-bound{against}: the device would wait {1 - fed / consumed:.0%} of each step; "
        f"it needs {fix}{other}"
    )
