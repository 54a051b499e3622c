"""Pixel-space generation data (embedded scale): the prepared classification train split, resized.

Stored as ``train.safetensors`` with ``images`` (uint8, N x C x H x W: also the FID
reference set, as DiT measures against training-set statistics), ``inputs`` (the
same images in model space, float32 in [-1, 1]) and ``labels``. One channel for
grayscale sources. Paper scale stores VAE latents in the same keys' place.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict

import numpy as np
import torch
from PIL import Image

from vcarepro.core.errors import BadInput
from vcarepro.data.folders import decoded_image, read_classes, read_manifest


def load_split_pixels(cls_root: str | Path, split: str, image_size: int) -> Dict[str, torch.Tensor]:
    """The images of a prepared split, resized (bicubic) to image_size, as uint8 tensors with labels."""
    cls_root = Path(cls_root)
    images, labels = [], []
    for image, label in read_manifest(cls_root, split):
        with decoded_image(image) as img:
            mode = "L" if img.mode in ("L", "1", "I;16") else "RGB"
            img = img.convert(mode).resize((image_size, image_size), Image.BICUBIC)
        arr = np.asarray(img, dtype=np.uint8)
        images.append(arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1))
        labels.append(label)
    if len({a.shape for a in images}) != 1:
        raise BadInput(f"{cls_root} mixes grayscale and colour images; convert them to one mode first.")
    uint8 = torch.from_numpy(np.stack(images))
    return {
        "images": uint8,
        "inputs": uint8.float() / 127.5 - 1.0,
        "labels": torch.tensor(labels, dtype=torch.long),
        "num_classes": torch.tensor(len(read_classes(cls_root))),
    }
