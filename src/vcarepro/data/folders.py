"""The prepared classification layout, shared by every source (the digits, ImageNet, its stand-ins).

    <root>/classes.json   [{"index", "wnid", "name"}, ...] in label order
    <root>/manifest.csv   split,label,file,member,offset,length,crc32: where each image's bytes lie
    <root>/sources.json   {file: bytes} of each file the manifest reads several images from, checked before use

An image is one positioned read (``os.pread``) of ``length`` bytes at ``offset`` of ``file``: a member of a tar
(``member`` names it) or a whole file (``member`` empty). ``file`` is relative to <root> or absolute, so ImageNet is
read where it lies, in its official archives or extracted folders, and nothing is copied: DVC tracks these few
files, not a million images. Every read is checked against the CRC-32 recorded when the image was decode-checked,
so what was verified at preparation is what is trained on, or one sentence says the source changed.
"""

from __future__ import annotations

import csv
import io
import json
import os
import tarfile
import zlib
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Callable, Dict, Iterable, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np
from PIL import Image
from torch.utils.data import Dataset

from vcarepro.core.errors import BadInput, MissingInput, UserError
from vcarepro.core.io import write_bytes, write_json

MANIFEST = "manifest.csv"
CLASSES = "classes.json"
SOURCES = "sources.json"
PACKED = "images.tar"  # the digits' images, packed as ImageNet's are
SPLITS = ("train", "val")
COLUMNS = ("split", "label", "file", "member", "offset", "length", "crc32")


@dataclass(frozen=True)
class ClassInfo:
    index: int
    wnid: str
    name: str


class Row(NamedTuple):
    """One line of the manifest: an image of ``split`` with ``label``, ``length`` bytes at ``offset`` of ``file``."""

    split: str
    label: int
    file: str
    member: str
    offset: int
    length: int
    crc32: int


def located(file, member: str) -> str:
    """How a sentence names an image: ``archive:member``, or its own file."""
    return f"{file}:{member}" if member else str(file)


class Stored(NamedTuple):
    """Where one prepared image's bytes lie: ``file`` resolved against the layout's root, ``in_layout`` where it is a
    file of the layout itself (which DVC restores), not a source it indexes."""

    file: Path
    member: str
    offset: int
    length: int
    crc32: int
    in_layout: bool = False

    def __str__(self) -> str:
        return located(self.file, self.member)

    @property
    def name(self) -> str:
        """The image's own file name, in its archive or folder."""
        return PurePosixPath(self.member).name if self.member else self.file.name


def read_classes(root: str | Path) -> List[ClassInfo]:
    path = Path(root) / CLASSES
    if not path.is_file():
        raise MissingInput(f"{path} is missing; run the prepare_cls stage (dvc repro prepare_cls) first.")
    return [ClassInfo(**c) for c in json.loads(path.read_text())]


def read_manifest(root: str | Path, split: str) -> "Samples":
    """(where the image lies, its label) of every image of ``split``, in the manifest's order, after checking that
    each file the manifest reads several images from still has the size it had at preparation."""
    import pandas as pd

    if split not in SPLITS:
        raise BadInput(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}.")
    root = Path(root)
    path = root / MANIFEST
    if not path.is_file():
        raise MissingInput(f"{path} is missing; run the prepare_cls stage (dvc repro prepare_cls) first.")
    check_sources(root)
    frame = pd.read_csv(path, dtype={"split": str, "file": str, "member": str}, na_filter=False)
    return Samples(root, frame[frame["split"] == split])


class Samples(Sequence):
    """A split's images as numpy columns, each (where it lies, its label) built when it is read: ImageNet's million
    rows take tens of MB, which loader workers forked from the process share (a list of a million tuples is copied
    into every worker, page by page, as their reference counts are touched)."""

    def __init__(self, root: Path, frame) -> None:
        import pandas as pd

        codes, files = pd.factorize(frame["file"])
        self.root, self._files = root, np.array([os.fsencode(f) for f in files], dtype=bytes)
        self._in_layout = np.array([_in_layout(f) for f in files], dtype=bool)
        self._file = codes.astype(np.int32)
        self._member = np.array(frame["member"].str.encode("utf-8").tolist(), dtype=bytes)
        self._offset, self._length = frame["offset"].to_numpy(np.int64), frame["length"].to_numpy(np.int64)
        self._crc32, self.labels = frame["crc32"].to_numpy(np.int64), frame["label"].to_numpy(np.int64)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        file = self._file[index]
        stored = Stored(
            self.root / os.fsdecode(self._files[file]),
            self._member[index].decode("utf-8"),
            int(self._offset[index]),
            int(self._length[index]),
            int(self._crc32[index]),
            bool(self._in_layout[file]),
        )
        return stored, int(self.labels[index])


def _in_layout(listed: str) -> bool:
    return not (os.path.isabs(listed) or ".." in Path(listed).parts)


class UnreadableImage(UserError, OSError):
    """A listed image of the prepared layout that cannot be read or decoded (truncated, overwritten, missing).

    An ``OSError``, as PIL's "image file is truncated" and a missing file are.
    """


def repair(file: Path, in_layout: bool) -> str:
    """The fix for an image that no longer reads as prepared: a file of data/cls comes back from DVC's cache; a source
    outside it (ImageNet where it lies) must be restored, or indexed again."""
    if not in_layout:
        return f"restore {file} as it was, or re-run prepare_cls (`dvc repro -f -s prepare_cls`), then `dvc repro`"
    return (
        "re-run prepare_cls (`dvc repro -f -s prepare_cls`) or restore it (`dvc checkout --force data/cls`), "
        "then `dvc repro`"
    )


def unreadable_image(image: Stored, err: BaseException) -> UnreadableImage:
    reason = " ".join(str(err).split()) or type(err).__name__  # one line, whatever the decoder said
    return UnreadableImage(
        f"the prepared image {image} cannot be read ({reason}); the prepared data is damaged: "
        f"{repair(image.file, image.in_layout)}."
    )


def over_pixel_limit(width: int, height: int) -> Optional[str]:
    """Why an image of this size is not decoded, or None: more pixels than Pillow's ``MAX_IMAGE_PIXELS``.

    Refused from 1x, read from the header before any decode: Pillow itself only warns below 2x, and a 2 MB JPEG can
    declare 13000 x 13000 pixels, half a gigabyte decoded.
    """
    limit = Image.MAX_IMAGE_PIXELS
    return f"{width}x{height} pixels, {_over_the_limit()}" if limit and width * height > limit else None


def _over_the_limit() -> str:
    return f"over Pillow's limit of {Image.MAX_IMAGE_PIXELS:,} pixels (PIL.Image.MAX_IMAGE_PIXELS)"


def oversized_image(image: Stored, why: str) -> UnreadableImage:
    return UnreadableImage(
        f"the prepared image {image} is {why}, so it is not decoded; re-run prepare_cls "
        f"(`dvc repro -f -s prepare_cls`), which counts it unreadable and leaves it out, then `dvc repro`."
    )


def check_pixels(image: Stored, width: int, height: int) -> None:
    """An :class:`UnreadableImage` naming ``image`` where its declared size is over Pillow's limit."""
    why = over_pixel_limit(width, height)
    if why is not None:
        raise oversized_image(image, why)


def check_sources(root: Path) -> None:
    """Refuse, in one sentence, a file of ``root``'s sources.json that is missing or not the size it was indexed at."""
    listed = root / SOURCES
    if not listed.is_file():
        return
    for name, size in json.loads(listed.read_text()).items():
        path = root / name
        try:
            found = path.stat().st_size
        except OSError as err:
            raise MissingInput(
                f"{path}, which {root} reads its images from, cannot be opened ({err.strerror}); "
                f"{repair(path, _in_layout(name))}."
            ) from None
        if found != size:
            raise BadInput(
                f"{path} holds {found:,} bytes, not the {size:,} prepare_cls indexed: it changed after preparation; "
                f"{repair(path, _in_layout(name))}."
            )


# archives open in this process (a forked loader worker inherits them: pread shares no offset)
_open: Dict[Path, int] = {}


def _fd(path: Path, keep: bool) -> int:
    fd = _open.get(path)
    if fd is None:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        if keep:
            _open[path] = fd
    return fd


def read_image(image: Stored) -> bytes:
    """The image's bytes: one positioned read, checked for its length and CRC-32 (else an :class:`UnreadableImage`)."""
    keep = bool(image.member)  # an archive serves many reads; a file of its own is opened for its one
    try:
        fd = _fd(image.file, keep)
        try:
            data = os.pread(fd, image.length, image.offset)
        finally:
            if not keep:
                os.close(fd)
    except OSError as err:
        raise unreadable_image(image, err) from None
    if len(data) != image.length:
        raise unreadable_image(image, EOFError(f"{len(data)} of its {image.length} bytes are there"))
    if zlib.crc32(data) != image.crc32:
        raise unreadable_image(image, ValueError("its bytes are not those prepare_cls indexed: CRC-32 differs"))
    return data


class _Named(io.BytesIO):
    """An image's bytes that Pillow's "cannot identify image file ..." names by where they were read from."""

    def __init__(self, data: bytes, where: str) -> None:
        super().__init__(data)
        self.where = where

    def __repr__(self) -> str:
        return repr(self.where)


@contextmanager
def decoded_image(image: Stored, data: Optional[bytes] = None) -> Iterator[Image.Image]:
    """The image (its bytes read unless ``data`` holds them) opened by Pillow; a failure to read it, or to decode it
    inside the block, is an :class:`UnreadableImage` naming it.

    Keep the block to reading pixels (``convert``, ``resize``, a crop): whatever fails in it is blamed on the image.
    """
    data = read_image(image) if data is None else data
    try:
        with Image.open(_Named(data, str(image))) as img:  # the header only, until pixels are asked for
            check_pixels(image, img.width, img.height)
            yield img
    except (UserError, MemoryError):  # not the image's fault, or already named
        raise
    except Image.DecompressionBombError:  # over twice the limit: Pillow refused before telling its size
        raise oversized_image(image, _over_the_limit()) from None
    except Exception as err:  # noqa: BLE001 - PIL's OSError, SyntaxError, ValueError, zlib and struct errors
        raise unreadable_image(image, err) from None


def write_manifest(root: str | Path, rows: Iterable[Row]) -> None:
    text = io.StringIO()  # csv's own line ends (\r\n), untranslated, as open(..., newline="") wrote them
    writer = csv.writer(text)
    writer.writerow(COLUMNS)
    writer.writerows(rows)
    write_bytes(Path(root) / MANIFEST, text.getvalue().encode("utf-8"))


def write_sources(root: str | Path, files: Sequence[str]) -> None:
    """``root/sources.json``: the size of each file (as the manifest lists it) that several images are read from.
    A name relative to the layout resolves the same from ``atomic_directory``'s folder, which lies beside it."""
    root = Path(root)
    write_json(root / SOURCES, {name: (root / name).stat().st_size for name in files})


def whole_files(root: str | Path, items: Iterable[Tuple[str, str | Path, int]]) -> List[Row]:
    """Manifest rows for images that are files of their own: (split, path as listed, label), each file read once
    for its length and CRC-32."""
    rows = []
    for split, path, label in items:
        data = (Path(root) / path).read_bytes()
        rows.append(Row(split, label, str(path), "", 0, len(data), zlib.crc32(data)))
    return rows


def pack(root: str | Path, items: Sequence[Tuple[str, str, int, bytes]], name: str = PACKED) -> List[Row]:
    """Write ``items`` (split, member name, label, encoded image) as one tar ``root/name``, the same bytes for the
    same items, and return their manifest rows: a layout of its own read as ImageNet's archives are."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for _, member, _, data in items:
            info = tarfile.TarInfo(member)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    write_bytes(Path(root) / name, buffer.getvalue())
    with tarfile.open(fileobj=io.BytesIO(buffer.getvalue())) as tar:
        offsets = {m.name: m.offset_data for m in tar.getmembers()}
    return [
        Row(split, label, name, member, offsets[member], len(data), zlib.crc32(data))
        for split, member, label, data in items
    ]


class ManifestDataset(Dataset):
    """Images of one split of a prepared layout, as RGB PIL images through ``transform``.

    ``cache=True`` keeps each transformed item after its first read (the caller guarantees the
    transform is deterministic); loader workers fill their own copies, so use it with workers=0.
    """

    def __init__(self, root: str | Path, split: str, transform: Optional[Callable] = None, cache: bool = False) -> None:
        self.root = Path(root)
        self.samples = read_manifest(self.root, split)
        self.classes = read_classes(self.root)
        self.transform = transform
        self._cache: Optional[dict] = {} if cache else None
        if not self.samples:
            raise BadInput(f"the {split} split of {self.root} is empty; re-run prepare_cls.")

    @property
    def targets(self) -> List[int]:
        return self.samples.labels.tolist()

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int):
        if self._cache is not None and index in self._cache:
            return self._cache[index]
        item = self._read(index)
        if self._cache is not None:
            self._cache[index] = item
        return item

    def _read(self, index: int):
        image, label = self.samples[index]
        with decoded_image(image) as img:
            img = img.convert("RGB")
        if self.transform is not None:
            img = self.transform(img)
        return img, label
