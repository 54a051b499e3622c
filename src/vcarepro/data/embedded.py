"""The embedded dataset: scikit-learn's handwritten digits, exported to the prepared layout.

``sklearn.datasets.load_digits`` ships inside the package (no network): 1,797 real
8x8 grayscale scans with values 0..16, 10 classes. They are encoded as 8x8 PNG files
(values scaled to 0..255), with a stratified train/val split, and packed into one tar that
the manifest indexes as ImageNet's archives are, so every later stage reads them with the code
that reads ImageNet.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from vcarepro.core.errors import BadInput
from vcarepro.core.io import atomic_directory, write_json
from vcarepro.data.folders import CLASSES, PACKED, pack, write_manifest, write_sources


def export_digits(out: str | Path, *, val_fraction: float = 0.2, seed: int = 0) -> dict:
    """Write the digits to ``out`` (replaced atomically); returns the counts per split."""
    if not 0.0 < val_fraction < 1.0:
        raise BadInput(f"val_fraction={val_fraction} must lie strictly between 0 and 1.")
    digits = load_digits()
    images = np.rint(digits.images * (255.0 / 16.0)).astype(np.uint8)  # 0..16 -> 0..255
    labels = digits.target.astype(int)
    index = np.arange(len(labels))
    train_idx, val_idx = train_test_split(index, test_size=val_fraction, random_state=seed, stratify=labels)

    items = []
    for split, split_idx in (("train", train_idx), ("val", val_idx)):
        for i in sorted(split_idx):
            png = io.BytesIO()
            Image.fromarray(images[i], mode="L").save(png, "PNG")
            items.append((split, f"{split}/digit_{labels[i]}/{i:04d}.png", int(labels[i]), png.getvalue()))
    with atomic_directory(out) as tmp:
        classes = [{"index": c, "wnid": f"digit_{c}", "name": str(c)} for c in range(10)]
        write_json(tmp / CLASSES, classes)
        write_manifest(tmp, pack(tmp, items))
        write_sources(tmp, [PACKED])
    return {"train": len(train_idx), "val": len(val_idx), "classes": 10}
