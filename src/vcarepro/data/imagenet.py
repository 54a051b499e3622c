"""ImageNet-1K from the layouts people actually have, indexed where it lies into the prepared layout of ``folders.py``.

Supported under ``root`` (see :func:`prepare_imagenet`):

* the official archives: ``ILSVRC2012_img_train.tar`` (1000 inner ``<wnid>.tar``),
  ``ILSVRC2012_img_val.tar`` (flat ``ILSVRC2012_val_%08d.JPEG``) and the devkit
  ``ILSVRC2012_devkit_t12.tar.gz``: each read once, front to back, its MD5 checked against ImageNet's published one
  and each image's offset recorded (timm's ``ReaderImageInTar`` reads the train archive the same way);
* extracted folders ``train/<wnid>/`` (also Kaggle's ``ILSVRC/Data/CLS-LOC/train``) with ``val/``
  in class folders, or flat with the devkit (archive or its ``data/`` files) or Kaggle's
  ``LOC_val_solution.csv``.

Nothing is copied: the manifest names each image's file, offset and length. Class order is sorted wnid order, as
torchvision's ``ImageNet`` and timm's ``ImageFolder`` use, so label ``i`` means the same class here as in every
pretrained checkpoint. The devkit is read the way torchvision reads it (``meta.mat`` synsets with
``num_children == 0`` are the 1000 classes, the ground-truth file holds one ILSVRC2012_ID per validation image, in
image order).
"""

from __future__ import annotations

import csv
import hashlib
import io
import os
import random
import re
import sys
import tarfile
import zlib
from collections import Counter, deque
from dataclasses import dataclass, field
from multiprocessing import Pool
from pathlib import Path, PurePosixPath
from typing import AbstractSet, Deque, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

from PIL import Image

from vcarepro.core.errors import BadInput, MissingInput
from vcarepro.core.io import atomic_directory, write_json
from vcarepro.core.progress import Progress
from vcarepro.data.folders import CLASSES, SPLITS, Row, located, over_pixel_limit, write_manifest, write_sources

IMAGE_SUFFIXES = {".jpeg", ".jpg", ".png"}

TRAIN_TAR = "ILSVRC2012_img_train.tar"
VAL_TAR = "ILSVRC2012_img_val.tar"
DEVKIT_TAR = "ILSVRC2012_devkit_t12.tar.gz"
META_MAT = "meta.mat"
GROUND_TRUTH = "ILSVRC2012_validation_ground_truth.txt"
KAGGLE_VAL = "LOC_val_solution.csv"
KAGGLE_SYNSETS = "LOC_synset_mapping.txt"
REPORT = "prepare_report.json"

EXPECTED = {"classes": 1000, "train": 1_281_167, "val": 50_000}
# The official archives' MD5s, as ImageNet publishes them and torchvision's ImageNet checks them.
PUBLISHED_MD5 = {
    TRAIN_TAR: "1d675b47d978889d74fa0da5fadfb00e",
    VAL_TAR: "29b22e2961454d5413ddabcf34fc5622",
    DEVKIT_TAR: "fa75699e90414af021442c21a62c3abf",
}
# Where extracted class folders live: the usual root/train, and Kaggle's competition layout.
FOLDER_PREFIXES = ("", "ILSVRC/Data/CLS-LOC/")
VAL_NAME = re.compile(r"ILSVRC2012_val_(\d{8})\.", re.IGNORECASE)
WNID = re.compile(r"n[0-9]{8}")  # an ImageNet class: a WordNet noun synset's ID
# How many file names of each quirk the report lists (the counts are always complete).
LISTED = 50
CHECK_CHUNK = 256


# ----------------------------------------------------------------------------- public API


def prepare_imagenet(
    root: str | Path,
    out: str | Path,
    *,
    subset_classes: Optional[Sequence[str]] = None,
    subset_count: Optional[int] = None,
    subset_seed: int = 0,
    expect_full: bool = True,
    max_bad_fraction: float = 0.0,
    workers: Optional[int] = None,
    drop_empty_classes: bool = False,
    other_copy: Optional[str] = None,
) -> dict:
    """Detect the ImageNet layout under ``root``, verify it and write its index, the prepared layout, to ``out``.

    ``subset_classes`` (wnids) or ``subset_count`` + ``subset_seed`` (a seeded sample of the sorted
    wnids) keep a class subset, re-labelled ``0..k-1`` in sorted wnid order (ImageNet-100 style).
    Without a subset, ``expect_full`` requires the exact ImageNet-1K counts. Every image is read once and
    decode-checked in ``workers`` processes (default ``os.cpu_count()``); the archives are read in one sequential
    pass that also computes their MD5, and one whose MD5 is not ImageNet's published one is refused unless
    ``other_copy`` gives the reason to use it. Unreadable images are skipped and listed in
    ``<out>/prepare_report.json``, and more than ``max_bad_fraction`` of them is an error. A train class with no
    images (an empty folder or class tar, or none readable) is refused, since it would still take a label and shift
    every label after it; with ``drop_empty_classes`` it is left out with a warning naming it. ``out`` appears only
    when everything succeeded.

    Returns ``{"train", "val", "classes", "layout", "report"}`` (kept image counts, class count,
    the detected layout, the report's path).
    """
    root = Path(root)
    _check_arguments(root, subset_classes, subset_count, max_bad_fraction)
    workers = workers or os.cpu_count() or 1
    subset = subset_classes is not None or subset_count is not None

    layout = _Layout.detect(root)
    digests = _Digests(other_copy)
    if DEVKIT_TAR in layout.files:  # 2.5 MB, checked before the long pass
        digests.check(DEVKIT_TAR, layout.files[DEVKIT_TAR], _md5_of(layout.files[DEVKIT_TAR]))
    meta = _Metadata.load(layout)
    train_wnids = layout.train_wnids(meta.listed)
    _check_class_count(train_wnids, expect_full and not subset, layout.train_where)
    wnids = _choose_classes(train_wnids, subset_classes, subset_count, subset_seed, layout.train_where)
    listed = _Listed(root, Path(out))

    train = _train_items(layout, wnids, len(wnids) < len(train_wnids), digests, listed)
    if layout.train_dir is not None:  # files are listed before any is read: an incomplete copy fails at once
        train = list(train)
        if expect_full and not subset:
            _check_image_counts(Counter(train=len(train)), layout, ("train",))
    with atomic_directory(out) as tmp:
        with Progress("checking train", len(train) if isinstance(train, list) else None, unit="image") as progress:
            results = _check(train, workers, progress)
        wnids = without_empty_classes(wnids, Counter(r.wnid for r in results), layout.train_where, drop_empty_classes)
        label_of = {w: i for i, w in enumerate(wnids)}
        with Progress("checking val", None, unit="image") as progress:
            items = _val_items(layout, meta, set(train_wnids), label_of, digests, listed)
            results += _check(items, workers, progress)
        found = Counter(r.split for r in results if r.wnid in label_of)
        if expect_full and not subset:
            _check_image_counts(found, layout)
        report = _report(results, layout, wnids, found, digests)
        _check_bad_fraction(report, len(results), max_bad_fraction)
        readable = Counter(r.wnid for r in results if r.split == "train" and r.error is None)
        wnids = without_empty_classes(wnids, readable, layout.train_where, drop_empty_classes, unreadable=True)
        label_of = {w: i for i, w in enumerate(wnids)}
        rows = _index_rows(results, label_of)
        write_json(tmp / CLASSES, [{"index": i, "wnid": w, "name": meta.names.get(w, w)} for i, w in enumerate(wnids)])
        write_manifest(tmp, rows)
        write_sources(tmp, sorted({row.file for row in rows if row.member}))
        write_json(tmp / REPORT, report)
    kept = Counter(row.split for row in rows)
    return {
        "train": kept["train"],
        "val": kept["val"],
        "classes": len(wnids),
        "layout": report["layout"],
        "report": str(Path(out) / REPORT),
    }


def _index_rows(results, label_of: Dict[str, int]) -> List[Row]:
    """The manifest's rows: every readable image of a kept class, train first, by label, file and member."""
    rows = [
        Row(r.split, label_of[r.wnid], r.file, r.member, r.offset, r.length, r.crc32)
        for r in results
        if r.error is None and r.wnid in label_of
    ]
    return sorted(rows, key=lambda row: (row.split != "train", row.label, row.file, row.member))


def _check_arguments(root: Path, subset_classes, subset_count, max_bad_fraction: float) -> None:
    if not root.is_dir():
        raise MissingInput(
            f"ImageNet root {root} is not a directory; set prepare_cls.imagenet_root to the "
            f"folder holding {TRAIN_TAR} or train/ (or pick scale=embedded)."
        )
    if subset_classes is not None and subset_count is not None:
        raise BadInput("give subset_classes or subset_count, not both.")
    if not 0.0 <= max_bad_fraction <= 1.0:
        raise BadInput(f"max_bad_fraction must lie in [0, 1], got {max_bad_fraction}.")


def _check_bad_fraction(report: dict, checked: int, max_bad_fraction: float) -> None:
    """More unreadable images than ``max_bad_fraction`` of the ``checked`` is an error naming the first three."""
    bad = report["bad"]["count"]
    if checked and bad / checked > max_bad_fraction:
        first = ", ".join(b["path"] for b in report["bad"]["files"][:3])
        raise BadInput(
            f"{bad} of {checked} ImageNet images are unreadable (first: {first}); "
            f"fix or re-download them, or raise max_bad_fraction (now {max_bad_fraction}) "
            f"to skip them."
        )


def without_empty_classes(
    wnids: List[str], images: Counter, where: Path, drop: bool, unreadable: bool = False
) -> List[str]:
    """``wnids`` without the classes that have no (readable) train image, or a BadInput naming them.

    An empty class would still take a label: the class count and every label after it would
    differ from the dataset's. Refused unless ``drop`` (prepare_cls.drop_empty_classes), which
    leaves each out with one warning line naming it.
    """
    empty = [w for w in wnids if not images[w]]
    if not empty:
        return list(wnids)
    what = "has no readable train image" if unreadable else "holds no train images"
    if not drop:
        one = len(empty) == 1
        named = ", ".join(str(where / w) for w in empty[:5]) + (f" and {len(empty) - 5} more" if len(empty) > 5 else "")
        if not one:
            what = "have no readable train image" if unreadable else "hold no train images"
        fix = (
            f"replace {'its' if one else 'their'} images"
            if unreadable
            else f"put {'its' if one else 'their'} images back or remove {'it' if one else 'them'}"
        )
        raise BadInput(
            f"{'class' if one else 'classes'} {named} {what}, which would shift every label after "
            f"{'it' if one else 'them'}; {fix}, or set prepare_cls.drop_empty_classes=true to leave "
            f"{'it' if one else 'them'} out."
        )
    for wnid in empty:
        print(
            f"warning: class {where / wnid} {what}; dropped (prepare_cls.drop_empty_classes), so the "
            f"dataset has {len(wnids) - len(empty)} classes and the labels after it move down.",
            file=sys.stderr,
            flush=True,
        )
    return [w for w in wnids if images[w]]


# ----------------------------------------------------------------------------- layout detection


def _expected_inputs(root: Path, what: str) -> str:
    return {
        "train": f"no {TRAIN_TAR} or train/<wnid>/ class folders under {root}; expected one of {TRAIN_TAR}, "
        f"train/<wnid>/*.JPEG or ILSVRC/Data/CLS-LOC/train/<wnid>/*.JPEG.",
        "val": f"no {VAL_TAR}, val/ folder or {KAGGLE_VAL} under {root}; expected one of {VAL_TAR} (+ {DEVKIT_TAR}), "
        f"val/<wnid>/ class folders, or a flat val/ with {DEVKIT_TAR} (or its data/{META_MAT} + "
        f"data/{GROUND_TRUTH}) or Kaggle's {KAGGLE_VAL}.",
        "labels": f"the validation images under {root} have no labels; expected {DEVKIT_TAR}, its extracted "
        f"data/{META_MAT} + data/{GROUND_TRUTH}, or Kaggle's {KAGGLE_VAL} under {root}.",
    }[what]


def _find_named(root: Path, names: Iterable[str], max_depth: int = 4) -> Dict[str, Path]:
    """The first file of each name under ``root``, not descending into image folders."""
    wanted, found = set(names), {}
    for dirpath, dirnames, filenames in os.walk(root):
        depth = len(Path(dirpath).relative_to(root).parts)
        dirnames[:] = sorted(
            d
            for d in dirnames
            if not d.startswith(".") and d.lower() not in {"train", "val", "test", "images"} and depth < max_depth
        )
        for name in sorted(wanted.intersection(filenames) - found.keys()):
            found[name] = Path(dirpath) / name
        if len(found) == len(wanted):
            break
    return found


def _class_dirs(folder: Path) -> List[str]:
    return sorted(d.name for d in folder.iterdir() if d.is_dir() and not d.name.startswith("."))


def _class_name(wnid: str, listed: AbstractSet[str], named: str, fix: str) -> str:
    """``wnid`` if it names an ImageNet class (n and eight digits, or a class the devkit's meta.mat lists).

    Anything else would become a class of that name and a folder of the prepared layout (a member
    ``...tar`` would be a class ``..``, its images ``images/train/../``), so it is a BadInput:
    ``named`` names the member or folder, ``fix`` says what to do.
    """
    if WNID.fullmatch(wnid) or (wnid in listed and wnid not in (".", "..") and not set(wnid) & set("/\\")):
        return wnid
    raise BadInput(f"{named} is not an ImageNet class (a wnid: n and eight digits, or one the devkit lists); {fix}.")


def _class_folders(folder: Path, listed: AbstractSet[str]) -> List[str]:
    """The class folders under ``folder``, each checked to be an ImageNet class."""
    return [
        _class_name(name, listed, f"class folder {folder / name}", f"rename it to its wnid or move it out of {folder}")
        for name in _class_dirs(folder)
    ]


def _images_in(folder: Path) -> List[str]:
    """Absolute paths of the images directly in ``folder``, sorted: every entry with an image's suffix but a folder.

    A link is the file it leads to, wherever that lies (labs build ImageNet from links into a shared store); one
    that leads nowhere (dangling, a loop) fails its read and is counted unreadable, like a file that fails to decode.
    """
    with os.scandir(folder) as entries:
        return sorted(
            os.path.abspath(e.path)
            for e in entries
            if not e.name.startswith(".") and Path(e.name).suffix.lower() in IMAGE_SUFFIXES and not _is_folder(e)
        )


def _is_folder(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()
    except OSError:  # a link loop: not a folder, and its read will say why it is unreadable
        return False


@dataclass
class _Layout:
    root: Path
    files: Dict[str, Path]
    train_dir: Optional[Path] = None
    val_dir: Optional[Path] = None
    val_flat: bool = False

    @classmethod
    def detect(cls, root: Path) -> "_Layout":
        files = _find_named(root, (TRAIN_TAR, VAL_TAR, DEVKIT_TAR, META_MAT, GROUND_TRUTH, KAGGLE_VAL, KAGGLE_SYNSETS))
        layout = cls(root, files)
        for prefix in FOLDER_PREFIXES:  # extracted folders win over archives: each image a file of its own
            train, val = root / prefix / "train", root / prefix / "val"
            if layout.train_dir is None and train.is_dir() and _class_dirs(train):
                layout.train_dir = train
            if layout.val_dir is None and val.is_dir():
                layout.val_dir = val
        if layout.train_dir is None and TRAIN_TAR not in files:
            raise MissingInput(_expected_inputs(root, "train"))
        if layout.val_dir is None and VAL_TAR not in files:
            raise MissingInput(_expected_inputs(root, "val"))
        if layout.val_dir is not None:
            layout.val_flat = not _class_dirs(layout.val_dir)
        needs_labels = layout.val_dir is None or layout.val_flat
        has_devkit = DEVKIT_TAR in files or (META_MAT in files and GROUND_TRUTH in files)
        if needs_labels and not has_devkit and KAGGLE_VAL not in files:
            raise MissingInput(_expected_inputs(root, "labels"))
        return layout

    @property
    def train_where(self) -> Path:
        return self.train_dir if self.train_dir is not None else self.files[TRAIN_TAR]

    @property
    def val_where(self) -> Path:
        return self.val_dir if self.val_dir is not None else self.files[VAL_TAR]

    def describe(self) -> dict:
        labels = (
            "class folders"
            if self.val_dir is not None and not self.val_flat
            else "devkit"
            if DEVKIT_TAR in self.files or GROUND_TRUTH in self.files
            else "kaggle"
        )
        return {
            "train": ("folders " if self.train_dir is not None else "archive ") + str(self.train_where),
            "val": ("folders " if self.val_dir is not None else "archive ") + str(self.val_where),
            "val_labels": labels,
        }

    def train_wnids(self, listed: AbstractSet[str] = frozenset()) -> List[str]:
        """The train classes (class folders or the archive's class tars), each checked to be an ImageNet class;
        ``listed``: the classes the devkit lists, accepted beside the wnid pattern."""
        if self.train_dir is not None:
            return _class_folders(self.train_dir, listed)
        archive = self.files[TRAIN_TAR]
        with tarfile.open(archive) as outer:
            names = [m.name for m in outer.getmembers() if m.isfile()]
        bases = [_safe_member_name(name, archive) for name in names]  # unsafe paths first, as the pass reads them
        fix = "remove it, or point prepare_cls.imagenet_root at the official archive"
        return sorted(
            _class_name(base[: -len(".tar")], listed, f"member {name!r} of {archive}", fix)
            for name, base in zip(names, bases)
            if base.endswith(".tar")
        )


# ----------------------------------------------------------------------------- metadata


@dataclass
class _Metadata:
    names: Dict[str, str] = field(default_factory=dict)  # wnid -> class name
    val_labels: Dict[str, str] = field(default_factory=dict)  # val image stem -> wnid
    listed: AbstractSet[str] = frozenset()  # the classes (leaf synsets) of the devkit's meta.mat

    @classmethod
    def load(cls, layout: _Layout) -> "_Metadata":
        meta = cls()
        files = layout.files
        mat, ground_truth = _devkit_files(files)
        if mat is not None:
            id_to_wnid, meta.names = _parse_meta_mat(mat, files.get(DEVKIT_TAR) or files[META_MAT])
            meta.listed = frozenset(meta.names)
            if ground_truth is not None:
                where = files.get(DEVKIT_TAR) or files[GROUND_TRUTH]
                ids = ground_truth.decode().split()
                unknown = sorted({i for i in ids if int(i) not in id_to_wnid})
                if unknown:
                    raise BadInput(
                        f"{where} names ILSVRC2012_IDs {', '.join(unknown[:5])} that are no leaf synset "
                        f"of meta.mat; the ground truth and meta.mat do not belong together."
                    )
                meta.val_labels = {f"ILSVRC2012_val_{n:08d}": id_to_wnid[int(i)] for n, i in enumerate(ids, 1)}
        if KAGGLE_SYNSETS in files:
            for line in files[KAGGLE_SYNSETS].read_text().splitlines():
                wnid, _, name = line.strip().partition(" ")
                if wnid:
                    meta.names.setdefault(wnid, name.strip() or wnid)
        if not meta.val_labels and KAGGLE_VAL in files:
            with files[KAGGLE_VAL].open(newline="") as f:
                reader = csv.DictReader(f)
                if not {"ImageId", "PredictionString"} <= set(reader.fieldnames or ()):
                    raise BadInput(
                        f"{files[KAGGLE_VAL]} lacks the columns ImageId,PredictionString of Kaggle's {KAGGLE_VAL}."
                    )
                meta.val_labels = {
                    row["ImageId"]: row["PredictionString"].split()[0]
                    for row in reader
                    if row["PredictionString"].strip()
                }
        return meta


def _devkit_files(files: Dict[str, Path]) -> Tuple[Optional[bytes], Optional[bytes]]:
    """The bytes of meta.mat and of the ground-truth file, from the devkit archive or extracted copies."""
    mat = files[META_MAT].read_bytes() if META_MAT in files else None
    truth = files[GROUND_TRUTH].read_bytes() if GROUND_TRUTH in files else None
    if DEVKIT_TAR in files and (mat is None or truth is None):
        with tarfile.open(files[DEVKIT_TAR], "r:gz") as devkit:
            for member in devkit.getmembers():  # read in memory, never extracted: member paths do not matter
                path = PurePosixPath(member.name)
                if not member.isfile() or path.parent.name != "data":
                    continue
                if path.name == META_MAT and mat is None:
                    mat = devkit.extractfile(member).read()
                elif path.name == GROUND_TRUTH and truth is None:
                    truth = devkit.extractfile(member).read()
        if mat is None or truth is None:
            raise MissingInput(
                f"{files[DEVKIT_TAR]} lacks data/{META_MAT} or data/{GROUND_TRUTH}; "
                f"expected the ILSVRC2012 devkit (ILSVRC2012_devkit_t12/data/...)."
            )
    return mat, truth


def _parse_meta_mat(raw: bytes, where: Path) -> Tuple[Dict[int, str], Dict[str, str]]:
    """ILSVRC2012_ID -> wnid and wnid -> words, for the leaf synsets (the classes), as torchvision reads it."""
    import scipy.io

    try:
        synsets = scipy.io.loadmat(io.BytesIO(raw), squeeze_me=True)["synsets"]
        leaves = synsets[synsets["num_children"] == 0]
        ids, wnids, words = leaves["ILSVRC2012_ID"], leaves["WNID"], leaves["words"]
    except (KeyError, ValueError, TypeError) as err:
        raise BadInput(
            f"{where}: {META_MAT} is not the ILSVRC2012 devkit's (expected a 'synsets' struct with "
            f"ILSVRC2012_ID, WNID, words, num_children): {err}"
        ) from None
    return ({int(i): str(w) for i, w in zip(ids, wnids)}, {str(w): str(n) for w, n in zip(wnids, words)})


# ----------------------------------------------------------------------------- class choice and counts


def _check_class_count(wnids: Sequence[str], expect_full: bool, where: Path) -> None:
    if expect_full and len(wnids) != EXPECTED["classes"]:
        raise BadInput(
            f"expected {EXPECTED['classes']} ImageNet-1K classes, found {len(wnids)} in {where}; "
            f"complete the download, or set prepare_cls.expect_full=false (or choose a subset with "
            f"prepare_cls.subset_classes or subset_count) for a partial copy."
        )


def _check_image_counts(found: Counter, layout: _Layout, splits: Sequence[str] = SPLITS) -> None:
    for split, where in (("train", layout.train_where), ("val", layout.val_where)):
        if split in splits and found[split] != EXPECTED[split]:
            raise BadInput(
                f"expected {EXPECTED[split]:,} ImageNet-1K {split} images, found {found[split]:,} "
                f"in {where}; complete the download, or set prepare_cls.expect_full=false for a partial copy."
            )


def _choose_classes(
    wnids: List[str], subset_classes: Optional[Sequence[str]], subset_count: Optional[int], seed: int, where: Path
) -> List[str]:
    if subset_classes is not None:
        missing = sorted(set(subset_classes) - set(wnids))
        if missing:
            raise BadInput(
                f"subset_classes names {len(missing)} wnids absent from {where} (first: {', '.join(missing[:5])})."
            )
        if not subset_classes:
            raise BadInput("subset_classes is empty; name at least one wnid.")
        return sorted(set(subset_classes))
    if subset_count is not None:
        if not 0 < subset_count <= len(wnids):
            raise BadInput(f"subset_count must lie in 1..{len(wnids)} (the classes in {where}), got {subset_count}.")
        return sorted(random.Random(seed).sample(sorted(wnids), subset_count))
    return list(wnids)


# ----------------------------------------------------------------------------- images: one read each, checked


class _Listed:
    """How the manifest names a file under the ImageNet root: relative to ``out`` where the root was given relative
    (the smoke scale's stand-ins in the project: the same bytes in any clone), else absolute."""

    def __init__(self, root: Path, out: Path) -> None:
        self.relative, self.out = not root.is_absolute(), out

    def __call__(self, path: Path) -> str:
        return os.path.relpath(path, self.out) if self.relative else os.path.abspath(path)


@dataclass(slots=True)  # one per image: 1.33M of them on the real dataset
class _Checked:
    split: str
    wnid: str
    file: str  # as the manifest lists it
    member: str  # inside file, '' for a file of its own
    offset: int
    length: int = 0
    crc32: int = 0
    format: Optional[str] = None
    mode: Optional[str] = None
    error: Optional[str] = None

    def __str__(self) -> str:
        return located(self.file, self.member)


# An image to check: (split, wnid, file as listed, member, offset, (a path to read it from, or its bytes)).
_Item = Tuple[str, str, str, str, int, Union[str, bytes]]


def _check_image(data: bytes) -> Tuple[Optional[str], Optional[str], Optional[str]]:
    """(format, mode, error) of one encoded image; the format is read from the content, not the name.

    An image over Pillow's pixel limit is refused from its header, as every input path refuses it. ``verify()``
    catches broken PNG chunks but not a truncated JPEG, so the pixels are also decoded, in JPEG draft mode (DCT
    scaling to about 1/8 size), which still reads every byte.
    """
    if not data:
        return None, None, "zero bytes"
    try:
        with Image.open(io.BytesIO(data)) as img:
            fmt, mode, too_many = img.format, img.mode, over_pixel_limit(img.width, img.height)
            if too_many:
                return None, None, too_many
            img.verify()
        with Image.open(io.BytesIO(data)) as img:
            img.draft(img.mode, (max(1, img.width // 8), max(1, img.height // 8)))
            img.load()
        return fmt, mode, None
    except Exception as err:  # PIL raises OSError, SyntaxError, ValueError... for broken files
        return None, None, f"{type(err).__name__}: {err}".splitlines()[0]


def _check_chunk(
    sources: List[Union[str, bytes]],
) -> List[Tuple[int, int, Optional[str], Optional[str], Optional[str]]]:
    """(length, CRC-32, format, mode, error) of each image, given as its bytes or a path to read them from."""
    out = []
    for source in sources:
        if isinstance(source, str):
            try:
                with open(source, "rb") as f:
                    source = f.read()
            except OSError as err:
                out.append((0, 0, None, None, f"{type(err).__name__}: {err.strerror}"))
                continue
        out.append((len(source), zlib.crc32(source), *_check_image(source)))
    return out


def _check(items: Iterable[_Item], workers: int, progress: Progress) -> List[_Checked]:
    """Every item checked, in ``workers`` processes, a bounded number of chunks in flight (so that the archive is
    read once, at the pace of the checks, with a few hundred images in memory); in the items' order."""
    results: List[_Checked] = []

    def collect(chunk: List[_Item], checked) -> None:
        for (split, wnid, file, member, offset, _), facts in zip(chunk, checked):
            results.append(_Checked(split, wnid, file, member, offset, *facts))
        progress.advance(len(chunk))

    chunks = _chunks(items)
    if workers <= 1:
        for chunk in chunks:
            collect(chunk, _check_chunk([item[-1] for item in chunk]))
        return results
    pending: Deque = deque()
    with Pool(workers) as pool:
        for chunk in chunks:
            pending.append((chunk, pool.apply_async(_check_chunk, ([item[-1] for item in chunk],))))
            if len(pending) >= 2 * workers:
                collect(*_finished(pending.popleft()))
        while pending:
            collect(*_finished(pending.popleft()))
    return results


def _finished(job):
    chunk, result = job
    return [item[:-1] + (None,) for item in chunk], result.get()  # the chunk's bytes go now


def _chunks(items: Iterable, size: int = CHECK_CHUNK) -> Iterator[List]:
    chunk: List = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


class _Hashing(io.RawIOBase):
    """A file read once from its start, MD5'd as the bytes pass: the archive's digest costs no second read."""

    def __init__(self, f) -> None:
        self._f, self.md5 = f, hashlib.md5()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = self._f.readinto(buffer)
        self.md5.update(memoryview(buffer)[:n])
        return n

    def digest(self) -> str:
        """The MD5 of the whole file: what tarfile left unread (its end-of-archive blocks) is read here."""
        for chunk in iter(lambda: self._f.read(1 << 22), b""):
            self.md5.update(chunk)
        return self.md5.hexdigest()


class _Slice(io.RawIOBase):
    """A read-only window onto ``size`` bytes of a file from ``offset``: one member of an outer tar."""

    def __init__(self, f, offset: int, size: int) -> None:
        f.seek(offset)
        self._f, self._left = f, size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = self._f.readinto(memoryview(buffer)[: min(len(buffer), self._left)])
        self._left -= n
        return n


def _md5_of(path: Path) -> str:
    with open(path, "rb") as f:
        return _Hashing(f).digest()


class _Digests:
    """The archives' MD5s against ImageNet's published ones; a copy with others passes only with ``other_copy``."""

    def __init__(self, other_copy: Optional[str]) -> None:
        self.other_copy, self.found = other_copy, {}

    def check(self, name: str, path: Path, md5: Optional[str], why_not: str = "") -> None:
        self.found[name] = {"file": str(path), "md5": md5, "published": PUBLISHED_MD5[name], "not_computed": why_not}
        if md5 is not None and md5 != PUBLISHED_MD5[name] and not self.other_copy:
            raise BadInput(
                f"{path} has MD5 {md5}, not the {PUBLISHED_MD5[name]} ImageNet publishes for {name}: it is another "
                f"copy or a damaged one; re-download it, or set prepare_cls.other_copy to the reason to use this copy."
            )

    def describe(self) -> dict:
        differ = [n for n, f in self.found.items() if f["md5"] is not None and f["md5"] != f["published"]]
        return {"archives": self.found, "other_copy": self.other_copy if differ else None, "differ": differ}


def _image_members(tar: tarfile.TarFile, label: str) -> Iterator[Tuple[str, tarfile.TarInfo]]:
    """(file name, member) of each image in a tar read as a stream; unsafe or non-regular members are refused."""
    for member in tar:
        name = _safe_member_name(member.name, Path(label))
        if member.isdir() or Path(name).suffix.lower() not in IMAGE_SUFFIXES:
            continue
        if not member.isfile():
            raise BadInput(
                f"{label} holds {member.name!r}, which is not a regular file (a link?); refusing to index it: "
                f"re-download the archive."
            )
        yield name, member


def _class_tar(fileobj, base: int, wnid: str, archive: Path, listed: str) -> Iterator[_Item]:
    """The images of one inner ``<wnid>.tar`` (a stream from its first byte, at ``base`` in the archive)."""
    with tarfile.open(fileobj=fileobj, mode="r|") as inner:
        for name, member in _image_members(inner, f"{archive}:{wnid}.tar"):
            data = inner.extractfile(member).read()
            yield "train", wnid, listed, f"{wnid}.tar/{name}", base + member.offset_data, data


def _kept_class(member: tarfile.TarInfo, archive: Path, keep: AbstractSet[str]) -> Optional[str]:
    """The wnid of an outer member that is the class tar of a kept class, else None (unsafe names refused)."""
    base = _safe_member_name(member.name, archive)
    return base[:-4] if member.isfile() and base.endswith(".tar") and base[:-4] in keep else None


def _train_items(
    layout: _Layout, wnids: List[str], subset: bool, digests: _Digests, listed: _Listed
) -> Iterator[_Item]:
    """The train images to check: the class folders' files, or the archive's members with their offsets.

    The whole archive is one sequential pass, MD5'd on the way; a subset reads only its classes' tars (so its
    archive's MD5 is not computed)."""
    if layout.train_dir is not None:
        for wnid in wnids:
            for path in _images_in(layout.train_dir / wnid):
                yield "train", wnid, listed(Path(path)), "", 0, path
        return
    archive, keep = layout.files[TRAIN_TAR], set(wnids)
    name = listed(archive)
    with open(archive, "rb") as f:
        if subset:
            with tarfile.open(fileobj=f) as outer:  # headers only, found by seeking
                members = sorted(outer.getmembers(), key=lambda m: m.offset_data)
            for member in members:
                wnid = _kept_class(member, archive, keep)
                if wnid:
                    window = io.BufferedReader(_Slice(f, member.offset_data, member.size), 1 << 20)
                    yield from _class_tar(window, member.offset_data, wnid, archive, name)
            digests.check(TRAIN_TAR, archive, None, f"a subset reads only its {len(wnids)} classes' tars")
            return
        hashing = _Hashing(f)
        with tarfile.open(fileobj=hashing, mode="r|", bufsize=1 << 20) as outer:
            for member in outer:
                wnid = _kept_class(member, archive, keep)
                if wnid:
                    yield from _class_tar(outer.extractfile(member), member.offset_data, wnid, archive, name)
        digests.check(TRAIN_TAR, archive, hashing.digest())


def _val_items(
    layout: _Layout, meta: _Metadata, train_wnids: set, label_of: Dict[str, int], digests: _Digests, listed: _Listed
) -> Iterator[_Item]:
    """The validation images to check, of the kept classes: class folders, a flat folder, or the archive (read whole,
    MD5'd on the way)."""

    def wnid_of(name: str, where: Path) -> str:
        stem = name.rsplit(".", 1)[0]
        wnid = meta.val_labels.get(stem)
        if wnid is None:
            source = ", ".join(
                str(layout.files[k]) for k in (DEVKIT_TAR, GROUND_TRUTH, KAGGLE_VAL) if k in layout.files
            )
            raise BadInput(
                f"validation image {name} in {where} has no label in {source}; "
                f"expected names ILSVRC2012_val_%08d.JPEG covered by the labels."
            )
        if wnid not in train_wnids:
            raise BadInput(
                f"validation image {name} in {where} is labelled {wnid}, which has no train class "
                f"folder or class tar in {layout.train_where}."
            )
        return wnid

    if layout.val_dir is not None and not layout.val_flat:
        unknown = sorted(set(_class_folders(layout.val_dir, meta.listed)) - train_wnids)
        if unknown:
            raise BadInput(
                f"{layout.val_dir} holds class folders absent from {layout.train_where} "
                f"(first: {', '.join(unknown[:5])}); train and val must share their classes."
            )
        for wnid in label_of:
            for path in _images_in(layout.val_dir / wnid):
                yield "val", wnid, listed(Path(path)), "", 0, path
        return
    if layout.val_dir is not None:
        for path in _images_in(layout.val_dir):
            wnid = wnid_of(Path(path).name, layout.val_dir)
            if wnid in label_of:
                yield "val", wnid, listed(Path(path)), "", 0, path
        return
    archive = layout.files[VAL_TAR]
    name = listed(archive)
    with open(archive, "rb") as f:
        hashing = _Hashing(f)
        with tarfile.open(fileobj=hashing, mode="r|", bufsize=1 << 20) as tar:
            for member_name, member in _image_members(tar, str(archive)):
                wnid = wnid_of(member_name, archive)
                if wnid in label_of:
                    yield "val", wnid, name, member_name, member.offset_data, tar.extractfile(member).read()
        digests.check(VAL_TAR, archive, hashing.digest())


def _safe_member_name(name: str, archive: Path) -> str:
    """The file name of a tar member, refusing absolute paths and '..' (the name is never used as a path)."""
    path = PurePosixPath(name.replace("\\", "/"))
    if path.is_absolute() or ".." in path.parts or re.match(r"^[A-Za-z]:", name):
        raise BadInput(
            f"{archive} holds an unsafe member path {name!r} (absolute or with '..'); refusing to "
            f"index it: re-download the archive."
        )
    return path.name


# ----------------------------------------------------------------------------- report


def _report(results: List[_Checked], layout: _Layout, wnids: List[str], found: Counter, digests: _Digests) -> dict:
    def listing(selected: List[_Checked]) -> dict:
        return {"count": len(selected), "files": [str(r) for r in selected[:LISTED]]}

    results = sorted(results, key=lambda r: (r.split != "train", r.file, r.member))
    bad = [r for r in results if r.error is not None]
    good = [r for r in results if r.error is None]
    non_jpeg = [r for r in good if r.format != "JPEG"]
    return {
        "layout": layout.describe(),
        "copy": digests.describe(),
        "classes": len(wnids),
        "images": len(results),
        "found": {"train": found["train"], "val": found["val"]},
        "non_jpeg": {**listing(non_jpeg), "formats": dict(Counter(r.format for r in non_jpeg))},
        "cmyk": listing([r for r in good if r.mode == "CMYK"]),
        "grayscale": listing([r for r in good if r.mode in {"L", "LA", "1", "I", "I;16"}]),
        # every bad file is listed: they are few, and each one is missing from training
        "bad": {"count": len(bad), "files": [{"path": str(r), "reason": r.error} for r in bad]},
        "kept": {"train": sum(r.split == "train" for r in good), "val": sum(r.split == "val" for r in good)},
    }
