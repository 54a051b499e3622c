"""ImageNet-1K from the layouts people actually have, into the prepared layout of ``folders.py``.

Supported under ``root`` (see :func:`prepare_imagenet`):

* the official archives: ``ILSVRC2012_img_train.tar`` (1000 inner ``<wnid>.tar``),
  ``ILSVRC2012_img_val.tar`` (flat ``ILSVRC2012_val_%08d.JPEG``) and the devkit
  ``ILSVRC2012_devkit_t12.tar.gz``; extracted into ``<out>/images/{train,val}/<wnid>/``;
* extracted folders ``train/<wnid>/`` (also Kaggle's ``ILSVRC/Data/CLS-LOC/train``) with ``val/``
  in class folders, or flat with the devkit (archive or its ``data/`` files) or Kaggle's
  ``LOC_val_solution.csv``; indexed in place (absolute paths in the manifest, nothing copied).

Class order is sorted wnid order, as torchvision's ``ImageNet`` and timm's ``ImageFolder`` use, so
label ``i`` means the same class here as in every pretrained checkpoint. The devkit is read the way
torchvision reads it (``meta.mat`` synsets with ``num_children == 0`` are the 1000 classes, the
ground-truth file holds one ILSVRC2012_ID per validation image, in image order).
"""

from __future__ import annotations

import csv
import io
import os
import random
import re
import shutil
import sys
import tarfile
from collections import Counter
from dataclasses import dataclass, field
from multiprocessing import Pool
from pathlib import Path, PurePosixPath
from typing import AbstractSet, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from PIL import Image

from vcarepro.core.errors import BadInput, MissingInput
from vcarepro.core.io import atomic_directory, write_json
from vcarepro.core.progress import Progress
from vcarepro.data.folders import CLASSES, write_manifest

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
) -> dict:
    """Detect the ImageNet layout under ``root``, verify it and write the prepared layout to ``out``.

    ``subset_classes`` (wnids) or ``subset_count`` + ``subset_seed`` (a seeded sample of the sorted
    wnids) keep a class subset, re-labelled ``0..k-1`` in sorted wnid order (ImageNet-100 style).
    Without a subset, ``expect_full`` requires the exact ImageNet-1K counts. Every image is
    decode-checked in ``workers`` processes (default ``os.cpu_count()``); unreadable ones are
    skipped and listed in ``<out>/prepare_report.json``, and more than ``max_bad_fraction`` of them
    is an error. A train class with no images (an empty folder or class tar, or none readable) is
    refused, since it would still take a label and shift every label after it; with
    ``drop_empty_classes`` it is left out with a warning naming it. ``out`` appears only when
    everything succeeded.

    Returns ``{"train", "val", "classes", "layout", "report"}`` (kept image counts, class count,
    the detected layout, the report's path).
    """
    root = Path(root)
    if not root.is_dir():
        raise MissingInput(
            f"ImageNet root {root} is not a directory; set prepare_cls.imagenet_root to the "
            f"folder holding {TRAIN_TAR} or train/ (or pick scale=embedded)."
        )
    if subset_classes is not None and subset_count is not None:
        raise BadInput("give subset_classes or subset_count, not both.")
    if not 0.0 <= max_bad_fraction <= 1.0:
        raise BadInput(f"max_bad_fraction must lie in [0, 1], got {max_bad_fraction}.")
    workers = workers or os.cpu_count() or 1
    subset = subset_classes is not None or subset_count is not None

    layout = _Layout.detect(root)
    meta = _Metadata.load(layout)
    train_wnids = layout.train_wnids(meta.listed)
    _check_class_count(train_wnids, expect_full and not subset, layout.train_where)
    wnids = _choose_classes(train_wnids, subset_classes, subset_count, subset_seed, layout.train_where)

    with atomic_directory(out) as tmp:
        # Archives are extracted and checked class by class; files already on disk are counted
        # first, so that an incomplete copy fails before a long decode check.
        results, train_jobs = _train_images(layout, wnids, tmp, workers)
        per_class = Counter(r.wnid for r in results)
        per_class.update(w for _, _, items, _ in train_jobs for w, _ in items)
        wnids = without_empty_classes(wnids, per_class, layout.train_where, drop_empty_classes)
        label_of = {w: i for i, w in enumerate(wnids)}
        val_jobs = _val_jobs(layout, meta, set(train_wnids), label_of, tmp)
        found = Counter(r.split for r in results)
        for split, _, items, _ in train_jobs + val_jobs:
            found[split] += len(items)
        if expect_full and not subset:
            _check_image_counts(found, layout)
        checks = train_jobs + val_jobs
        with Progress("decode check", sum(len(items) for _, _, items, _ in checks), unit="image") as progress:
            results += [r for batch in _run(_check_paths, checks, workers, progress, len) for r in batch]
        report = _report(results, layout, wnids, found)
        bad = report["bad"]["count"]
        if results and bad / len(results) > max_bad_fraction:
            first = ", ".join(b["path"] for b in report["bad"]["files"][:3])
            raise BadInput(
                f"{bad} of {len(results)} ImageNet images are unreadable (first: {first}); "
                f"fix or re-download them, or raise max_bad_fraction (now {max_bad_fraction}) "
                f"to skip them."
            )
        for r in results:
            if r.error is not None and r.extracted:
                (tmp / r.path).unlink(missing_ok=True)  # our copy of a bad file: not left beside the manifest
        readable = Counter(r.wnid for r in results if r.split == "train" and r.error is None)
        kept_wnids = without_empty_classes(wnids, readable, layout.train_where, drop_empty_classes, unreadable=True)
        if kept_wnids != wnids:
            wnids, label_of = kept_wnids, {w: i for i, w in enumerate(kept_wnids)}
            for r in results:
                if r.wnid not in label_of and r.extracted:
                    (tmp / r.path).unlink(missing_ok=True)  # a dropped class's val images: not left behind
            results = [r for r in results if r.wnid in label_of]
        rows = [(r.split, r.path, label_of[r.wnid]) for r in results if r.error is None]
        rows.sort(key=lambda row: (row[0] != "train", row[2], row[1]))
        write_json(tmp / CLASSES, [{"index": i, "wnid": w, "name": meta.names.get(w, w)} for i, w in enumerate(wnids)])
        write_manifest(tmp, rows)
        write_json(tmp / REPORT, report)
    kept = Counter(row[0] for row in rows)
    return {
        "train": kept["train"],
        "val": kept["val"],
        "classes": len(wnids),
        "layout": report["layout"],
        "report": str(Path(out) / REPORT),
    }


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
    """Absolute paths of the image files directly in ``folder``, sorted."""
    with os.scandir(folder) as entries:
        return sorted(
            os.path.abspath(e.path)
            for e in entries
            if e.is_file() and not e.name.startswith(".") and Path(e.name).suffix.lower() in IMAGE_SUFFIXES
        )


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
        for prefix in FOLDER_PREFIXES:  # extracted folders win over archives: nothing to copy
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
        bases = [_safe_member_name(name, archive) for name in names]  # unsafe paths first, as extraction reads them
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


def _check_image_counts(found: Counter, layout: _Layout) -> None:
    for split, where in (("train", layout.train_where), ("val", layout.val_where)):
        if found[split] != EXPECTED[split]:
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


# ----------------------------------------------------------------------------- images: extraction and checks


@dataclass(slots=True)  # one per image: 1.33M of them on the real dataset
class _Checked:
    split: str
    wnid: str
    path: str  # absolute (indexed in place) or relative to <out> (extracted)
    extracted: bool
    format: Optional[str] = None
    mode: Optional[str] = None
    error: Optional[str] = None


def _check_image(path: str) -> Tuple[Optional[str], Optional[str], Optional[str]]:
    """(format, mode, error) of one image file; the format is read from the content, not the suffix.

    ``verify()`` catches broken PNG chunks but not a truncated JPEG, so the pixels are also
    decoded, in JPEG draft mode (DCT scaling to about 1/8 size), which still reads every byte.
    """
    try:
        if os.path.getsize(path) == 0:
            return None, None, "zero bytes"
        with Image.open(path) as img:
            fmt, mode = img.format, img.mode
            img.verify()
        with Image.open(path) as img:
            img.draft(img.mode, (max(1, img.width // 8), max(1, img.height // 8)))
            img.load()
        return fmt, mode, None
    except Exception as err:  # PIL raises OSError, SyntaxError, ValueError... for broken files
        return None, None, f"{type(err).__name__}: {err}".splitlines()[0]


def _check_paths(job: "_Job") -> List[_Checked]:
    """Check a chunk of (wnid, path) of one split; ``base`` joins paths relative to <out>."""
    split, base, items, extracted = job
    out = []
    for wnid, path in items:
        fmt, mode, error = _check_image(os.path.join(base, path))
        out.append(_Checked(split, wnid, path, extracted, fmt, mode, error))
    return out


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


def _safe_member_name(name: str, archive: Path) -> str:
    """The file name of a tar member, refusing absolute paths and '..' (the name is never used as a path)."""
    path = PurePosixPath(name.replace("\\", "/"))
    if path.is_absolute() or ".." in path.parts or re.match(r"^[A-Za-z]:", name):
        raise BadInput(
            f"{archive} holds an unsafe member path {name!r} (absolute or with '..'); refusing to "
            f"extract it: re-download the archive."
        )
    return path.name


def _copy_member(archive: tarfile.TarFile, member: tarfile.TarInfo, dest: Path) -> None:
    src = archive.extractfile(member)
    with src, open(dest, "wb") as f:
        shutil.copyfileobj(src, f, 1 << 20)


def _extract_class_tar(job: Tuple[str, int, int, str, str, str]) -> List[_Checked]:
    """Extract one inner ``<wnid>.tar`` of the train archive into ``<out>/images/train/<wnid>`` and check it."""
    tar_path, offset, size, wnid, out, label = job
    rel_dir = Path("images", "train", wnid)
    (Path(out) / rel_dir).mkdir(parents=True, exist_ok=True)
    results = []
    with (
        open(tar_path, "rb") as f,
        tarfile.open(fileobj=io.BufferedReader(_Slice(f, offset, size)), mode="r|") as inner,
    ):
        for member in inner:
            name = _safe_member_name(member.name, Path(f"{label}:{wnid}.tar"))
            if member.isdir():
                continue
            if not member.isfile():
                raise BadInput(
                    f"{label}:{wnid}.tar holds {member.name!r}, which is not a regular file (a link?); "
                    f"refusing to extract it: re-download the archive."
                )
            if Path(name).suffix.lower() not in IMAGE_SUFFIXES:
                continue
            rel = str(rel_dir / name)
            _copy_member(inner, member, Path(out) / rel)
            fmt, mode, error = _check_image(str(Path(out) / rel))
            results.append(_Checked("train", wnid, rel, True, fmt, mode, error))
    return results


def _run(
    fn, jobs: List, workers: int, progress: Optional[Progress] = None, count=lambda result: 1
) -> Iterator[List[_Checked]]:
    """``fn(job)`` of every job in ``workers`` processes, as they finish; ``progress`` advances ``count(result)``."""
    for result in _results(fn, jobs, workers):
        if progress is not None:
            progress.advance(count(result))
        yield result


def _results(fn, jobs: List, workers: int) -> Iterator[List[_Checked]]:
    if workers <= 1 or len(jobs) <= 1:
        yield from map(fn, jobs)
        return
    with Pool(min(workers, len(jobs))) as pool:
        yield from pool.imap_unordered(fn, jobs)


def _chunks(items: List, size: int = CHECK_CHUNK) -> Iterator[List]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


_Job = Tuple[str, str, List[Tuple[str, str]], bool]  # split, base of relative paths, (wnid, path)s, extracted


def _train_images(layout: _Layout, wnids: List[str], out: Path, workers: int) -> Tuple[List[_Checked], List[_Job]]:
    """Train images already extracted and checked (archive), or check jobs for the class folders."""
    if layout.train_dir is not None:
        items = []
        with Progress("indexing train", len(wnids), unit="class") as progress:
            for wnid in wnids:
                items += [(wnid, p) for p in _images_in(layout.train_dir / wnid)]
                progress.advance()
        return [], [("train", "", chunk, False) for chunk in _chunks(items)]
    tar_path = layout.files[TRAIN_TAR]
    keep, jobs = set(wnids), []
    with tarfile.open(tar_path) as outer:  # headers only: each class tar is then read in a worker
        for member in outer.getmembers():
            name = _safe_member_name(member.name, tar_path)
            if member.isfile() and name.endswith(".tar") and name[:-4] in keep:
                jobs.append((str(tar_path), member.offset_data, member.size, name[:-4], str(out), tar_path.name))
    jobs.sort(key=lambda job: -job[2])  # biggest first: a better balance over the workers
    with Progress("extracting train", len(jobs), unit="class") as progress:
        return [r for batch in _run(_extract_class_tar, jobs, workers, progress) for r in batch], []


def _val_jobs(layout: _Layout, meta: _Metadata, train_wnids: set, label_of: Dict[str, int], out: Path) -> List[_Job]:
    """Check jobs for the validation images, extracted into class folders first if they come as an archive."""

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
        items = [(w, p) for w in label_of for p in _images_in(layout.val_dir / w)]
    elif layout.val_dir is not None:
        items = []
        for path in _images_in(layout.val_dir):
            wnid = wnid_of(Path(path).name, layout.val_dir)
            if wnid in label_of:
                items.append((wnid, path))
    else:
        items = _extract_val_tar(layout.files[VAL_TAR], wnid_of, label_of, out)
    extracted = layout.val_dir is None
    base = str(out) if extracted else ""
    return [("val", base, chunk, extracted) for chunk in _chunks(items)]


def _extract_val_tar(tar_path: Path, wnid_of, label_of: Dict[str, int], out: Path) -> List[Tuple[str, str]]:
    """Stream the flat validation archive into ``<out>/images/val/<wnid>/``; (wnid, path relative to out)."""
    items = []
    with tarfile.open(tar_path, "r|") as archive, Progress("extracting val", None, unit="image") as progress:
        for member in archive:
            name = _safe_member_name(member.name, tar_path)
            if member.isdir() or Path(name).suffix.lower() not in IMAGE_SUFFIXES:
                continue
            if not member.isfile():
                raise BadInput(
                    f"{tar_path} holds {member.name!r}, which is not a regular file (a link?); "
                    f"refusing to extract it: re-download the archive."
                )
            wnid = wnid_of(name, tar_path)
            if wnid not in label_of:
                continue
            rel = Path("images", "val", wnid, name)
            (out / rel.parent).mkdir(parents=True, exist_ok=True)
            _copy_member(archive, member, out / rel)
            items.append((wnid, str(rel)))
            progress.update(len(items))
    return sorted(items)


# ----------------------------------------------------------------------------- report


def _report(results: List[_Checked], layout: _Layout, wnids: List[str], found: Counter) -> dict:
    def listing(selected: List[_Checked]) -> dict:
        return {"count": len(selected), "files": [r.path for r in selected[:LISTED]]}

    results.sort(key=lambda r: (r.split != "train", r.path))
    bad = [r for r in results if r.error is not None]
    good = [r for r in results if r.error is None]
    non_jpeg = [r for r in good if r.format != "JPEG"]
    return {
        "layout": layout.describe(),
        "classes": len(wnids),
        "images": len(results),
        "found": {"train": found["train"], "val": found["val"]},
        "non_jpeg": {**listing(non_jpeg), "formats": dict(Counter(r.format for r in non_jpeg))},
        "cmyk": listing([r for r in good if r.mode == "CMYK"]),
        "grayscale": listing([r for r in good if r.mode in {"L", "LA", "1", "I", "I;16"}]),
        # every bad file is listed: they are few, and each one is missing from training
        "bad": {"count": len(bad), "files": [{"path": r.path, "reason": r.error} for r in bad]},
        "kept": {"train": sum(r.split == "train" for r in good), "val": sum(r.split == "val" for r in good)},
    }
