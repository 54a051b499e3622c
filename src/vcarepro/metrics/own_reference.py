"""Our own reference statistics: the real-image side of a FID measured without ADM's reference batch.

At embedded scale over every training digit (data/gen/train.safetensors); at paper scale over the
prepared ImageNet train split, center-cropped the ADM way, with sFID's spatial statistics
(``fid_reference.own_statistics``, or ``adm_npz: null``). ``stages/fid_reference.py`` writes them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict

import numpy as np
import torch
from safetensors.torch import load_file
from torch.utils.data import DataLoader

from vcarepro.data.folders import ManifestDataset
from vcarepro.data.latents import adm_center_crop
from vcarepro.metrics.fid_reference import reference_from_images


def _crop_to_uint8(size: int):
    def transform(image):
        return torch.from_numpy(np.asarray(adm_center_crop(image, size), dtype=np.uint8).copy()).permute(2, 0, 1)

    return transform


def imagenet_dataset(cls_data: str | Path, image_size: int) -> ManifestDataset:
    """The prepared train split under ``cls_data`` as uint8 (3, S, S) images, ADM-center-cropped to S."""
    return ManifestDataset(cls_data, "train", _crop_to_uint8(image_size))


def imagenet_batches(dataset: ManifestDataset, batch_size: int, workers: int):
    """uint8 (B, 3, S, S) batches of ``dataset`` (:func:`imagenet_dataset`), in order."""
    for images, _ in DataLoader(dataset, batch_size=batch_size, num_workers=workers, shuffle=False):
        yield images


def own_reference(meta: Dict[str, Any], p: Dict[str, Any], extractor, *, gen_data: str | Path, cls_data: str | Path):
    """Our own statistics of the training images: (stats, kept features, spatial stats or None, source).

    ``meta``: data/gen/meta.json (pixels or VAE latents); ``p``: the ``fid_reference`` params.
    """
    if meta["kind"] == "pixels":
        images = load_file(str(Path(gen_data) / "train.safetensors"))["images"]
        batches = (images[i : i + p["batch_size"]] for i in range(0, len(images), p["batch_size"]))
        stats, features = reference_from_images(
            batches, extractor, keep_features=p["keep_features"], seed=p["seed"], total=len(images)
        )
        return stats, features, None, f"{gen_data}/train.safetensors (the training digits)"
    dataset = imagenet_dataset(cls_data, meta["image_size"])
    stats, features, spatial = reference_from_images(
        imagenet_batches(dataset, p["batch_size"], p["workers"]),
        extractor,
        keep_features=p["keep_features"],
        seed=p["seed"],
        spatial=True,
        total=len(dataset),
    )
    return stats, features, spatial, f"{cls_data} train split, ADM center crop to {meta['image_size']} px"
