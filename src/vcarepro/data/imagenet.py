"""ImageNet-1K from a path (extracted class folders). Archives, devkit and Kaggle layouts: issue 4."""
from __future__ import annotations

from pathlib import Path

from ..io import atomic_directory, write_json
from .folders import CLASSES, write_manifest

IMAGE_SUFFIXES = {".jpeg", ".jpg", ".png"}


def index_imagenet_folders(root: str | Path, out: str | Path) -> dict:
    """Index ``root/train/<wnid>/*`` and ``root/val/<wnid>/*`` into the prepared layout (no copying)."""
    root = Path(root)
    train, val = root / "train", root / "val"
    if not train.is_dir() or not val.is_dir():
        raise FileNotFoundError(
            f"expected ImageNet class folders at {train} and {val}; set prepare_cls.imagenet_root in conf/ "
            f"(or pick scale=embedded)."
        )
    wnids = sorted(d.name for d in train.iterdir() if d.is_dir())
    val_wnids = sorted(d.name for d in val.iterdir() if d.is_dir())
    if wnids != val_wnids:
        raise ValueError(f"{train} and {val} hold different class folders ({len(wnids)} vs {len(val_wnids)}); "
                         f"extract val into class folders too.")
    rows = []
    for split, folder in (("train", train), ("val", val)):
        for label, wnid in enumerate(wnids):
            for f in sorted((folder / wnid).iterdir()):
                if f.suffix.lower() in IMAGE_SUFFIXES:
                    rows.append((split, str(f.resolve()), label))
    with atomic_directory(out) as tmp:
        write_json(tmp / CLASSES, [{"index": i, "wnid": w, "name": w} for i, w in enumerate(wnids)])
        write_manifest(tmp, rows)
    return {"train": sum(r[0] == "train" for r in rows), "val": sum(r[0] == "val" for r in rows),
            "classes": len(wnids)}
