"""The data loader's throughput: images/s of each distinct training transform of the classification runs at its
recipe's workers, on the prepared data or on generated ImageNet-like JPEGs."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, List

from vcarepro.core.errors import UserError
from vcarepro.params.runs import CLS_DATA
from vcarepro.tools.preflight.sizing import Dataset

LOADER_BATCH = 16


def loader_rates(runs, *, dataset: Dataset, seconds: float, log: Callable[[str], None]) -> Dict[str, Dict[str, Any]]:
    """Images/s of each distinct (training transform, workers) among the classification runs, keyed by run.

    A transform that raises (a bad augmentation level, an unreadable image) is a problem, not a crash.
    """
    from vcarepro.data.folders import ManifestDataset
    from vcarepro.train.classification import build_transforms

    by_key: Dict[tuple, Dict[str, Any]] = {}
    per_run: Dict[str, Dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="preflight-jpegs-") as tmp:
        generated = None
        for run in runs:
            transform = build_transforms(run.recipe, training=True)
            key = (repr(transform), run.recipe["workers"])
            if key not in by_key:
                if dataset.prepared:
                    root, source = CLS_DATA, f"the prepared {CLS_DATA}"
                else:
                    if generated is None:
                        from vcarepro.tools.bench.loader import write_imagenet_like_jpegs

                        generated = write_imagenet_like_jpegs(Path(tmp) / "jpegs")
                    root, source = generated, "64 generated 500 x 375 JPEGs (no dataset prepared)"
                workers = run.recipe["workers"]
                log(f"timing the loader of recipe {run.recipe_name} ({workers} workers)")
                entry = {"recipes": [], "workers": workers, "source": source, "transform": repr(transform)}
                try:
                    from vcarepro.tools.bench.loader import loader_throughput

                    data = ManifestDataset(root, "train", transform)
                    entry.update(
                        loader_throughput(
                            data,
                            workers=workers,
                            seconds=seconds,
                            batch=min(LOADER_BATCH, max(1, run.recipe["batch_size"])),
                            min_batches=workers,
                        )
                    )
                except UserError:
                    raise
                except Exception as err:  # noqa: BLE001 - the transform's own failure is the finding
                    first = (str(err).strip().splitlines() or [""])[-1]
                    entry["error"] = (
                        f"the training transform of recipe {run.recipe_name} failed on {source}: "
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
