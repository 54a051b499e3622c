"""The prepared classification layout, shared by every source (digits, ImageNet).

    <root>/train/<class_dir>/<image>      image files
    <root>/val/<class_dir>/<image>
    <root>/classes.json                   [{"index", "wnid", "name"}, ...] in label order
    <root>/manifest.csv                   split,path,label (path relative to <root>)

Training reads the manifest, so what was verified at preparation is what is trained on.
"""

from __future__ import annotations

import csv
import io
import json
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, List, Optional, Tuple

from PIL import Image
from torch.utils.data import Dataset

from vcarepro.core.errors import BadInput, MissingInput, UserError
from vcarepro.core.io import write_bytes

MANIFEST = "manifest.csv"
CLASSES = "classes.json"
SPLITS = ("train", "val")


@dataclass(frozen=True)
class ClassInfo:
    index: int
    wnid: str
    name: str


def read_classes(root: str | Path) -> List[ClassInfo]:
    path = Path(root) / CLASSES
    if not path.is_file():
        raise MissingInput(f"{path} is missing; run the prepare_cls stage (dvc repro prepare_cls) first.")
    return [ClassInfo(**c) for c in json.loads(path.read_text())]


def read_manifest(root: str | Path, split: str) -> List[Tuple[str, int]]:
    if split not in SPLITS:
        raise BadInput(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}.")
    path = Path(root) / MANIFEST
    if not path.is_file():
        raise MissingInput(f"{path} is missing; run the prepare_cls stage (dvc repro prepare_cls) first.")
    with path.open(newline="") as f:
        return [(row["path"], int(row["label"])) for row in csv.DictReader(f) if row["split"] == split]


class UnreadableImage(UserError, OSError):
    """A listed image of the prepared layout that cannot be opened or decoded (truncated, overwritten, missing).

    An ``OSError``, as PIL's "image file is truncated" and a missing file are.
    """


# The prepared layout is a DVC output: prepare it again, or take it back from DVC's cache (without --force,
# `dvc checkout` refuses to replace a file that changed).
REPAIR = (
    "re-run prepare_cls (`dvc repro -f -s prepare_cls`) or restore it (`dvc checkout --force data/cls`), "
    "then `dvc repro`"
)


def unreadable_image(path: str | Path, err: BaseException) -> UnreadableImage:
    reason = " ".join(str(err).split()) or type(err).__name__  # one line, whatever the decoder said
    return UnreadableImage(
        f"the prepared image {path} cannot be read ({reason}); the prepared data is damaged: {REPAIR}."
    )


@contextmanager
def decoded_image(path: str | Path) -> Iterator[Image.Image]:
    """``Image.open(path)``; a failure to open or decode it inside the block is an :class:`UnreadableImage`.

    Keep the block to reading pixels (``convert``, ``resize``, a crop): whatever fails in it is blamed on the file.
    """
    try:
        with Image.open(path) as img:
            yield img
    except (UserError, MemoryError):  # not the file's fault
        raise
    except Exception as err:  # noqa: BLE001 - PIL's OSError, SyntaxError, ValueError, zlib and struct errors
        raise unreadable_image(path, err) from None


def write_manifest(root: str | Path, rows: List[Tuple[str, str, int]]) -> None:
    text = io.StringIO()  # csv's own line ends (\r\n), untranslated, as open(..., newline="") wrote them
    writer = csv.writer(text)
    writer.writerow(["split", "path", "label"])
    writer.writerows(rows)
    write_bytes(Path(root) / MANIFEST, text.getvalue().encode("utf-8"))


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
        return [label for _, label in self.samples]

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
        rel, label = self.samples[index]
        with decoded_image(self.root / rel) as img:
            img = img.convert("RGB")
        if self.transform is not None:
            img = self.transform(img)
        return img, label
