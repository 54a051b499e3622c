"""ImageNet-1K's file count through the paper scale's preparation and DVC: what they cost before the first GPU step.

Generated archives in the official layout, at ImageNet-1K's counts (1,000 class tars, 1,281,167 train and 50,000 val
members, each a tiny JPEG, so that it fits in a few GB), are prepared by ``prepare_imagenet`` as a DVC stage of a
scratch repository with this project's cache type, beside as many stages reading ``data/cls`` as the paper pipeline
has (on DVC's own graph, as the preflight counts them). Then the fast input path's CPU rate is compared on the same
ImageNet-sized photographs read from their archive and from files. The old layout's DVC cost is the extracted
images as one output, measured on ``before_files`` of them and scaled to ImageNet's count per file.
"""

from __future__ import annotations

import io
import json
import os
import random
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import yaml

from vcarepro.core.io import atomic_directory, atomic_open, write_json, write_text
from vcarepro.data.imagenet import EXPECTED, TRAIN_TAR, VAL_TAR
from vcarepro.params import runs
from vcarepro.params.config import REPO_ROOT

CLS_DATA = str(runs.CLS_DATA)
GOALS = {"files": 10, "record_s": 10.0, "status_s": 30.0, "archive_over_files": 0.95}


def _tiny_jpegs(count: int, seed: int) -> List[bytes]:
    """``count`` distinct 24 x 24 JPEGs of coloured blocks, about 700 bytes each: decoded and checked like any other."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        blocks = rng.integers(0, 256, (3, 3, 3), dtype=np.uint8).repeat(8, 0).repeat(8, 1)
        buffer = io.BytesIO()
        Image.fromarray(blocks).save(buffer, "JPEG", quality=85)
        out.append(buffer.getvalue())
    return out


def write_imagenet_archives(root: str | Path, *, counts: Optional[Dict[str, int]] = None, seed: int = 0) -> Path:
    """The official download's three files under ``root``, at ``counts`` (default ImageNet-1K's): a train tar of one
    ``<wnid>.tar`` per class (the real wnids), a flat val tar, and a devkit labelling the val images."""
    from timm.data import ImageNetInfo

    from vcarepro.tools.standins import MiniImageNet, add_to_tar

    counts = {**EXPECTED, **(counts or {})}
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    wnids = ImageNetInfo().label_names()[: counts["classes"]]
    pool = _tiny_jpegs(256, seed)
    per_class = [counts["train"] // len(wnids) + (k < counts["train"] % len(wnids)) for k in range(len(wnids))]
    with atomic_open(root / TRAIN_TAR) as raw, tarfile.open(fileobj=raw, mode="w") as outer:
        for k, (wnid, n) in enumerate(zip(wnids, per_class)):
            inner = io.BytesIO()
            with tarfile.open(fileobj=inner, mode="w") as tar:
                for i in range(n):
                    add_to_tar(tar, f"{wnid}_{i}.JPEG", pool[(k + i) % len(pool)])
            add_to_tar(outer, f"{wnid}.tar", inner.getvalue())
    labels = [wnids[n % len(wnids)] for n in range(counts["val"])]
    random.Random(seed).shuffle(labels)
    val = {f"ILSVRC2012_val_{n:08d}.JPEG": (wnid, b"") for n, wnid in enumerate(labels, 1)}
    with atomic_open(root / VAL_TAR) as raw, tarfile.open(fileobj=raw, mode="w") as tar:
        for n, name in enumerate(val):
            add_to_tar(tar, name, pool[n % len(pool)])
    classes = {wnid: (k + 1, f"class {k}") for k, wnid in enumerate(wnids)}
    MiniImageNet(classes, {}, val).write_devkit(root)
    return root


def _dvc(cwd: Path, *args: str) -> float:
    """Seconds ``dvc *args`` took in ``cwd`` (it must succeed)."""
    start = time.time()
    subprocess.run(
        [sys.executable, "-m", "dvc", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        env={**os.environ, "DVC_NO_ANALYTICS": "1"},
    )
    return time.time() - start


def _dvc_repo(path: Path, producer: str, readers: int, cache_type: bool = True) -> Path:
    """A git + DVC repository with this project's cache type (``cache_type``, else DVC's default) and a pipeline:
    ``producer`` writes data/cls (and its own seconds to producer.json), and ``readers`` stages each read data/cls."""
    path.mkdir(parents=True)
    subprocess.run(["git", "init", "-q"], cwd=path, check=True)
    _dvc(path, "init", "-q")
    project_type = subprocess.run(
        [sys.executable, "-m", "dvc", "config", "cache.type"], cwd=REPO_ROOT, capture_output=True, text=True
    ).stdout.strip()
    _dvc(path, "config", "core.analytics", "false")
    if cache_type and project_type:  # the project's: what a lab's data/cls is stored with
        _dvc(path, "config", "cache.type", project_type)
    stages: Dict[str, Any] = {"prepare_cls": {"cmd": producer, "outs": [CLS_DATA]}}
    for k in range(readers):
        stages[f"read_{k:03d}"] = {"cmd": f"echo {k} > read/{k:03d}", "deps": [CLS_DATA], "outs": [f"read/{k:03d}"]}
    write_text(path / "dvc.yaml", yaml.safe_dump({"stages": stages}, sort_keys=False))
    (path / "read").mkdir()
    subprocess.run("git add -A && git -c user.name=b -c user.email=b@b commit -qm bench", shell=True, cwd=path)
    return path


def _stage_costs(repo: Path) -> Dict[str, Any]:
    """DVC's time to record data/cls after its command, a no-change `dvc status` with every reader, what it holds."""
    start = time.time()
    _dvc(repo, "repro", "prepare_cls")
    ended = time.time()
    command = json.loads((repo / "producer.json").read_text())
    _dvc(repo, "repro")  # the readers, once
    status = statistics.median(_dvc(repo, "status") for _ in range(3))
    files = [p for p in (repo / CLS_DATA).rglob("*") if p.is_file()]
    cache = repo / ".dvc" / "cache"
    cached = {(p.stat().st_dev, p.stat().st_ino) for p in cache.rglob("*") if p.is_file()}
    return {
        "command_s": command["seconds"],
        "record_s": ended - command["ended"],  # from the command's end to DVC's: hashing, caching, the lock
        "repro_s": ended - start,
        "status_s": status,
        "files": len(files),
        "bytes": sum(p.stat().st_size for p in files),
        "stored_twice_bytes": sum(p.stat().st_size for p in files if (p.stat().st_dev, p.stat().st_ino) not in cached),
    }


def prepare(root: str, out: str, workers: int, expect_full: bool = True) -> None:
    """The scratch repository's stage command: the paper scale's preparation of ``root``, timed by itself."""
    from vcarepro.data.imagenet import prepare_imagenet

    start = time.perf_counter()
    counts = prepare_imagenet(
        root, out, workers=workers, expect_full=expect_full, other_copy="generated for the benchmark, not ImageNet"
    )
    write_json("producer.json", {"seconds": time.perf_counter() - start, "ended": time.time(), **counts})


def extract(root: str, out: str, files: int) -> None:
    """The old layout's stage command: the first ``files`` train images extracted into class folders."""
    start, done = time.perf_counter(), 0
    with atomic_directory(out) as tmp, tarfile.open(Path(root) / TRAIN_TAR) as outer:
        for member in outer:
            with tarfile.open(fileobj=outer.extractfile(member)) as inner:
                (tmp / member.name[:-4]).mkdir()
                for image in inner:
                    (tmp / member.name[:-4] / image.name).write_bytes(inner.extractfile(image).read())
                    done += 1
                    if done == files:
                        break
            if done == files:
                break
    write_json("producer.json", {"seconds": time.perf_counter() - start, "ended": time.time()})


def _command(*args: Any) -> str:
    return f"{sys.executable} -m vcarepro.tools.bench.imagenet_scale " + " ".join(map(str, args))


def dvc_costs(scratch: Path, archives: Path, *, workers: int, before_files: int, full: bool = True) -> Dict[str, Any]:
    """The paper scale's preparation of ``archives`` as a DVC stage with the paper pipeline's readers of data/cls,
    and the old layout (images extracted) measured on ``before_files`` of them."""
    from vcarepro.params.config import compose
    from vcarepro.tools.preflight.dvc_bill import readers as reading

    readers = reading(compose(["scale=paper"]), [CLS_DATA])[CLS_DATA]
    now = _stage_costs(_dvc_repo(scratch / "now", _command("prepare", archives, CLS_DATA, workers, int(full)), readers))
    extract_command = _command("extract", archives, CLS_DATA, before_files)
    before = _stage_costs(_dvc_repo(scratch / "before", extract_command, readers, cache_type=False))
    return {"readers": readers, "now": now, "before": before, "before_files": before_files}


def loader_rates(scratch: Path, *, images: int, seconds: float, rounds: int = 5) -> Dict[str, Any]:
    """The fast path's CPU rate on one core, images/s, on the same ImageNet-sized photographs prepared from the
    official archives and from extracted class folders; the two in turn, ``rounds`` times, the median of each."""
    import torch

    from vcarepro.data.folders import read_image, read_manifest
    from vcarepro.data.imagenet import prepare_imagenet
    from vcarepro.params.config import compose
    from vcarepro.params.runs import cls_recipe
    from vcarepro.tools.bench.loader import _rate, path_step, write_imagenet_like_jpegs
    from vcarepro.tools.standins import MiniImageNet

    written = write_imagenet_like_jpegs(scratch / "photos", images)
    photos = [read_image(image) for image, _ in read_manifest(written, "train")]
    wnids = ["n01440764", "n01443537"]
    mini = MiniImageNet(
        {w: (k + 1, w) for k, w in enumerate(wnids)},
        {w: {f"{w}_{i}.JPEG": data for i, data in enumerate(photos[k::2])} for k, w in enumerate(wnids)},
        {f"ILSVRC2012_val_{n:08d}.JPEG": (wnids[n % 2], photos[n]) for n in (1, 2)},
    )
    roots = {"archive": mini.write_official(scratch / "archive"), "files": scratch / "files"}
    placed = [("train", w, name, data) for w, files in mini.train.items() for name, data in files.items()]
    placed += [("val", w, name, data) for name, (w, data) in mini.val.items()]
    with atomic_directory(roots["files"]) as tmp:  # the same images, extracted into class folders
        for split, wnid, name, data in placed:
            (tmp / split / wnid).mkdir(parents=True, exist_ok=True)
            (tmp / split / wnid / name).write_bytes(data)
    recipe = cls_recipe(compose(["scale=paper"]), "lab_deit_tiny").model_copy(update={"input_path": "fast"})
    steps = {}
    for layout, root in roots.items():
        prepared = scratch / f"{layout}-cls"
        prepare_imagenet(root, prepared, expect_full=False, workers=1, other_copy="the benchmark's photographs")
        steps[layout] = path_step(prepared, recipe, "fast")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        measured: Dict[str, List[float]] = {layout: [] for layout in steps}
        for _ in range(rounds):
            for layout, step in steps.items():
                measured[layout].append(_rate(step, seconds / rounds)["images_per_s"])
    finally:
        torch.set_num_threads(threads)
    rates = {layout: statistics.median(r) for layout, r in measured.items()}
    return {"images": images, "rounds": measured, **rates, "archive_over_files": rates["archive"] / rates["files"]}


def bench_imagenet_scale(
    scratch: Optional[str] = None,
    *,
    workers: int = 2,
    before_files: int = 20_000,
    images: int = 256,
    seconds=6.0,
    counts: Optional[Dict[str, int]] = None,
) -> Dict[str, Any]:
    """Every figure of the module docstring, in a temporary directory under ``scratch``; ``counts`` (classes, train,
    val) shrink the archives below ImageNet-1K's, for a check of the road."""
    with tempfile.TemporaryDirectory(prefix="bench-imagenet-", dir=scratch) as tmp:
        root = Path(tmp)
        start = time.perf_counter()
        archives = write_imagenet_archives(root / "imagenet", counts=counts)
        full = {**EXPECTED, **(counts or {})}
        figures: Dict[str, Any] = {
            "images": full["train"] + full["val"],
            "archives_bytes": sum(p.stat().st_size for p in archives.iterdir()),
            "generated_s": time.perf_counter() - start,
        }
        figures.update(dvc_costs(root, archives, workers=workers, before_files=before_files, full=full == EXPECTED))
        figures["loader"] = loader_rates(root / "loader", images=images, seconds=seconds)
    return figures


def imagenet_scale_table(figures: Dict[str, Any]) -> str:
    """The figures beside the goals, as a Markdown table (docs/performance.md)."""
    now, before, n = figures["now"], figures["before"], figures["images"]
    scale = n / figures["before_files"]

    def scaled(key: str) -> float:  # the old layout's cost per file, measured on a part of them, at n files
        return now[key] + (before[key] - now[key]) * scale

    rows = [
        ("files under data/cls", f"{n:,} (the images)", f"{now['files']}", f"<= {GOALS['files']}"),
        ("the preparation itself", "-", f"{now['command_s']:.0f} s", "-"),
        (
            "DVC records data/cls",
            f"{scaled('record_s'):,.0f} s",
            f"{now['record_s']:.1f} s",
            f"<= {GOALS['record_s']:g} s",
        ),
        (
            f"no-change `dvc status`, {figures['readers']} stages read data/cls",
            f"{scaled('status_s'):,.0f} s",
            f"{now['status_s']:.1f} s",
            f"<= {GOALS['status_s']:g} s",
        ),
        (
            "data/cls stored twice (a copy in DVC's cache)",
            f"{before['stored_twice_bytes'] * scale / 1e9:.1f} GB",
            f"{now['stored_twice_bytes'] / 1e9:.1f} GB",
            "0",
        ),
    ]
    loader = figures["loader"]
    lines = [
        f"| at {n:,} images | before: extracted, DVC's default cache ({figures['before_files']:,} files measured, "
        f"per file x{scale:.1f}) | now: indexed in the archives | goal |",
        "|---|---:|---:|---:|",
        *(f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows),
        "",
        f"fast path, CPU side, one core, on {loader['images']} ImageNet-sized photographs: {loader['files']:.0f} "
        f"images/s from files, {loader['archive']:.0f} from the archive: {loader['archive_over_files']:.0%} "
        f"(goal >= {GOALS['archive_over_files']:.0%})",
    ]
    return "\n".join(lines)


if __name__ == "__main__":  # the scratch repositories' stage commands
    {
        "prepare": lambda a: prepare(a[0], a[1], int(a[2]), bool(int(a[3]))),
        "extract": lambda a: extract(a[0], a[1], int(a[2])),
    }[sys.argv[1]](sys.argv[2:])
