"""How big a run is: the data a scale trains on (prepared here, or its known size), and from that and the recipe a
run's per-device batch and optimizer steps, with the sizes that cannot work (a batch smaller than the devices, a split
smaller than one batch, an odd batch that mixup cannot pair)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Tuple

from vcarepro.params.runs import CLS_DATA, GEN_DATA
from vcarepro.tools.preflight.cost import RunCost

# Training images of the classification set per scale when it is not prepared here: ImageNet-1K's
# train split, and ImageNet-100 of CMC's class list as commonly reported for it.
KNOWN_TRAIN_IMAGES = {"paper": 1_281_167, "proxy": 126_689}
DIGITS = 1797  # scikit-learn's load_digits, the embedded scale's source


def standins(params: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The smoke scale's ``smoke`` section (the sizes of the stand-in inputs the pipeline generates) and their root."""
    from vcarepro.params.runs import SMOKE_INPUTS

    section = params.get("smoke")
    return {**section, "root": str(SMOKE_INPUTS)} if isinstance(section, dict) else None


def _reads_standins(params: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The stand-ins' section where the classification data comes from the stand-in ImageNet (smoke), else None."""
    found = standins(params)
    return found if found and str(params["prepare_cls"]["imagenet_root"]).startswith(str(found["root"])) else None


def expected_classes(params: Dict[str, Any]) -> int:
    prep = params["prepare_cls"]
    if prep["source"] == "digits":
        return 10
    found = _reads_standins(params)
    if found:
        return int(found["classes"])
    if prep.get("subset_classes"):
        return len(prep["subset_classes"])
    return prep.get("subset_count") or 1000


def known_train_images(params: Dict[str, Any], scale: str) -> tuple[int, str]:
    """(training images, where the number comes from) when the dataset is not prepared here."""
    prep = params["prepare_cls"]
    if prep["source"] == "digits":  # train_test_split puts ceil(fraction x n) into val
        return DIGITS - math.ceil(prep["val_fraction"] * DIGITS), "the digits' split (1,797 images)"
    found = _reads_standins(params)
    if found:
        return int(found["classes"]) * int(found["train_per_class"]), "the stand-in ImageNet's size (smoke)"
    if scale in KNOWN_TRAIN_IMAGES:
        name = "ImageNet-1K" if scale == "paper" else "ImageNet-100"
        return KNOWN_TRAIN_IMAGES[scale], f"{name}'s known count"
    k = expected_classes(params)
    return round(KNOWN_TRAIN_IMAGES["paper"] * k / 1000), f"estimated: {k} of ImageNet-1K's 1000 classes"


def known_val_images(params: Dict[str, Any]) -> int:
    """Validation images of the classification set: the digits' split, the stand-ins' count, else ImageNet's
    50,000 in proportion to the classes kept."""
    from vcarepro.data.imagenet import EXPECTED

    prep = params["prepare_cls"]
    if prep["source"] == "digits":
        return math.ceil(prep["val_fraction"] * DIGITS)
    found = _reads_standins(params)
    if found:
        return int(found["classes"]) * int(found["val_per_class"])
    return round(EXPECTED["val"] * expected_classes(params) / EXPECTED["classes"])


@dataclass
class Dataset:
    branch: str
    prepared: bool
    train_images: int
    source: str  # a sentence: where the count comes from


def _prepared_cls(params: Dict[str, Any], root: Path) -> Tuple[Optional[int], str]:
    from vcarepro.data.folders import read_classes, read_manifest

    if not ((root / "classes.json").is_file() and (root / "manifest.csv").is_file()):
        return None, ""
    classes = len(read_classes(root))
    if classes != expected_classes(params):
        return None, f"{classes} classes, not {expected_classes(params)}"
    n = len(read_manifest(root, "train"))
    return n, f"{classes} classes, {n:,} training images"


def _prepared_gen(params: Dict[str, Any], root: Path) -> Tuple[Optional[int], str]:
    meta_path = root / "meta.json"
    if not meta_path.is_file():
        return None, ""
    meta = json.loads(meta_path.read_text())
    kind = "pixels" if params["prepare_gen"]["source"] == "pixels" else "vae_latents"
    if meta.get("kind") != kind or meta.get("num_classes") != expected_classes(params):
        return None, f"{meta.get('kind')}, {meta.get('num_classes')} classes"
    n = int(meta["num_images"])
    return n, f"{meta['kind']}, {n:,} training examples"


# branch -> (where its stage prepares it, that stage, what it counts, the reader of what is there: (count, what it
# holds) where the folder holds this scale's data, (None, what it holds instead) or (None, "") where nothing is there)
PREPARED: Dict[str, Tuple[Path, str, str, Callable[[Dict[str, Any], Path], Tuple[Optional[int], str]]]] = {
    "cls": (CLS_DATA, "prepare_cls", "training images", _prepared_cls),
    "gen": (GEN_DATA, "prepare_gen", "training examples", _prepared_gen),
}


def dataset(branch: str, params: Dict[str, Any], scale: str, root: Optional[Path] = None) -> Dataset:
    """The training data of ``branch`` (cls or gen): counted where its stage prepared this scale's data under ``root``
    (default: where the stage writes it), else the size known for the scale, with a sentence saying which."""
    default_root, stage, counted, read = PREPARED[branch]
    root = default_root if root is None else root
    n, held = read(params, root)
    if n is not None:
        return Dataset(branch, True, n, f"{root} prepared ({held})")
    note = (
        f"{root} holds another scale's data ({held})"
        if held
        else f"{root} is not prepared (dvc repro {stage} makes it)"
    )
    n, origin = known_train_images(params, scale)
    return Dataset(branch, False, n, f"{note}; {n:,} {counted} from {origin}")


def _model(run) -> str:
    return run.model["arch"] + "/" + run.model["attention"]


def size_cls_run(run, dataset: Dataset, devices: int) -> RunCost:
    """A ``cls_runs`` entry on ``devices``: per-device batch global / (devices x accum_steps), steps from the recipe's
    epochs over the dataset, and the sizes that cannot work as problems."""
    from vcarepro.train.classification import recipe_steps

    recipe = run.recipe
    accum, global_batch = recipe.accum_steps, recipe.batch_size
    cost = RunCost(
        run.name,
        "cls",
        _model(run),
        run.recipe_name,
        recipe.precision,
        len(run.seeds),
        devices,
        accum,
        global_batch,
        global_batch // (devices * accum),
        steps=recipe_steps(recipe, dataset.train_images),
    )
    if cost.recipe_batch < 1:
        cost.problems.append(
            f"{run.name}: batch_size={global_batch} is smaller than {devices} device(s) x "
            f"accum_steps={accum}; raise batch_size or lower accum_steps."
        )
        return cost
    if dataset.train_images < global_batch:
        cost.problems.append(
            f"{run.name}: the training split has {dataset.train_images:,} images, fewer than one "
            f"global batch of {global_batch}, so no step would run; lower batch_size."
        )
    if (recipe.mixup > 0 or recipe.cutmix > 0) and cost.recipe_batch % 2:
        cost.problems.append(
            f"{run.name}: the per-device batch {cost.recipe_batch} is odd and recipe "
            f"{run.recipe_name} mixes images (mixup/cutmix), which timm's Mixup refuses; choose "
            f"a device count that leaves an even per-device batch."
        )
    return cost


def size_gen_run(run, dataset: Dataset, devices: int) -> RunCost:
    """A ``gen_runs`` entry on ``devices``: per-device batch global / devices, the recipe's steps, and a batch the
    devices or the dataset cannot fill as a problem."""
    recipe = run.recipe
    global_batch = recipe.batch_size
    cost = RunCost(
        run.name,
        "gen",
        _model(run),
        run.objective,
        recipe.precision,
        len(run.seeds),
        devices,
        1,
        global_batch,
        global_batch // devices,
        steps=recipe.steps,
    )
    if cost.recipe_batch < 1 or cost.recipe_batch > dataset.train_images // devices:
        cost.problems.append(
            f"{run.name}: gen_recipe.batch_size={global_batch} cannot be filled by {devices} "
            f"device(s) from {dataset.train_images:,} training examples; choose a batch between "
            f"the device count and the dataset size."
        )
    return cost
