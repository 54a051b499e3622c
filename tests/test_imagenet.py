"""ImageNet preparation, on a miniature ImageNet written in each layout people have.

The miniature has real encoded images, a real meta.mat (scipy.io.savemat, the devkit's struct
fields, with non-leaf synsets that must be ignored) and ILSVRC2012_IDs whose order differs from
the sorted wnid order, so a label mix-up between the two orders cannot pass.
"""

from __future__ import annotations

import csv
import io
import json
import os
import random
import re
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from helpers import ROOT, flat_jpeg
from vcarepro.core.errors import BadInput
from vcarepro.data.embedded import export_digits
from vcarepro.data.folders import ManifestDataset, read_classes, read_image, read_manifest
from vcarepro.data.imagenet import TRAIN_TAR, prepare_imagenet
from vcarepro.report.collect import data_copy
from vcarepro.tools.standins import MiniImageNet
from vcarepro.tools.standins import add_to_tar as add

# wnid -> (ILSVRC2012_ID, words); the IDs are deliberately not in sorted-wnid order.
CLASSES = {
    "n01440764": (3, "tench, Tinca tinca"),
    "n01443537": (1, "goldfish, Carassius auratus"),
    "n01484850": (4, "great white shark, white shark"),
    "n01491361": (2, "tiger shark, Galeocerdo cuvieri"),
}
NON_LEAVES = [(1001, "n01440000", "fish", 4), (1002, "n00001740", "entity", 1)]
WNIDS = sorted(CLASSES)
PREPARED = ["classes.json", "manifest.csv", "prepare_report.json", "sources.json"]  # and not one image
TRAIN_PER_CLASS, VAL_PER_CLASS = 3, 2
OTHER = "a miniature: ImageNet's layout, not its MD5s"
MINIATURE = dict(expect_full=False, workers=1, other_copy=OTHER)  # a miniature is never the full 1000 classes


def encoded(seed: int, fmt: str = "JPEG", mode: str = "RGB", size=(48, 40)) -> bytes:
    """A noisy image (noise so that a JPEG has enough entropy-coded data to truncate)."""
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    img = Image.fromarray(pixels, "RGB").convert(mode)
    buf = io.BytesIO()
    img.save(buf, fmt)
    return buf.getvalue()


class Mini(MiniImageNet):
    """The miniature's noise images, written out in any layout (the official archives by vcarepro.tools.standins)."""

    def __init__(self) -> None:
        train = {w: {f"{w}_{i}.JPEG": encoded(10 * c + i) for i in range(TRAIN_PER_CLASS)} for c, w in enumerate(WNIDS)}
        val_wnids = [w for w in WNIDS for _ in range(VAL_PER_CLASS)]
        random.Random(0).shuffle(val_wnids)
        val = {f"ILSVRC2012_val_{n:08d}.JPEG": (w, encoded(1000 + n)) for n, w in enumerate(val_wnids, 1)}
        super().__init__(CLASSES, train, val, NON_LEAVES)

    # --- the other layouts
    def train_folders(self, train: Path) -> None:
        for wnid, files in self.train.items():
            (train / wnid).mkdir(parents=True)
            for name, data in files.items():
                (train / wnid / name).write_bytes(data)

    def class_folders(self, root: Path) -> Path:
        self.train_folders(root / "train")
        for name, (wnid, data) in self.val.items():
            (root / "val" / wnid).mkdir(parents=True, exist_ok=True)
            (root / "val" / wnid / name).write_bytes(data)
        return root

    def flat_val(self, val: Path) -> None:
        val.mkdir(parents=True)
        for name, (_, data) in self.val.items():
            (val / name).write_bytes(data)

    def flat_with_devkit(self, root: Path, extracted: bool) -> Path:
        self.train_folders(root / "train")
        self.flat_val(root / "val")
        if extracted:
            data = root / "ILSVRC2012_devkit_t12" / "data"
            data.mkdir(parents=True)
            (data / "meta.mat").write_bytes(self.meta_mat())
            (data / "ILSVRC2012_validation_ground_truth.txt").write_bytes(self.ground_truth())
        else:
            self.write_devkit(root)
        return root

    def kaggle(self, root: Path, synsets: bool = True) -> Path:
        data = root / "ILSVRC" / "Data" / "CLS-LOC"
        self.train_folders(data / "train")
        self.flat_val(data / "val")
        with (root / "LOC_val_solution.csv").open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["ImageId", "PredictionString"])
            for name, (wnid, _) in self.val.items():
                writer.writerow([name[:-5], f"{wnid} 1 2 30 40 {wnid} 5 6 20 20"])
        if synsets:
            (root / "LOC_synset_mapping.txt").write_text("".join(f"{w} {words}\n" for w, (_, words) in CLASSES.items()))
        return root


def assert_prepared(out: Path, mini: Mini, wnids=WNIDS, names=True) -> None:
    classes = read_classes(out)
    assert [c.wnid for c in classes] == list(wnids)
    assert [c.index for c in classes] == list(range(len(wnids)))
    assert [c.name for c in classes] == [CLASSES[w][1] if names else w for w in wnids]
    train, val = read_manifest(out, "train"), read_manifest(out, "val")
    assert len(train) == TRAIN_PER_CLASS * len(wnids) and len(val) == VAL_PER_CLASS * len(wnids)
    for image, label in train:  # each read gives the image's bytes as written, whatever the layout
        assert read_image(image) == mini.train[classes[label].wnid][image.name]
    for image, label in val:  # the label of every val image is its ground truth
        assert mini.val[image.name][0] == classes[label].wnid
        assert read_image(image) == mini.val[image.name][1]
    for split in ("train", "val"):
        ds = ManifestDataset(out, split)
        for i in range(len(ds)):
            img, _ = ds[i]
            assert img.mode == "RGB" and img.size == (48, 40)
    report = json.loads((out / "prepare_report.json").read_text())
    assert report["images"] == len(train) + len(val) and report["bad"]["count"] == 0


# ----------------------------------------------------------------------------- layouts


def test_official_archives_are_indexed_where_they_lie_and_nothing_is_extracted(tmp_path):
    mini = Mini()
    root = mini.write_official(tmp_path / "ilsvrc")
    counts = prepare_imagenet(root, tmp_path / "cls", **MINIATURE)
    assert (counts["train"], counts["val"], counts["classes"]) == (12, 8, 4)
    assert_prepared(tmp_path / "cls", mini)
    assert sorted(p.name for p in (tmp_path / "cls").iterdir()) == PREPARED
    train, val = read_manifest(tmp_path / "cls", "train"), read_manifest(tmp_path / "cls", "val")
    assert {image.file for image, _ in train} == {root / TRAIN_TAR}
    assert {image.file for image, _ in val} == {root / "ILSVRC2012_img_val.tar"}
    assert train[0][0].member == f"{WNIDS[0]}.tar/{WNIDS[0]}_0.JPEG"  # the class tar, then the image in it
    sources = json.loads((tmp_path / "cls" / "sources.json").read_text())
    assert sources == {str(p): p.stat().st_size for p in (root / TRAIN_TAR, root / "ILSVRC2012_img_val.tar")}


def test_official_archives_in_two_worker_processes(tmp_path):
    mini = Mini()
    root = mini.write_official(tmp_path / "ilsvrc")
    prepare_imagenet(root, tmp_path / "cls", expect_full=False, workers=2, other_copy=OTHER)
    assert_prepared(tmp_path / "cls", mini)
    prepare_imagenet(root, tmp_path / "one" / "cls", **MINIATURE)  # one process: the same index
    assert (tmp_path / "cls" / "manifest.csv").read_bytes() == (tmp_path / "one" / "cls" / "manifest.csv").read_bytes()


def test_a_relative_root_is_listed_relative_to_the_prepared_folder(tmp_path, monkeypatch):
    """The smoke scale's stand-ins lie in the project (data/smoke): listed relative, the index is the same bytes in
    any clone, and it reads from wherever the project is."""
    Mini().write_official(tmp_path / "data" / "smoke" / "imagenet")
    monkeypatch.chdir(tmp_path)
    prepare_imagenet("data/smoke/imagenet", "data/cls", **MINIATURE)
    assert set(json.loads(Path("data/cls/sources.json").read_text())) == {
        f"../smoke/imagenet/{TRAIN_TAR}",
        "../smoke/imagenet/ILSVRC2012_img_val.tar",
    }
    (tmp_path / "data").rename(tmp_path / "moved")
    monkeypatch.chdir(tmp_path / "moved")
    assert len(ManifestDataset("cls", "train")) == 12


def test_extracted_class_folders_are_indexed_in_place(tmp_path):
    mini = Mini()
    root = mini.class_folders(tmp_path / "imagenet")
    counts = prepare_imagenet(root, tmp_path / "cls", **MINIATURE)
    assert (counts["train"], counts["val"], counts["classes"]) == (12, 8, 4)
    assert_prepared(tmp_path / "cls", mini, names=False)  # no devkit, no synset file: names are wnids
    for image, _ in read_manifest(tmp_path / "cls", "train"):
        assert image.file.is_absolute() and image.file.is_relative_to(root) and not image.member
    assert sorted(p.name for p in (tmp_path / "cls").iterdir()) == PREPARED


@pytest.mark.parametrize("extracted", [False, True], ids=["devkit-tar", "devkit-extracted"])
def test_flat_val_is_labelled_by_the_devkit(tmp_path, extracted):
    mini = Mini()
    root = mini.flat_with_devkit(tmp_path / "imagenet", extracted)
    prepare_imagenet(root, tmp_path / "cls", **MINIATURE)
    assert_prepared(tmp_path / "cls", mini)


def test_flat_val_is_labelled_by_kaggle_csv(tmp_path):
    mini = Mini()
    root = mini.kaggle(tmp_path / "kaggle")
    counts = prepare_imagenet(root, tmp_path / "cls", **MINIATURE)
    assert counts["layout"]["val_labels"] == "kaggle"
    assert_prepared(tmp_path / "cls", mini)


def test_kaggle_without_synset_mapping_names_classes_by_wnid(tmp_path):
    mini = Mini()
    prepare_imagenet(mini.kaggle(tmp_path / "kaggle", synsets=False), tmp_path / "cls", **MINIATURE)
    assert_prepared(tmp_path / "cls", mini, names=False)


def test_val_class_folders_that_train_lacks_are_refused(tmp_path):
    """Class-folder val is labelled by its folder names: a folder train has not would be a class without a label."""
    root = Mini().class_folders(tmp_path / "imagenet")
    (root / "val" / "n09999999").mkdir()
    (root / "val" / "n09999999" / "stray.JPEG").write_bytes(encoded(7))
    with pytest.raises(
        ValueError,
        match=r"val holds class folders absent from .*train \(first: n09999999\); "
        r"train and val must share their classes",
    ):
        prepare_imagenet(root, tmp_path / "cls", **MINIATURE)
    assert not (tmp_path / "cls").exists()


# ----------------------------------------------------------------------------- subsets and counts


def test_full_imagenet_is_expected_unless_told_otherwise(tmp_path):
    root = Mini().class_folders(tmp_path / "imagenet")
    with pytest.raises(
        ValueError,
        match=r"expected 1000 ImageNet-1K classes, found 4 in .*train.*; .*set prepare_cls\.expect_full=false ",
    ):
        prepare_imagenet(root, tmp_path / "cls", workers=1)
    assert not (tmp_path / "cls").exists()


def test_image_counts_are_checked_for_a_full_class_set(tmp_path, monkeypatch):
    import vcarepro.data.imagenet as imagenet

    monkeypatch.setitem(imagenet.EXPECTED, "classes", 4)  # as if the miniature had every class
    with pytest.raises(ValueError, match=r"expected 1,281,167 ImageNet-1K train images, found 12 in "):
        prepare_imagenet(Mini().write_official(tmp_path / "ilsvrc"), tmp_path / "cls", workers=1, other_copy=OTHER)
    assert list(tmp_path.iterdir()) == [tmp_path / "ilsvrc"]  # not even a temporary directory is left


def test_subset_by_count_is_seeded_and_relabelled(tmp_path):
    mini = Mini()
    root = mini.write_official(tmp_path / "ilsvrc")
    first = prepare_imagenet(root, tmp_path / "a", subset_count=2, subset_seed=3, workers=1, other_copy=OTHER)
    prepare_imagenet(root, tmp_path / "b", subset_count=2, subset_seed=3, workers=1, other_copy=OTHER)
    chosen = [c.wnid for c in read_classes(tmp_path / "a")]
    assert chosen == sorted(random.Random(3).sample(WNIDS, 2))
    assert chosen == [c.wnid for c in read_classes(tmp_path / "b")]
    assert first["classes"] == 2
    assert_prepared(tmp_path / "a", mini, wnids=chosen)
    report = json.loads((tmp_path / "a" / "prepare_report.json").read_text())["copy"]["archives"]
    assert report[TRAIN_TAR]["md5"] is None and "reads only its 2 classes' tars" in report[TRAIN_TAR]["not_computed"]


def test_a_subset_reads_only_its_own_class_tars(tmp_path):
    """The other classes' tars are not read at all: here they are not even tars, and the subset prepares."""
    mini = Mini()
    root = mini.write_official(tmp_path / "ilsvrc")
    with tarfile.open(root / TRAIN_TAR, "w") as outer:
        for wnid, files in mini.train.items():
            inner = io.BytesIO()
            with tarfile.open(fileobj=inner, mode="w") as tar:
                for name, data in files.items():
                    add(tar, name, data)
            add(outer, f"{wnid}.tar", inner.getvalue() if wnid == WNIDS[2] else b"\x17" * 4096)
    counts = prepare_imagenet(root, tmp_path / "cls", subset_classes=[WNIDS[2]], **MINIATURE)
    assert (counts["classes"], counts["train"], counts["val"]) == (1, TRAIN_PER_CLASS, VAL_PER_CLASS)
    assert_prepared(tmp_path / "cls", mini, wnids=[WNIDS[2]])


def test_subset_by_list(tmp_path):
    mini = Mini()
    root = mini.flat_with_devkit(tmp_path / "imagenet", extracted=False)
    prepare_imagenet(root, tmp_path / "cls", subset_classes=["n01484850", "n01440764"], **MINIATURE)
    assert_prepared(tmp_path / "cls", mini, wnids=["n01440764", "n01484850"])
    with pytest.raises(ValueError, match="subset_classes names 1 wnids absent from .*n09999999"):
        prepare_imagenet(root, tmp_path / "x", subset_classes=["n01440764", "n09999999"], **MINIATURE)
    with pytest.raises(ValueError, match=r"subset_count must lie in 1\.\.4"):
        prepare_imagenet(root, tmp_path / "x", subset_count=5, **MINIATURE)
    assert not (tmp_path / "x").exists()


# ----------------------------------------------------------------------------- quirks and bad files


def add_quirks(train_class: Path) -> dict:
    """ImageNet's known oddities, plus broken files, into one train class folder."""
    (train_class / "n02105855_2933.JPEG").write_bytes(encoded(7, fmt="PNG"))  # a PNG named .JPEG
    (train_class / "cmyk.JPEG").write_bytes(encoded(8, mode="CMYK"))
    (train_class / "gray.JPEG").write_bytes(encoded(9, mode="L"))
    (train_class / "empty.JPEG").write_bytes(b"")
    whole = encoded(10, size=(160, 120))
    (train_class / "truncated.JPEG").write_bytes(whole[: len(whole) // 2])
    return {"png": "n02105855_2933.JPEG", "bad": {"empty.JPEG", "truncated.JPEG"}}


@pytest.mark.parametrize("archive", [False, True], ids=["folders", "archives"])
def test_quirks_are_kept_and_counted_bad_files_skipped(tmp_path, archive):
    mini = Mini()
    quirks = tmp_path / "quirks"
    quirks.mkdir()
    add_quirks(quirks)
    mini.train[WNIDS[0]].update({p.name: p.read_bytes() for p in quirks.iterdir()})
    root = mini.write_official(tmp_path / "src") if archive else mini.class_folders(tmp_path / "src")
    total = 4 * TRAIN_PER_CLASS + 5 + 4 * VAL_PER_CLASS

    with pytest.raises(
        ValueError,
        match=rf"^2 of {total} ImageNet images are unreadable \(first: .*empty\.JPEG, "
        rf".*truncated\.JPEG\).*raise max_bad_fraction \(now 0\.0\)",
    ):
        prepare_imagenet(root, tmp_path / "cls", expect_full=False, workers=2, other_copy=OTHER)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["quirks", "src"]

    counts = prepare_imagenet(
        root, tmp_path / "cls", expect_full=False, max_bad_fraction=0.1, workers=2, other_copy=OTHER
    )
    assert counts["train"] == 4 * TRAIN_PER_CLASS + 3
    report = json.loads((tmp_path / "cls" / "prepare_report.json").read_text())
    assert report["images"] == total and report["kept"] == {"train": 15, "val": 8}
    assert report["non_jpeg"]["count"] == 1 and report["non_jpeg"]["formats"] == {"PNG": 1}
    assert Path(report["non_jpeg"]["files"][0]).name == "n02105855_2933.JPEG"
    assert report["cmyk"]["count"] == 1 and report["grayscale"]["count"] == 1
    assert report["bad"]["count"] == 2
    assert {Path(b["path"]).name for b in report["bad"]["files"]} == {"empty.JPEG", "truncated.JPEG"}
    assert all(b["reason"] for b in report["bad"]["files"])
    ds = ManifestDataset(tmp_path / "cls", "train")
    assert {image.name for image, _ in ds.samples}.isdisjoint({"empty.JPEG", "truncated.JPEG"})
    for i in range(len(ds)):
        assert ds[i][0].mode == "RGB"  # the PNG, CMYK and grayscale images decode to RGB
    if archive:  # each named as the member of its class tar, in the archive
        assert report["bad"]["files"][0]["path"] == f"{root / TRAIN_TAR}:{WNIDS[0]}.tar/empty.JPEG"


def test_an_image_over_pillows_pixel_limit_is_counted_unreadable_from_its_header(tmp_path):
    """A 2 MB JPEG declaring 13000 x 13000 pixels lies between Pillow's limit and twice it, where Pillow only warns
    (and would decode half a gigabyte); preparation refuses it from its header, listed with its size and the limit."""
    root = Mini().class_folders(tmp_path / "src")
    big = flat_jpeg(13000, 13000)
    assert len(big) < 2_000_000 and 1 < 13000 * 13000 / Image.MAX_IMAGE_PIXELS < 2
    (root / "train" / WNIDS[1] / "big.JPEG").write_bytes(big)
    options = dict(expect_full=False, workers=2, other_copy=OTHER)  # two workers: checked in their processes

    with pytest.raises(BadInput, match=r"^1 of 21 ImageNet images are unreadable \(first: .*big\.JPEG\)"):
        prepare_imagenet(root, tmp_path / "cls", **options)
    counts = prepare_imagenet(root, tmp_path / "cls", max_bad_fraction=0.1, **options)
    assert counts["train"] == 4 * TRAIN_PER_CLASS
    report = json.loads((tmp_path / "cls" / "prepare_report.json").read_text())
    assert report["bad"] == {
        "count": 1,
        "files": [
            {
                "path": str(root / "train" / WNIDS[1] / "big.JPEG"),
                "reason": "13000x13000 pixels, over Pillow's limit of 89,478,485 pixels (PIL.Image.MAX_IMAGE_PIXELS)",
            }
        ],
    }


def test_links_are_followed_wherever_they_lead_and_one_leading_nowhere_is_an_unreadable_image(tmp_path):
    """A link in a class folder is the file it leads to, inside the root or not (a lab's ImageNet built from links
    into a shared store): an image there is kept and read through the link; a loop, a dangling link and a link to a
    file that is no image are each one unreadable image, counted and listed with the reason its read failed."""
    root = Mini().class_folders(tmp_path / "src")
    store = tmp_path / "store"
    store.mkdir()
    (store / "shared.JPEG").write_bytes(encoded(77))
    (store / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    folder = root / "train" / WNIDS[1]
    for name, target in {
        "loop.JPEG": "loop.JPEG",
        "dangling.JPEG": "gone.JPEG",
        "shared.JPEG": store / "shared.JPEG",
        "passwd.JPEG": store / "passwd",
    }.items():
        os.symlink(target, folder / name)

    with pytest.raises(BadInput, match=r"^3 of 24 ImageNet images are unreadable"):
        prepare_imagenet(root, tmp_path / "cls", **MINIATURE)
    counts = prepare_imagenet(root, tmp_path / "cls", max_bad_fraction=0.2, **MINIATURE)
    assert counts["train"] == 4 * TRAIN_PER_CLASS + 1
    report = json.loads((tmp_path / "cls" / "prepare_report.json").read_text())
    reasons = {b["path"]: b["reason"] for b in report["bad"]["files"]}
    assert reasons.pop(str(folder / "passwd.JPEG")).startswith("UnidentifiedImageError: cannot identify image file")
    assert reasons == {
        str(folder / "dangling.JPEG"): "FileNotFoundError: No such file or directory",
        str(folder / "loop.JPEG"): "OSError: Too many levels of symbolic links",
    }
    (shared,) = [image for image, _ in read_manifest(tmp_path / "cls", "train") if image.name == "shared.JPEG"]
    assert shared.file == folder / "shared.JPEG" and read_image(shared) == encoded(77)  # listed as the link


# ----------------------------------------------------------------------------- refused and missing inputs


def test_tar_members_with_parent_paths_are_refused(tmp_path):
    mini = Mini()
    root = mini.write_official(tmp_path / "ilsvrc")
    inner = io.BytesIO()  # a class tar whose image would land two levels above its folder
    with tarfile.open(fileobj=inner, mode="w") as tar:
        add(tar, "../../escaped.JPEG", encoded(1))
    with tarfile.open(root / "ILSVRC2012_img_train.tar", "w") as outer:
        add(outer, f"{WNIDS[0]}.tar", inner.getvalue())
    with pytest.raises(ValueError, match=r"unsafe member path '\.\./\.\./escaped\.JPEG'.*refusing"):
        prepare_imagenet(root, tmp_path / "out" / "cls", **MINIATURE)
    assert not list(tmp_path.rglob("escaped.JPEG"))
    assert not (tmp_path / "out" / "cls").exists()

    with tarfile.open(root / "ILSVRC2012_img_val.tar", "w") as tar:
        add(tar, "/etc/ILSVRC2012_val_00000001.JPEG", encoded(1))
    root2 = tmp_path / "val-only"
    mini.train_folders(root2 / "train")
    (root / "ILSVRC2012_img_val.tar").rename(root2 / "ILSVRC2012_img_val.tar")
    mini.write_devkit(root2)
    with pytest.raises(ValueError, match=r"unsafe member path '/etc/ILSVRC2012_val_00000001\.JPEG'"):
        prepare_imagenet(root2, tmp_path / "out" / "cls", **MINIATURE)
    assert not (tmp_path / "out" / "cls").exists()


def test_missing_inputs_say_what_was_expected_where(tmp_path):
    def fails(root, pattern, error=FileNotFoundError):
        with pytest.raises(error, match=pattern) as info:
            prepare_imagenet(root, tmp_path / "cls", **MINIATURE)
        assert "\n" not in str(info.value)
        assert not (tmp_path / "cls").exists()

    fails(tmp_path / "nowhere", "ImageNet root .*nowhere is not a directory")
    mini = Mini()
    empty = tmp_path / "empty"
    empty.mkdir()
    fails(empty, r"no ILSVRC2012_img_train.tar or train/<wnid>/ class folders under .*empty; expected one of")

    train_only = tmp_path / "train-only"
    mini.train_folders(train_only / "train")
    fails(
        train_only,
        r"no ILSVRC2012_img_val.tar, val/ folder or LOC_val_solution.csv under .*train-only; "
        r"expected one of",
    )

    unlabelled = tmp_path / "unlabelled"
    mini.train_folders(unlabelled / "train")
    mini.flat_val(unlabelled / "val")
    fails(unlabelled, r"validation images under .*unlabelled have no labels; expected ILSVRC2012_devkit_t12.tar.gz")

    half_devkit = tmp_path / "half-devkit"
    mini.train_folders(half_devkit / "train")
    mini.flat_val(half_devkit / "val")
    with tarfile.open(half_devkit / "ILSVRC2012_devkit_t12.tar.gz", "w:gz") as tar:
        add(tar, "ILSVRC2012_devkit_t12/data/meta.mat", mini.meta_mat())
    fails(half_devkit, r"ILSVRC2012_devkit_t12.tar.gz lacks data/meta.mat or data/ILSVRC2012_validation_ground_truth")

    stray = mini.kaggle(tmp_path / "stray")
    (stray / "ILSVRC" / "Data" / "CLS-LOC" / "val" / "ILSVRC2012_val_00000099.JPEG").write_bytes(encoded(3))
    fails(
        stray, r"validation image ILSVRC2012_val_00000099.JPEG in .* has no label in .*LOC_val_solution.csv", ValueError
    )


def test_an_incomplete_folder_copy_fails_before_the_decode_check(tmp_path, monkeypatch):
    import vcarepro.data.imagenet as imagenet

    def never(path):
        raise AssertionError("decode check ran before the counts were checked")

    monkeypatch.setitem(imagenet.EXPECTED, "classes", 4)
    monkeypatch.setattr(imagenet, "_check_image", never)
    with pytest.raises(ValueError, match=r"expected 1,281,167 ImageNet-1K train images, found 12 in .*train"):
        prepare_imagenet(Mini().class_folders(tmp_path / "imagenet"), tmp_path / "cls", workers=1)


# ----------------------------------------------------------------------------- empty classes (issue 23, 8)

EMPTY = "n01482330"  # sorts between n01443537 and n01484850: an empty class here would shift the last two labels


def prepare_cls_stage(project: Path, root: Path, **settings):
    """The real prepare_cls stage on ``root`` in an empty project directory: (result, params.yaml bytes)."""
    import os
    import subprocess
    import sys

    import yaml

    from vcarepro.params.config import compose

    params = compose([])
    params["prepare_cls"].update(source="imagenet", imagenet_root=str(root), expect_full=False, workers=1, **settings)
    project.mkdir()
    (project / "params.yaml").write_text(yaml.safe_dump(params))
    repo = ROOT
    result = subprocess.run(
        [sys.executable, str(repo / "stages" / "prepare_cls.py")],
        cwd=project,
        env={**os.environ, "PYTHONPATH": str(repo / "src")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    return result, (project / "params.yaml").read_bytes()


@pytest.mark.slow
def test_an_empty_class_folder_is_refused_by_the_stage_and_dropped_only_when_asked(tmp_path):
    root = Mini().class_folders(tmp_path / "imagenet")
    (root / "train" / EMPTY).mkdir()
    (root / "val" / EMPTY).mkdir()
    (root / "train" / EMPTY / "notes.txt").write_text("not an image")

    refused, params = prepare_cls_stage(tmp_path / "refused", root)
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.splitlines() == [
        f"error: class {root / 'train' / EMPTY} holds no train images, which would shift every label after it; "
        f"put its images back or remove it, or set prepare_cls.drop_empty_classes=true to leave it out."
    ]
    assert not (tmp_path / "refused" / "data" / "cls").exists()
    assert [p.name for p in (tmp_path / "refused").rglob("*") if p.is_file()] == ["params.yaml"]  # no partial output

    dropped, _ = prepare_cls_stage(tmp_path / "dropped", root, drop_empty_classes=True)
    assert dropped.returncode == 0, dropped.stderr
    assert [line for line in dropped.stderr.splitlines() if line.startswith("warning:")] == [
        f"warning: class {root / 'train' / EMPTY} holds no train images; dropped (prepare_cls.drop_empty_classes), "
        f"so the dataset has 4 classes and the labels after it move down."
    ]
    out = tmp_path / "dropped" / "data" / "cls"
    assert [c.wnid for c in read_classes(out)] == WNIDS  # 4 of the 5 folders, labelled 0..3 without a gap
    assert sorted({label for _, label in read_manifest(out, "train")}) == [0, 1, 2, 3]
    assert_prepared(out, Mini(), names=False)


def test_an_empty_class_tar_or_a_class_without_a_readable_image_is_refused(tmp_path):
    mini = Mini()
    mini.train[EMPTY] = {}
    mini.classes = {**CLASSES, EMPTY: (5, "leopard shark")}
    root = mini.write_official(tmp_path / "ilsvrc")
    with pytest.raises(ValueError, match=rf"class .*{TRAIN_TAR}/{EMPTY} holds no train images.*drop_empty_classes"):
        prepare_imagenet(root, tmp_path / "cls", **MINIATURE)
    assert not (tmp_path / "cls").exists()
    counts = prepare_imagenet(root, tmp_path / "cls", drop_empty_classes=True, **MINIATURE)
    assert counts["classes"] == 4 and [c.wnid for c in read_classes(tmp_path / "cls")] == WNIDS

    broken = Mini().class_folders(tmp_path / "broken")
    for image in (broken / "train" / WNIDS[1]).iterdir():
        image.write_bytes(b"")  # every train image of the class unreadable: it would train with zero images
    with pytest.raises(ValueError, match=rf"class .*{WNIDS[1]} has no readable train image"):
        prepare_imagenet(broken, tmp_path / "cls2", max_bad_fraction=0.5, **MINIATURE)
    assert not (tmp_path / "cls2").exists()


# ----------------------------------------------------------------------------- class names (issue 51)

RULE = r"is not an ImageNet class \(a wnid: n and eight digits, or one the devkit lists\); "


def refused(root: Path, out: Path, pattern: str) -> None:
    """prepare_imagenet on ``root`` is one BadInput sentence matching ``pattern``, and leaves no ``out``."""
    with pytest.raises(BadInput, match=pattern) as info:
        prepare_imagenet(root, out, **MINIATURE)
    assert "\n" not in str(info.value)
    assert not out.exists()


@pytest.mark.parametrize("member", ["...tar", "n0144076.tar"], ids=["dots", "seven-digits"])
def test_outer_train_members_that_are_no_wnid_are_refused(tmp_path, member):
    """A member '...tar' would be a class '..', a label beside the real ones."""
    mini = Mini()
    mini.train[member[: -len(".tar")]] = {"stray.JPEG": encoded(5)}
    root = mini.write_official(tmp_path / "ilsvrc")
    refused(
        root,
        tmp_path / "cls",
        rf"^member '{re.escape(member)}' of .*{TRAIN_TAR} {RULE}"
        rf"remove it, or point prepare_cls\.imagenet_root at the official archive\.$",
    )
    assert not list(tmp_path.rglob("stray.JPEG"))


@pytest.mark.parametrize(
    "layout, folder",
    [
        ("folders", "train/cats"),
        ("folders", "train/n0144076"),
        ("folders", "val/cats"),
        ("kaggle", "ILSVRC/Data/CLS-LOC/train/cats"),
    ],
    ids=["train", "train-seven-digits", "val", "kaggle-train"],
)
def test_class_folders_that_are_no_wnid_are_refused(tmp_path, layout, folder):
    mini = Mini()
    root = mini.class_folders(tmp_path / "imagenet") if layout == "folders" else mini.kaggle(tmp_path / "kaggle")
    (root / folder).mkdir()
    (root / folder / "stray.JPEG").write_bytes(encoded(5))
    parent = (root / folder).parent
    refused(
        root,
        tmp_path / "cls",
        rf"^class folder {re.escape(str(root / folder))} {RULE}"
        rf"rename it to its wnid or move it out of {re.escape(str(parent))}\.$",
    )


@pytest.mark.parametrize("layout", ["archives", "flat-val", "class-folders"])
def test_a_class_the_devkit_lists_is_accepted_whatever_its_name(tmp_path, layout):
    """The wnid pattern is what ImageNet's classes look like; a devkit's meta.mat may list others."""
    mini = Mini()
    mini.classes = {**CLASSES, "cats": (5, "cats, stand-in")}
    mini.train["cats"] = {f"cats_{i}.JPEG": encoded(500 + i) for i in range(TRAIN_PER_CLASS)}
    cats_val = f"ILSVRC2012_val_{len(mini.val) + 1:08d}.JPEG"  # the ground truth's next line
    mini.val[cats_val] = ("cats", encoded(599))
    if layout == "archives":
        root = mini.write_official(tmp_path / "src")
    elif layout == "flat-val":
        root = mini.flat_with_devkit(tmp_path / "src", extracted=True)
    else:
        root = mini.class_folders(tmp_path / "src")
        mini.write_devkit(root)
    counts = prepare_imagenet(root, tmp_path / "cls", **MINIATURE)
    assert counts["classes"] == 5
    classes = read_classes(tmp_path / "cls")
    assert [(c.wnid, c.name) for c in classes][:2] == [("cats", "cats, stand-in"), (WNIDS[0], CLASSES[WNIDS[0]][1])]
    train, val = read_manifest(tmp_path / "cls", "train"), read_manifest(tmp_path / "cls", "val")
    assert sorted(image.name for image, label in train if label == 0) == sorted(mini.train["cats"])
    assert [image.name for image, label in val if label == 0] == [cats_val]


def test_a_devkit_listing_dots_or_a_slash_does_not_make_them_class_folders():
    """A crafted meta.mat may list '..' as a class: the name would still leave the prepared layout."""
    from vcarepro.data.imagenet import _class_name

    for name in ("..", ".", "a/b", "a\\b"):
        with pytest.raises(BadInput, match="is not an ImageNet class"):
            _class_name(name, {name}, f"member {name!r}", "fix it")
    assert _class_name("cats", {"cats"}, "member 'cats'", "fix it") == "cats"


# ----------------------------------------------------------------------------- the archives' MD5s, and changed sources


def md5(path: Path) -> str:
    import hashlib

    return hashlib.md5(path.read_bytes()).hexdigest()


def test_archives_must_carry_the_published_md5s_unless_another_copy_is_accepted_with_a_reason(tmp_path, monkeypatch):
    import vcarepro.data.imagenet as imagenet

    root = Mini().write_official(tmp_path / "ilsvrc")
    files = {name: root / name for name in imagenet.PUBLISHED_MD5}
    with pytest.raises(  # the devkit is checked first, before the long pass over the images
        BadInput,
        match=rf"^{re.escape(str(files[imagenet.DEVKIT_TAR]))} has MD5 {md5(files[imagenet.DEVKIT_TAR])}, not the "
        r"fa75699e90414af021442c21a62c3abf ImageNet publishes for ILSVRC2012_devkit_t12\.tar\.gz: .*re-download it, "
        r"or set prepare_cls\.other_copy to the reason to use this copy\.$",
    ):
        prepare_imagenet(root, tmp_path / "cls", expect_full=False, workers=1)
    assert not (tmp_path / "cls").exists()

    monkeypatch.setattr(imagenet, "PUBLISHED_MD5", {name: md5(path) for name, path in files.items()})
    prepare_imagenet(root, tmp_path / "cls", expect_full=False, workers=2)  # this copy is "the published one"
    copy = json.loads((tmp_path / "cls" / "prepare_report.json").read_text())["copy"]
    assert copy["differ"] == [] and copy["other_copy"] is None
    assert {name: found["md5"] for name, found in copy["archives"].items()} == imagenet.PUBLISHED_MD5
    assert data_copy(tmp_path / "cls") == (  # what the report says of it
        "ImageNet's published archives (MD5 checked: ILSVRC2012_devkit_t12.tar.gz, ILSVRC2012_img_train.tar, "
        "ILSVRC2012_img_val.tar)."
    )

    val = files[imagenet.VAL_TAR]
    val.write_bytes(val.read_bytes() + b"\0" * 512)  # one more zero block: the same images, another copy
    with pytest.raises(
        BadInput,
        match=rf"^{re.escape(str(val))} has MD5 {md5(val)}, not the {copy['archives'][imagenet.VAL_TAR]['md5']} ",
    ):
        prepare_imagenet(root, tmp_path / "again", expect_full=False, workers=1)
    assert not (tmp_path / "again").exists()
    prepare_imagenet(root, tmp_path / "again", expect_full=False, workers=1, other_copy="our mirror's val tar")
    copy = json.loads((tmp_path / "again" / "prepare_report.json").read_text())["copy"]
    assert copy["differ"] == [imagenet.VAL_TAR] and copy["other_copy"] == "our mirror's val tar"
    assert data_copy(tmp_path / "again") == (
        f"another copy than ImageNet's published archives: ILSVRC2012_img_val.tar ({md5(val)}), used because: "
        "our mirror's val tar."
    )
    prepare_imagenet(root, tmp_path / "subset", subset_count=2, workers=1, other_copy="our mirror's val tar")
    assert data_copy(tmp_path / "subset").endswith(
        "used because: our mirror's val tar; ILSVRC2012_img_train.tar's MD5 not computed (a subset reads only its 2 "
        "classes' tars)."
    )
    export_digits(tmp_path / "digits")
    assert data_copy(tmp_path / "digits") is None  # not ImageNet: nothing said


def test_a_source_that_changed_after_preparation_is_one_sentence_naming_it(tmp_path):
    """An archive of another size is refused before any read; a changed member fails its read's CRC-32, naming the
    archive and the member, whatever its size."""
    from vcarepro.data.folders import UnreadableImage

    root = Mini().write_official(tmp_path / "ilsvrc")
    prepare_imagenet(root, tmp_path / "cls", **MINIATURE)
    archive = root / TRAIN_TAR
    image, _ = read_manifest(tmp_path / "cls", "train")[5]
    original = archive.read_bytes()

    changed = bytearray(original)
    changed[image.offset + image.length // 2] ^= 0xFF  # same size, one byte of one image
    archive.write_bytes(bytes(changed))
    data = ManifestDataset(tmp_path / "cls", "train")
    data[4]  # its neighbours read as before
    with pytest.raises(UnreadableImage) as info:
        data[5]
    assert str(info.value) == (
        f"the prepared image {archive}:{image.member} cannot be read (its bytes are not those prepare_cls indexed: "
        f"CRC-32 differs); the prepared data is damaged: restore {archive} as it was, or re-run prepare_cls "
        f"(`dvc repro -f -s prepare_cls`), then `dvc repro`."
    )

    archive.write_bytes(original[:-1024])  # cut short
    with pytest.raises(
        BadInput,
        match=rf"^{re.escape(str(archive))} holds {len(original) - 1024:,} bytes, not the "
        rf"{len(original):,} prepare_cls indexed: it changed after preparation; restore ",
    ):
        ManifestDataset(tmp_path / "cls", "train")
    archive.unlink()
    with pytest.raises(FileNotFoundError, match=rf"^{re.escape(str(archive))}, which .*cls reads its images from, "):
        read_manifest(tmp_path / "cls", "val")
