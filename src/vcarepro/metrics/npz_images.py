"""ADM-format image files (``.npz`` whose ``arr_0`` is uint8 N x H x W x 3, or ``.npy``), read a batch at a time.

50,000 samples at 256 px are 9.8 GB: the evaluation streams them. ``np.load``'s ``mmap_mode``
does not reach inside an ``.npz`` (a zip, possibly deflated), and ``numpy.lib.format`` reads an
array whole (``read_array``) or maps a plain file (``open_memmap``), never a zip member by
rows; so the member's header is parsed with numpy's own header readers and its rows are read
from the zip stream ``batch_size`` at a time.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Iterator, List, Tuple, Union

import numpy as np
from numpy.lib import format as npy_format

from vcarepro.core.errors import BadInput, MissingInput

PathLike = Union[str, Path]


def iter_npz_images(path: PathLike, batch_size: int, *, key: str = "arr_0") -> Iterator[np.ndarray]:
    """Yield uint8 (B, H, W, 3) batches of an ADM-format ``.npz`` (or ``.npy``) without loading the whole array.

    ``np.load``'s ``mmap_mode`` does not apply inside an ``.npz`` (a zip), so
    the member is streamed: its header is parsed, then ``batch_size`` rows are
    read at a time. Works for ``np.savez`` and ``np.savez_compressed`` files.
    A ``.npy`` file is memory-mapped.
    """
    path = Path(path)
    _require_file(path)
    if batch_size < 1:
        raise BadInput(f"batch_size must be >= 1, got {batch_size}; pass a positive number of images per batch.")
    if path.suffix == ".npy":
        array = np.load(path, mmap_mode="r", allow_pickle=False)
        _check_image_array(path, array.shape, array.dtype)
        for start in range(0, array.shape[0], batch_size):
            yield np.ascontiguousarray(array[start : start + batch_size])
        return
    with zipfile.ZipFile(path) as archive:
        member = _npz_member(archive, path, key)
        with archive.open(member) as stream:
            shape, fortran_order, dtype = _read_npy_header(stream)
            _check_image_array(path, shape, dtype)
            if fortran_order:
                raise BadInput(
                    f"{path}:{key} is stored in Fortran order, which cannot be streamed by rows; "
                    "re-save it with np.savez(np.ascontiguousarray(images))."
                )
            row_bytes = int(np.prod(shape[1:])) * dtype.itemsize
            for start in range(0, shape[0], batch_size):
                count = min(batch_size, shape[0] - start)
                batch = np.empty((count,) + tuple(shape[1:]), dtype=dtype)
                if _read_into(stream, memoryview(batch).cast("B")) != count * row_bytes:
                    raise BadInput(
                        f"{path}:{key} ends after {start} of {shape[0]} images; the file is truncated, write it again."
                    )
                yield batch


def npz_num_images(path: PathLike, *, key: str = "arr_0") -> int:
    """Number of images in an ADM-format sample file, read from its header only."""
    path = Path(path)
    _require_file(path)
    if path.suffix == ".npy":
        shape = np.load(path, mmap_mode="r", allow_pickle=False).shape
    else:
        shape = npz_array_shape(path, key)
    return int(shape[0]) if shape else 0


def npz_keys(path: PathLike) -> List[str]:
    """The names of the arrays in an ``.npz``, read from its zip directory."""
    with zipfile.ZipFile(path) as archive:
        return [name[:-4] for name in archive.namelist() if name.endswith(".npy")]


def npz_array_shape(path: PathLike, key: str) -> Tuple[int, ...]:
    """The shape of array ``key`` of an ``.npz``, read from its header only."""
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as archive, archive.open(_npz_member(archive, path, key)) as stream:
            return tuple(_read_npy_header(stream)[0])
    except zipfile.BadZipFile:
        raise BadInput(f"{path} is not an .npz (zip) file; write samples with np.savez.") from None


def _require_file(path: Path) -> None:
    if not path.is_file():
        raise MissingInput(f"Sample file not found at {path}; run the sampling stage first or fix the path.")


def _npz_member(archive: zipfile.ZipFile, path: Path, key: str) -> str:
    member = key + ".npy"
    if member not in archive.namelist():
        keys = sorted(name[:-4] for name in archive.namelist() if name.endswith(".npy"))
        raise BadInput(
            f"{path} has no '{key}' array (keys: {keys}); write samples with np.savez(path, images) as "
            "ADM's and DiT's samplers do."
        )
    return member


def _read_into(stream, buffer: memoryview) -> int:
    # a zip member stream may return fewer bytes than asked for; read until full or at the end
    filled = 0
    while filled < len(buffer):
        count = stream.readinto(buffer[filled:])
        if not count:
            break
        filled += count
    return filled


def _read_npy_header(stream) -> Tuple[Tuple[int, ...], bool, np.dtype]:
    version = npy_format.read_magic(stream)
    if version == (1, 0):
        return npy_format.read_array_header_1_0(stream)
    if version in ((2, 0), (3, 0)):
        return npy_format.read_array_header_2_0(stream)
    raise BadInput(f"Unsupported .npy format version {version}; re-save the array with a current numpy.")


def _check_image_array(path: Path, shape: Tuple[int, ...], dtype: np.dtype) -> None:
    if np.dtype(dtype) != np.uint8 or len(shape) != 4 or shape[-1] != 3:
        raise BadInput(
            f"{path} holds {np.dtype(dtype)} {tuple(shape)}, not uint8 (N, H, W, 3) images; save samples "
            "as ADM does: np.savez(path, uint8_nhwc_images)."
        )
