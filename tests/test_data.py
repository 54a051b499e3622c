"""The prepared classification layout and the embedded digits (ImageNet's layouts: tests/test_imagenet.py)."""

from __future__ import annotations

import csv
import io
import json
import tarfile
from collections import Counter

import numpy as np
import pytest
from PIL import Image
from sklearn.datasets import load_digits

from vcarepro.data.embedded import export_digits
from vcarepro.data.folders import ManifestDataset, read_classes, read_image, read_manifest
from vcarepro.data.pixels import load_split_pixels


@pytest.fixture(scope="module")
def digits_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("prepared") / "cls"
    counts = export_digits(root, val_fraction=0.2, seed=0)
    return root, counts


def test_digits_export_is_a_stratified_split_of_all_1797_images(digits_root):
    root, counts = digits_root
    assert counts == {"train": 1437, "val": 360, "classes": 10}
    train, val = read_manifest(root, "train"), read_manifest(root, "val")
    assert len(train) + len(val) == 1797
    per_class_val = Counter(label for _, label in val)
    per_class_all = Counter(load_digits().target.tolist())
    for c in range(10):  # each class keeps its share within one image
        assert abs(per_class_val[c] - 0.2 * per_class_all[c]) <= 1
    assert not {image.member for image, _ in train} & {image.member for image, _ in val}


def test_digits_images_decode_to_the_original_pixels(digits_root):
    root, _ = digits_root
    digits = load_digits()
    image, label = read_manifest(root, "val")[0]
    index = int(image.name.split(".")[0])
    with Image.open(io.BytesIO(read_image(image))) as img:
        assert img.size == (8, 8) and img.mode == "L"
        pixels = np.asarray(img)
    np.testing.assert_array_equal(pixels, np.rint(digits.images[index] * 255 / 16).astype(np.uint8))
    assert label == digits.target[index]
    assert image.member.startswith(f"val/digit_{label}/")


def test_the_digits_are_packed_as_imagenets_archives_are_and_each_row_is_its_members_bytes(digits_root):
    """One layout for every scale: a tar in the prepared folder, each image read by its offset, as ImageNet's are."""
    root, _ = digits_root
    assert sorted(p.name for p in root.iterdir()) == ["classes.json", "images.tar", "manifest.csv", "sources.json"]
    with (root / "manifest.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    with tarfile.open(root / "images.tar") as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    assert len(rows) == len(members) == 1797 and {r["file"] for r in rows} == {"images.tar"}
    for image, _ in [*read_manifest(root, "train"), *read_manifest(root, "val")]:
        assert read_image(image) == members[image.member]
    assert json.loads((root / "sources.json").read_text()) == {"images.tar": (root / "images.tar").stat().st_size}
    classes = json.loads((root / "classes.json").read_text())
    assert [c["index"] for c in classes] == list(range(10))
    assert read_classes(root)[3].wnid == "digit_3"
    assert not list(root.parent.glob(".cls.*"))  # no temporary directory left behind


def test_manifest_dataset_yields_rgb_images_with_labels(digits_root):
    root, _ = digits_root
    ds = ManifestDataset(root, "train", transform=lambda img: (img.mode, img.size))
    assert len(ds) == 1437 and len(ds.targets) == 1437
    (mode, size), label = ds[0]
    assert mode == "RGB" and size == (8, 8) and 0 <= label < 10


def test_pixels_for_generation_keep_one_channel_and_map_to_minus_one_one(digits_root):
    root, _ = digits_root
    data = load_split_pixels(root, "train", 16)
    assert data["images"].shape == (1437, 1, 16, 16) and data["images"].dtype.is_floating_point is False
    assert data["inputs"].min() >= -1 and data["inputs"].max() <= 1
    assert data["inputs"].max() > 0.9  # ink reaches full intensity
    assert int(data["num_classes"]) == 10 and data["labels"].shape == (1437,)


def test_bad_inputs_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        export_digits(tmp_path / "x", val_fraction=1.5)
    with pytest.raises(FileNotFoundError, match="run the prepare_cls stage"):
        read_manifest(tmp_path, "train")
    with pytest.raises(ValueError, match="unknown split 'test'"):
        read_manifest(tmp_path, "test")
