"""Gather everything the report shows from files on disk."""

from __future__ import annotations

import base64
import csv
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from vcarepro.params.provenance import Stale, check


@dataclass
class RunResult:
    branch: str
    name: str
    metrics: Optional[Dict[str, float]]
    curves: Dict[str, Dict[int, List[tuple]]] = field(default_factory=dict)  # metric -> seed -> [(step, value)]
    grids: Dict[int, str] = field(default_factory=dict)  # seed -> data URI
    # set where metrics.json was not produced by the current params: then metrics, curves and grids are empty
    stale: Optional[Stale] = None


def read_json(path: Path) -> Optional[Dict[str, Any]]:
    return json.loads(path.read_text()) if path.is_file() else None


def read_curves(live_dir: Path) -> Dict[str, Dict[int, List[tuple]]]:
    """dvclive logs ``plots/metrics/seed_<s>/<group>/<name>.tsv`` -> {'<group>/<name>': {seed: [(step, value)]}}."""
    curves: Dict[str, Dict[int, List[tuple]]] = {}
    root = live_dir / "plots" / "metrics"
    for tsv in sorted(root.glob("seed_*/**/*.tsv")):
        rel = tsv.relative_to(root)
        seed = int(rel.parts[0].removeprefix("seed_"))
        metric = "/".join(rel.parts[1:])[: -len(".tsv")]
        with tsv.open(newline="") as f:
            rows = list(csv.DictReader(f, delimiter="\t"))
        value_key = rel.stem
        curves.setdefault(metric, {})[seed] = [(int(r["step"]), float(r[value_key])) for r in rows]
    return curves


def png_data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def collect_runs(
    runs_root: Path, branch: str, names: List[str], params: Optional[Dict[str, Any]] = None
) -> Dict[str, RunResult]:
    """Each run's files; with ``params``, a run whose record (provenance.json) disagrees with them is
    collected as stale, without its numbers, so nothing downstream can show or compute with them."""
    results = {}
    for name in names:
        root = runs_root / branch / name
        stale = None if params is None else check(root, params, branch, name)
        if stale is not None:
            results[name] = RunResult(branch, name, None, stale=stale)
            continue
        result = RunResult(branch, name, read_json(root / "metrics.json"), read_curves(root / "live"))
        for grid in sorted((root / "samples").glob("grid_seed_*.png")):
            result.grids[int(grid.stem.removeprefix("grid_seed_"))] = png_data_uri(grid)
        results[name] = result
    return results


# The real-image grid beside the sample grids: the layout sample_gen's preview uses (the first ten classes,
# eight images each, one pixel of padding), so a reader compares like with like.
REAL_GRID_CLASSES, REAL_GRID_PER_CLASS = 10, 8


def real_grid(gen_data: Path) -> Dict[str, Any]:
    """{"uri": PNG data URI of training images, "note"}; at latent scales there are no pixels to show."""
    meta = read_json(gen_data / "meta.json")
    if not meta:
        return {"uri": None, "note": f"{gen_data} is not prepared (dvc repro prepare_gen)."}
    if meta.get("kind") != "pixels":
        return {
            "uri": None,
            "note": "the generators train on VAE latents at this scale: there is no pixel grid of "
            "the training data to show beside the samples.",
        }
    import io as _io

    import numpy as np
    from PIL import Image
    from safetensors.numpy import load_file

    data = load_file(str(gen_data / "train.safetensors"))
    images, labels = data["images"], data["labels"]
    classes = [c for c in range(min(REAL_GRID_CLASSES, int(data["num_classes"])))]
    chosen = [np.flatnonzero(labels == c)[:REAL_GRID_PER_CLASS] for c in classes]
    _, channels, h, w = images.shape
    grid = np.zeros((len(classes) * (h + 1) + 1, REAL_GRID_PER_CLASS * (w + 1) + 1, channels), np.uint8)
    for row, idx in enumerate(chosen):
        for col, i in enumerate(idx):
            grid[1 + row * (h + 1) : 1 + row * (h + 1) + h, 1 + col * (w + 1) : 1 + col * (w + 1) + w] = images[
                i
            ].transpose(1, 2, 0)
    buf = _io.BytesIO()
    Image.fromarray(grid[..., 0] if channels == 1 else grid).save(buf, format="PNG")
    return {
        "uri": "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii"),
        "note": f"the first {REAL_GRID_PER_CLASS} training images of classes 0-{len(classes) - 1}, one class "
        f"per row, as the sample grids lay out their samples",
    }


def data_copy(cls_data: Path) -> Optional[str]:
    """Which copy of ImageNet the classification data was indexed from, in a sentence (prepare_cls's report), or
    None where it is not ImageNet (the digits)."""
    report = read_json(cls_data / "prepare_report.json")
    if not report:
        return None
    copy = report.get("copy") or {}
    archives = copy.get("archives") or {}
    if not archives:
        return "ImageNet from extracted folders: no archive whose MD5 could be checked."
    checked = sorted(name for name, found in archives.items() if found["md5"])
    unchecked = [
        f"{name}'s MD5 not computed ({found['not_computed']})" for name, found in archives.items() if not found["md5"]
    ]
    if copy.get("differ"):
        said = (
            f"another copy than ImageNet's published archives: {', '.join(copy['differ'])} "
            f"({', '.join(archives[n]['md5'] for n in copy['differ'])}), used because: {copy['other_copy']}"
        )
    else:
        said = f"ImageNet's published archives (MD5 checked: {', '.join(checked)})"
    return "; ".join([said, *unchecked]) + "."
