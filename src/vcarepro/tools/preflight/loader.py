"""Whether the loader or the device bounds each classification run's step.

For each distinct training input of the runs (input path and transform) it times what one CPU core delivers (the PIL
path's transform, or the fast path's read, decode, crop and collate) and, for the fast path, its device side per
image on the device at hand, on the prepared data or on generated ImageNet-sized photographs. A node's
``cores_per_device`` cores then feed ``cores x that rate`` images/s to each device, against the images/s the run's
step (plus the device side) consumes.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import torch

from vcarepro.core.choices import input_path
from vcarepro.core.errors import UserError
from vcarepro.params.runs import CLS_DATA
from vcarepro.tools.preflight.cost import RunCost
from vcarepro.tools.preflight.sizing import Dataset
from vcarepro.tools.preflight.table import fmt

DEVICE_BATCH = 32  # crops of the device side's timed batch (per image it changes little above this)


def loader_rates(
    runs, *, dataset: Dataset, seconds: float, device: torch.device, log: Callable[[str], None]
) -> Dict[str, Dict[str, Any]]:
    """Each run's loader: images/s a core delivers on its input path and, on the fast path, its device side's
    milliseconds per image. Runs that share one share the entry; a transform that raises (a bad augmentation level,
    an unreadable image) is a problem, not a crash."""
    from vcarepro.tools.bench.loader import cpu_rates, device_side, write_imagenet_like_jpegs
    from vcarepro.train.classification import build_transforms

    by_key: Dict[tuple, Dict[str, Any]] = {}
    per_run: Dict[str, Dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="preflight-jpegs-") as tmp:
        generated = None
        for run in runs:
            path = input_path(run.recipe)
            key = (path, repr(build_transforms(run.recipe, training=True)))
            if key not in by_key:
                if dataset.prepared:
                    root, source = Path(CLS_DATA), f"the prepared {CLS_DATA}"
                else:
                    if generated is None:
                        generated = write_imagenet_like_jpegs(Path(tmp) / "jpegs")
                    root, source = generated, "64 photographs cut to ImageNet's size (no dataset prepared)"
                log(f"timing the {path} path of recipe {run.recipe_name}")
                entry: Dict[str, Any] = {"recipes": [], "input_path": path, "source": source}
                try:
                    entry.update(cpu_rates(root, run.recipe, seconds=seconds, rounds=1, paths=(path,))[path])
                    if path == "fast":
                        timed = device_side(root, run.recipe, batch=DEVICE_BATCH, device=device)
                        entry.update(device_ms_per_image=timed["ms_per_image"], device_name=timed["device"])
                except UserError:
                    raise
                except Exception as err:  # noqa: BLE001 - the transform's own failure is the finding
                    first = (str(err).strip().splitlines() or [""])[-1]
                    entry["error"] = (
                        f"the {path} input path of recipe {run.recipe_name} failed on {source}: "
                        f"{type(err).__name__}: {first}"
                    )
                by_key[key] = entry
            if run.recipe_name not in by_key[key]["recipes"]:
                by_key[key]["recipes"].append(run.recipe_name)
            per_run[run.name] = by_key[key]
    return per_run


def distinct(per_run: Dict[str, Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Each loader timed once, in the order first timed (:func:`loader_rates` gives runs that share one the same)."""
    return list({id(entry): entry for entry in per_run.values()}.values())


def what_bounds(cost: RunCost, entry: Optional[Dict[str, Any]], cores: float, cpu: bool) -> Optional[str]:
    """One line: whether the run's device or its loader bounds its step when ``cores`` cores feed each device.

    The device consumes the recipe's per-device images over the step's time (plus the fast path's device side);
    the loader delivers ``cores`` x one core's rate. Loader-bound, the device waits the rest of each step.
    """
    if entry is None or cost.branch != "cls":
        return None
    path = "PIL path" if entry["input_path"] == "pil" else "fast path"
    if "error" in entry or cost.step_seconds is None:
        return f"{cost.run} ({path}): not judged: its {'loader failed' if 'error' in entry else 'step was not timed'}"
    from vcarepro.tools.bench.timing import LOADED_SHARE  # here: torch.utils.benchmark notes CUDA at import

    if entry["share"] < LOADED_SHARE:
        return (
            f"{cost.run} ({path}): not judged: the loader was timed while another process held the core "
            f"({entry['share']:.0%} of it); run the preflight again when nothing else runs here"
        )
    images = cost.recipe_batch * cost.accum_steps
    step = cost.step_seconds + entry.get("device_ms_per_image", 0.0) * images / 1e3
    consumed, per_core = images / step, entry["images_per_s"]
    fed = per_core * cores
    against = " (against this CPU's projected step, not a GPU's)" if cpu else ""
    if fed >= consumed:
        return (
            f"{cost.run} ({path}): GPU-bound{against}: {cores:g} cores feed {fmt(fed, 3)} images/s, the step takes "
            f"{fmt(consumed, 3)}"
        )
    needed = math.ceil(consumed / per_core)
    other = "" if entry["input_path"] == "fast" else ", or the fast path (input_path: fast)"
    return (
        f"{cost.run} ({path}): loader-bound{against}: the device would wait {1 - fed / consumed:.0%} of each step; "
        f"it needs {needed} cores per device{other}"
    )
