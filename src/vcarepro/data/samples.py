"""Generated samples on disk in the ADM evaluator's format.

One ``.npz`` per seed: ``arr_0`` uint8 (N, H, W, C) images and ``arr_1`` int64 (N,)
class labels, as openai/guided-diffusion's samplers write them and its evaluator
(and ours) read them. Sampling writes into ``.npy`` memory maps next to the target
and zips them (stored, not compressed) at the end, so 50,000 images at 256 px (9.8 GB)
never sit in memory at once and no ``.npz`` exists until every sample is in it.
"""
from __future__ import annotations

import os
import zipfile
from pathlib import Path
from typing import Tuple

import numpy as np
import torch


class NpzSampleWriter:
    """Fill ``num`` samples of ``image_shape`` (H, W, C) by index, then ``close()`` into ``path``."""

    def __init__(self, path: str | Path, num: int, image_shape: Tuple[int, int, int]):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._images_path = self.path.with_name(f".{self.path.stem}.arr_0.npy")
        self._labels_path = self.path.with_name(f".{self.path.stem}.arr_1.npy")
        self.images = np.lib.format.open_memmap(self._images_path, mode="w+", dtype=np.uint8,
                                                shape=(num, *image_shape))
        self.labels = np.lib.format.open_memmap(self._labels_path, mode="w+", dtype=np.int64, shape=(num,))

    def write(self, start: int, images_nchw: torch.Tensor, labels: torch.Tensor) -> None:
        """Store uint8 (B, C, H, W) images and their labels at positions ``start .. start + B``."""
        stop = start + len(images_nchw)
        self.images[start:stop] = images_nchw.permute(0, 2, 3, 1).cpu().numpy()
        self.labels[start:stop] = labels.cpu().numpy()

    def close(self) -> Path:
        self.images.flush()
        self.labels.flush()
        del self.images, self.labels
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
            archive.write(self._images_path, arcname="arr_0.npy")
            archive.write(self._labels_path, arcname="arr_1.npy")
        os.replace(tmp, self.path)
        self._images_path.unlink()
        self._labels_path.unlink()
        return self.path


def read_samples(path: str | Path) -> Tuple[np.ndarray, np.ndarray]:
    """``(images (N, H, W, C) uint8, labels (N,) int64)`` from a sample ``.npz`` (nothing unpickled)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; run the sample_gen stage for this run first.")
    with np.load(path, allow_pickle=False) as data:
        if "arr_0" not in data.files:
            raise ValueError(f"{path} has no arr_0 image array; give an ADM-format sample batch.")
        images = data["arr_0"]
        labels = data["arr_1"] if "arr_1" in data.files else np.full(len(images), -1, dtype=np.int64)
    if images.dtype != np.uint8 or images.ndim != 4:
        raise ValueError(f"{path}: arr_0 must be uint8 (N, H, W, C), got {images.dtype} {images.shape}.")
    return images, labels
