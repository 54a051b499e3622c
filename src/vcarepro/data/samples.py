"""Generated samples on disk in the ADM evaluator's format, written resumably.

One ``.npz`` per seed: ``arr_0`` uint8 (N, H, W, 3) images and ``arr_1`` int64 (N,) labels, as
guided-diffusion writes and reads them. Batches fill ``.npy`` memory maps in a work directory outside DVC's
outputs (which DVC deletes before a re-run) and are recorded in ``progress.json`` with their SHA-256 once
flushed, so a killed run resumes with no duplicates and no gaps. The ``.npz`` is zipped (stored) from the maps
last, so 50,000 images at 256 px never sit in memory and an ``.npz`` that exists is complete.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Tuple

import numpy as np
import torch

from vcarepro.core.errors import BadInput, MissingInput
from vcarepro.core.io import atomic_open, preallocate, write_json, write_npz_to

PROGRESS = "progress.json"


class NpzSampleWriter:
    """Fill ``num`` samples of ``image_shape`` (H, W, C) batch by batch in ``work_dir``, then ``close()`` into ``path``.

    ``key`` identifies what is being sampled (model, sampler, seed...): work left by a
    run with another key is discarded, work with the same key is resumed.
    """

    def __init__(
        self,
        path: str | Path,
        num: int,
        image_shape: Tuple[int, int, int],
        *,
        work_dir: str | Path | None = None,
        key: str = "",
    ):
        self.path = Path(path)
        self.work_dir = Path(work_dir) if work_dir is not None else self.path.with_name(f".{self.path.stem}.work")
        self.num, self.image_shape, self.key = num, tuple(image_shape), key
        state = {"key": key, "num": num, "image_shape": list(image_shape)}
        progress = self._read_progress()
        self.note = None  # what resuming found wrong, for the stage to say
        resume = (
            progress is not None
            and {k: progress.get(k) for k in state} == state
            and (self.work_dir / "arr_0.npy").is_file()
            and (self.work_dir / "arr_1.npy").is_file()
        )
        if resume:
            self.batches = [tuple(b) for b in progress.get("batches", [])]  # (start, stop, sha256) per batch
            mode = "r+"
        else:
            shutil.rmtree(self.work_dir, ignore_errors=True)
            self.work_dir.mkdir(parents=True)
            self.batches = []
            mode = "w+"
        self._state = state
        self.images = self._map("arr_0.npy", mode, np.uint8, (num, *self.image_shape))
        self.labels = self._map("arr_1.npy", mode, np.int64, (num,))
        if resume:  # every finished batch's bytes are checked against the digest recorded with it
            for k, (start, stop, digest) in enumerate(self.batches):
                if self._digest(start, stop) != digest:
                    self.note = (
                        f"finished batch {k} in {self.work_dir} fails its checksum; sampling again from "
                        f"batch {k} (batches {k}..{len(self.batches) - 1} are redone)"
                    )
                    self.batches = self.batches[:k]
                    break
        self.done_batches = len(self.batches)

    def _map(self, name: str, mode: str, dtype, shape) -> np.memmap:
        """A memory map in the work directory; a new one is given its disk blocks at once (posix_fallocate),
        so a full disk is one sentence now rather than a SIGBUS when a page is first written."""
        path = self.work_dir / name
        array = np.lib.format.open_memmap(path, mode=mode, dtype=dtype, shape=shape)
        if mode == "w+":
            preallocate(path)
        return array

    def _digest(self, start: int, stop: int) -> str:
        digest = hashlib.sha256(np.ascontiguousarray(self.images[start:stop]).data)
        digest.update(np.ascontiguousarray(self.labels[start:stop]).data)
        return digest.hexdigest()

    def _read_progress(self):
        try:
            return json.loads((self.work_dir / PROGRESS).read_text())
        except (OSError, ValueError):
            return None

    def write(self, batch: int, start: int, images_nchw: torch.Tensor, labels: torch.Tensor) -> None:
        """Store batch number ``batch``: uint8 (B, C, H, W) images and labels at ``start .. start + B``."""
        if batch != self.done_batches:
            raise BadInput(
                f"batch {batch} written after {self.done_batches} finished batches; batches must be written in order."
            )
        stop = start + len(images_nchw)
        self.images[start:stop] = images_nchw.permute(0, 2, 3, 1).cpu().numpy()
        self.labels[start:stop] = labels.cpu().numpy()
        self.images.flush()
        self.labels.flush()
        self.batches.append((start, stop, self._digest(start, stop)))
        self.done_batches = batch + 1
        # the batch counts as done only once it is on disk
        write_json(
            self.work_dir / PROGRESS, {**self._state, "done_batches": self.done_batches, "batches": self.batches}
        )

    def preview(self, per_class: int, classes: int) -> np.ndarray:
        """The first ``per_class`` finished samples of each of the first ``classes`` labels, (M, H, W, C) uint8."""
        labels = np.asarray(self.labels)
        rows = [np.flatnonzero(labels == c)[:per_class] for c in range(classes)]
        return np.asarray(self.images[np.concatenate(rows)])

    def close(self) -> Path:
        """Zip the finished maps into ``path``. The work directory stays, marked complete, until
        :func:`discard_work` is called once ``path`` is safely in place: a stage killed after
        this seed but before its output is committed then re-zips instead of re-sampling."""
        self.images.flush()
        self.labels.flush()
        del self.images, self.labels
        # a fixed member time and mode, sizes known up front (io.write_npz_to): the same samples give the same
        # .npz bytes under every Python, so the output's hash in dvc.lock reproduces; whole or not at all
        with atomic_open(self.path) as f:
            write_npz_to(f, {name: self.work_dir / f"{name}.npy" for name in ("arr_0", "arr_1")})
        return self.path


def discard_work(work_dir: str | Path) -> None:
    shutil.rmtree(work_dir, ignore_errors=True)


def read_samples(path: str | Path) -> Tuple[np.ndarray, np.ndarray]:
    """``(images (N, H, W, C) uint8, labels (N,) int64)`` from a sample ``.npz`` (nothing unpickled)."""
    path = Path(path)
    if not path.is_file():
        raise MissingInput(f"{path} is missing; run the sample_gen stage for this run first.")
    with np.load(path, allow_pickle=False) as data:
        if "arr_0" not in data.files:
            raise BadInput(f"{path} has no arr_0 image array; give an ADM-format sample batch.")
        images = data["arr_0"]
        labels = data["arr_1"] if "arr_1" in data.files else np.full(len(images), -1, dtype=np.int64)
    if images.dtype != np.uint8 or images.ndim != 4:
        raise BadInput(f"{path}: arr_0 must be uint8 (N, H, W, C), got {images.dtype} {images.shape}.")
    return images, labels
