"""The training input path's cost per image, both paths side by side on the same files, in one run.

The PIL path, the fast path's CPU and device sides (:mod:`vcarepro.data.fast`), and a decode-only ceiling;
per core means one thread in this process. Without ``--root`` the images are JPEGs cut from the photographs
scikit-learn and matplotlib install, at ImageNet's size (longer side 500 px, quality 90).
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import torch
from torch.utils.data import DataLoader, RandomSampler

from vcarepro.core.errors import MissingInput
from vcarepro.core.recipes import ClsRecipe
from vcarepro.tools.bench.timing import timed

LONGER_SIDE = 500  # ImageNet-1K train's most common longer side (its mean image is about 400 x 350)
IMAGE_SUFFIXES = (".jpeg", ".jpg", ".png")
# The fast path's CPU-side goal, judged within one run: per core, 3x the PIL path and 70% of the
# decode-only ceiling.
GOAL_OVER_PIL, GOAL_OF_CEILING = 3.0, 0.7


def photographs() -> List[Path]:
    """Photographs the installed packages ship: scikit-learn's two sample images and matplotlib's Grace Hopper."""
    import matplotlib
    import sklearn.datasets

    images = Path(sklearn.datasets.__file__).parent / "images"
    return [
        images / "china.jpg",
        images / "flower.jpg",
        Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg",
    ]


def write_imagenet_like_jpegs(root: str | Path, count: int = 64, seed: int = 0) -> Path:
    """``count`` photographs in the prepared layout (one class): each a random part (60-100% of each side) of one of
    :func:`photographs`, maybe mirrored, resized to a longer side of 500 px and saved at JPEG quality 90."""
    from PIL import Image

    from vcarepro.core.io import write_json
    from vcarepro.data.folders import CLASSES, whole_files, write_manifest

    root = Path(root)
    (root / "train" / "n0").mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    sources = [Image.open(path).convert("RGB") for path in photographs()]
    rows = []
    for i in range(count):
        photo = sources[i % len(sources)]
        w, h = int(photo.width * rng.uniform(0.6, 1.0)), int(photo.height * rng.uniform(0.6, 1.0))
        x, y = rng.randint(0, photo.width - w), rng.randint(0, photo.height - h)
        part = photo.crop((x, y, x + w, y + h))
        if rng.random() < 0.5:
            part = part.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        scale = LONGER_SIDE / max(part.size)
        part = part.resize((round(part.width * scale), round(part.height * scale)), Image.Resampling.BICUBIC)
        part.save(root / "train" / "n0" / f"{i}.JPEG", quality=90)
        rows.append(("train", f"train/n0/{i}.JPEG", 0))
    write_manifest(root, whole_files(root, rows))
    write_json(root / CLASSES, [{"index": 0, "wnid": "n0", "name": "photographs"}])
    return root


def as_prepared(root: str | Path, scratch: Path, limit: int) -> Path:
    """``root`` itself where it is a prepared layout, else a layout in ``scratch`` listing up to ``limit`` of the
    images under it (sorted paths, every ``len // limit``-th), less those over Pillow's pixel limit, which
    preparation counts unreadable and no input path decodes."""
    from vcarepro.core.io import write_json
    from vcarepro.data.folders import CLASSES, MANIFEST, whole_files, write_manifest

    root = Path(root)
    if (root / MANIFEST).is_file():
        return root
    listed = sorted(p.resolve() for p in root.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
    found = [p for p in listed[:: max(1, len(listed) // limit)][:limit] if not _over_pixel_limit(p)]
    if not found:
        within = " within Pillow's pixel limit" if listed else ""
        raise MissingInput(f"no .JPEG, .jpg or .png files{within} under {root}; point --root at a folder of images.")
    write_manifest(scratch, whole_files(scratch, [("train", str(p), 0) for p in found]))
    write_json(scratch / CLASSES, [{"index": 0, "wnid": "n0", "name": str(root)}])
    return scratch


def _over_pixel_limit(path: Path) -> bool:
    """Whether the image's header declares more pixels than Pillow's limit (Pillow refuses over twice it on open)."""
    from PIL import Image

    from vcarepro.data.folders import over_pixel_limit

    try:
        with Image.open(path) as img:
            return over_pixel_limit(img.width, img.height) is not None
    except Image.DecompressionBombError:
        return True
    except Exception:  # noqa: BLE001 - another fault: the decode names it, as it would in training
        return False


def _rate(step: Callable[[int], int], seconds: float) -> Dict[str, float]:
    """Images/s of ``step(i)`` (which handles some images and returns how many) on this thread, and the share of a
    core the thread had meanwhile (below 0.9 another process took part of it)."""
    images, i = 0, 0
    wall, cpu = time.perf_counter(), time.thread_time()
    while time.perf_counter() - wall < seconds or i < 2:
        images += step(i)
        i += 1
    wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
    return {"images_per_s": images / wall, "share": min(cpu / wall, 1.0)}


def path_step(root: Path, recipe: ClsRecipe, path: str, batch: int = 32) -> Callable[[int], int]:
    """One step of what is timed per core, returning its image count: ``pil``, the recipe's PIL transform on one image;
    ``fast``, the fast path's CPU side on a batch as a loader worker fetches it (read, decode, crop, collate);
    ``decode``, one whole image decoded."""
    from vcarepro.data import fast
    from vcarepro.data.folders import ManifestDataset
    from vcarepro.data.jpeg import decode_full
    from vcarepro.train.classification import build_transforms

    transform = build_transforms(recipe, training=True)
    pil = ManifestDataset(root, "train", transform)
    n = len(pil)
    if path == "fast":
        crops = fast.CropSet(root, "train", fast.Draws(transform))
        return lambda i: len(crops.collate(crops.__getitems__([(i * batch + k) % n for k in range(batch)]))[1])
    if path == "decode":
        return lambda i: decode_full(pil.samples[i % n][0]) is not None
    return lambda i: pil[i % n] is not None


def cpu_rates(root: Path, recipe: ClsRecipe, *, seconds: float, rounds: int = 3, paths=("pil", "fast", "decode")):
    """Images/s on one core of ``paths`` (:func:`path_step`): ``rounds`` rounds, the paths in turn in each, the
    median round of each (so a slow spell of the machine touches all of them alike)."""
    steps = {name: path_step(root, recipe, name) for name in paths}
    runs: Dict[str, List[Dict[str, float]]] = {name: [] for name in paths}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(rounds):
            for name in paths:
                runs[name].append(_rate(steps[name], seconds / rounds))
    finally:
        torch.set_num_threads(threads)
    return {
        name: {
            "images_per_s": statistics.median(r["images_per_s"] for r in measured),
            "rounds": [round(r["images_per_s"], 1) for r in measured],
            "share": min(r["share"] for r in measured),
        }
        for name, measured in runs.items()
    }


def device_feed(root: Path, recipe: ClsRecipe, *, batch: int, device: torch.device):
    """(the recipe's draws, a ``feed()`` giving one batch of ``batch`` crops through the fast path's device side as
    training's :class:`~vcarepro.data.fast.DevicePrefetcher` runs it: resize, flip, RandAugment, normalize, erase)."""
    from vcarepro.data import fast
    from vcarepro.train.classification import build_transforms

    draws = fast.Draws(build_transforms(recipe, training=True))
    crops = fast.CropSet(root, "train", draws)
    host, labels = crops.collate([crops[i % len(crops)] for i in range(batch)])
    if device.type == "cuda":
        host, labels = host.pin_memory(), labels.pin_memory()
    prefetcher = fast.DevicePrefetcher([], draws, device)
    return draws, lambda: prefetcher.prepare(host, labels)


def device_side(root: Path, recipe: ClsRecipe, *, batch: int, device: torch.device, repeats: int = 3):
    """Milliseconds per image of the fast path's device side (:func:`device_feed`) after a warm-up."""
    _, feed = device_feed(root, recipe, batch=batch, device=device)
    feed()
    seconds = timed(feed, repeats, device=device)
    return {"ms_per_image": seconds * 1e3 / batch, "batch": batch, "device": _device_name(device)}


def worker_rates(root: Path, recipe: ClsRecipe, *, workers: int, seconds: float, batch: int = 32):
    """Images/s per worker process of both paths through the DataLoader with ``workers`` processes (the fast path
    ships uint8 crops, the PIL path float32 images)."""
    from vcarepro.data import fast
    from vcarepro.data.folders import ManifestDataset
    from vcarepro.train.classification import build_transforms

    transform = build_transforms(recipe, training=True)
    crops = fast.CropSet(root, "train", fast.Draws(transform))
    sets = {"pil": (ManifestDataset(root, "train", transform), None), "fast": (crops, crops.collate)}
    return {
        name: loader_throughput(data, workers=workers, seconds=seconds, batch=batch, collate_fn=collate)
        for name, (data, collate) in sets.items()
    }


def loader_throughput(
    dataset, *, workers: int, batch: int = 16, seconds: float = 4.0, min_batches: int = 0, collate_fn=None
) -> Dict[str, float]:
    """Images/s of a ``DataLoader`` over ``dataset`` with ``workers`` processes, measured for ``seconds``.

    The clock starts when the first batch arrives; at least ``max(2, min_batches)`` batches are
    counted after it, so that every worker has delivered once.
    """
    if len(dataset) == 0:
        raise ValueError("the dataset is empty")
    sampler = RandomSampler(dataset, replacement=True, num_samples=10**9, generator=torch.Generator().manual_seed(0))
    loader = DataLoader(dataset, batch_size=batch, sampler=sampler, num_workers=workers, collate_fn=collate_fn)
    images = batches = 0
    started = None
    iterator = iter(loader)
    try:
        while True:
            _, labels = next(iterator)
            if started is None:
                started = time.perf_counter()
                continue
            images += len(labels)
            batches += 1
            if batches >= max(2, min_batches) and time.perf_counter() - started >= seconds:
                break
    finally:
        del iterator  # shuts the workers down
    elapsed = time.perf_counter() - started
    rate = images / elapsed
    return {"images_per_s": rate, "per_worker": rate / max(workers, 1), "workers": workers, "batch": batch}


def bench_loader(
    *,
    root: Optional[str | Path] = None,
    recipe_name: str = "lab_deit_tiny",
    seconds: float = 6.0,
    device: Optional[str] = None,
    batch: Optional[int] = None,
    workers: Optional[int] = None,
    images: int = 64,
) -> Dict[str, Any]:
    """Every figure of the input path for a paper-scale recipe (its augmentation at 224 px), in one run."""
    import os

    from vcarepro.params.config import compose
    from vcarepro.params.runs import cls_recipe

    recipe = cls_recipe(compose(["scale=paper"]), recipe_name).model_copy(update={"input_path": "fast"})
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    per_device = recipe.batch_size // 8  # the recipe's batch on each of a node's 8 GPUs
    batch = batch or (per_device if device.type == "cuda" else 32)
    workers = (os.cpu_count() or 1) if workers is None else workers
    with tempfile.TemporaryDirectory(prefix="bench-loader-") as tmp:
        if root is None:
            data, source = (
                write_imagenet_like_jpegs(Path(tmp), count=images),
                f"{images} photographs cut to ImageNet's size",
            )
        else:
            data, source = as_prepared(root, Path(tmp), images), str(root)
        from vcarepro.data.folders import read_manifest

        files = len(read_manifest(data, "train"))
        figures: Dict[str, Any] = {"recipe": recipe_name, "source": source, "files": files}
        figures["per_core"] = cpu_rates(data, recipe, seconds=seconds)
        figures["device_side"] = device_side(data, recipe, batch=batch, device=device)
        if workers > 0:
            figures["workers"] = worker_rates(data, recipe, workers=workers, seconds=seconds / 3)
    figures["goal"] = goal(figures["per_core"])
    return figures


def goal(per_core: Dict[str, Dict[str, float]]) -> Dict[str, Any]:
    fast, pil, ceiling = (per_core[k]["images_per_s"] for k in ("fast", "pil", "decode"))
    over_pil, of_ceiling = fast / pil, fast / ceiling
    loaded = min(r["share"] for r in per_core.values()) < 0.9
    return {
        "over_pil": over_pil,
        "of_ceiling": of_ceiling,
        "met": over_pil >= GOAL_OVER_PIL and of_ceiling >= GOAL_OF_CEILING,
        "loaded": loaded,
    }


def loader_table(figures: Dict[str, Any]) -> str:
    """The figures as a Markdown table and the goal's verdict, for the terminal and docs/performance.md."""
    core, dev = figures["per_core"], figures["device_side"]
    rows = [
        ("PIL path (timm's transform)", core["pil"]),
        ("fast path, CPU side (read, decode, crop, collate)", core["fast"]),
        ("decode only (libjpeg-turbo, whole image)", core["decode"]),
    ]
    workers = figures.get("workers")
    head = "| per CPU core | images/s | rounds |" + (
        f" through the DataLoader, {workers['pil']['workers']} workers, per worker |" if workers else ""
    )
    lines = [head, "|---|---:|---|" + ("---:|" if workers else "")]
    for (label, r), key in zip(rows, ("pil", "fast", "decode")):
        through = f" {workers[key]['per_worker']:.0f} |" if workers and key in workers else (" - |" if workers else "")
        lines.append(f"| {label} | {r['images_per_s']:.0f} | {', '.join(f'{x:.0f}' for x in r['rounds'])} |{through}")
    g = figures["goal"]
    verdict = "met" if g["met"] else "missed"
    if g["loaded"]:
        verdict = "not judged: another process held the core while it was timed; run it on a quiet machine"
    lines += [
        "",
        f"fast path's device side on {dev['device']}: {dev['ms_per_image']:.3f} ms per image (batch {dev['batch']})",
        f"goal (CPU side >= {GOAL_OVER_PIL:g}x the PIL path and >= {GOAL_OF_CEILING:.0%} of the decode-only "
        f"ceiling, per core): {verdict}: {g['over_pil']:.2f}x the PIL path, {g['of_ceiling']:.0%} of the ceiling",
    ]
    return "\n".join(lines)


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "the CPU (not a GPU measurement)"
