"""Data-loader throughput: images/s through a recipe's training transform at its number of workers.

:func:`loader_throughput` draws images (with replacement, so a small set never runs dry) from a
prepared classification set or from :func:`write_imagenet_like_jpegs`, decodes and augments them in
``workers`` processes as the training loader does, and counts what arrives after the first batch
(worker start-up and the first decodes are not throughput).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Dict

import torch
from torch.utils.data import DataLoader, RandomSampler

# ImageNet-1K train's most common size (its mean is about 400 x 350); quality 90 as camera JPEGs
IMAGENET_LIKE_SIZE = (500, 375)


def write_imagenet_like_jpegs(root: str | Path, count: int = 64, size=IMAGENET_LIKE_SIZE, seed: int = 0) -> Path:
    """``count`` JPEGs of ImageNet's size in the prepared layout (one class), smooth like photographs.

    White noise compresses and decodes unlike photographs; low-frequency colour fields with a little
    grain come closer to ImageNet's file sizes (about 110 KB at this size).
    """
    import numpy as np
    from PIL import Image

    from vcarepro.data.folders import write_manifest

    root = Path(root)
    rng = np.random.default_rng(seed)
    (root / "train" / "n0").mkdir(parents=True, exist_ok=True)
    width, height = size
    rows = []
    for i in range(count):
        coarse = Image.fromarray(rng.integers(0, 256, (12, 16, 3), dtype=np.uint8)).resize(
            (width, height), Image.BICUBIC
        )
        pixels = np.asarray(coarse, dtype=np.int16) + rng.integers(-12, 13, (height, width, 3))
        path = root / "train" / "n0" / f"{i}.JPEG"
        Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(path, quality=90)
        rows.append(("train", str(path.relative_to(root)), 0))
    write_manifest(root, rows)
    (root / "classes.json").write_text('[{"index": 0, "wnid": "n0", "name": "generated"}]')
    return root


def loader_throughput(
    dataset, *, workers: int, batch: int = 16, seconds: float = 4.0, min_batches: int = 0
) -> Dict[str, float]:
    """Images/s of a ``DataLoader`` over ``dataset`` with ``workers`` processes, measured for ``seconds``.

    The clock starts when the first batch arrives; at least ``max(2, min_batches)`` batches are
    counted after it, so that every worker has delivered once.
    """
    if len(dataset) == 0:
        raise ValueError("the dataset is empty")
    sampler = RandomSampler(dataset, replacement=True, num_samples=10**9, generator=torch.Generator().manual_seed(0))
    loader = DataLoader(dataset, batch_size=batch, sampler=sampler, num_workers=workers)
    images = batches = 0
    started = None
    iterator = iter(loader)
    try:
        while True:
            images_batch, _ = next(iterator)
            if started is None:
                started = time.perf_counter()
                continue
            images += len(images_batch)
            batches += 1
            if batches >= max(2, min_batches) and time.perf_counter() - started >= seconds:
                break
    finally:
        del iterator  # shuts the workers down
    elapsed = time.perf_counter() - started
    return {"images_per_s": images / elapsed, "images": images, "seconds": elapsed, "workers": workers, "batch": batch}
