"""What the selected runs will hold on disk, family by family: the prepared index (data/cls), the generation data
(data/gen), the resume checkpoints, the trained weights and the samples, each as the outputs dvc.yaml names, with
their bytes and the files DVC tracks in them. Each size follows the format its writer uses, cited where it is
computed; a model's state is counted on the model built on the meta device (shapes only: no memory, no compute)."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from vcarepro.core.integrity import sidecar_text
from vcarepro.params.runs import CLS_DATA, GEN_DATA
from vcarepro.tools.preflight.sizing import Dataset, expected_classes, known_val_images

DIGEST = hashlib.sha256().hexdigest()  # any SHA-256: a digest file's size depends only on its length


@dataclass
class Output:
    path: str  # as dvc.yaml names it (a checkpoint folder: as the training stages name it)
    bytes: int
    files: int  # the files DVC tracks in it: 0 where DVC does not track it
    readers: int = 0  # the stages whose deps hold it whole, on DVC's graph of the scale (dvc_bill)


@dataclass
class Family:
    name: str
    where: str  # the outputs' paths, with <run> for a run's name
    outputs: List[Output]
    estimated: str = ""  # how the size was estimated, where it is not measured or exact by the format
    # where it lands on this machine, and what DVC makes of it (dvc_bill.place)
    cache: str = "not DVC's"  # how DVC's cache holds it: copy (a second copy), reflink, hardlink, symlink
    device: int = 0
    filesystem: str = ""
    free: Optional[int] = None
    present: int = 0  # bytes its outputs already hold here
    hash_s: Optional[float] = None
    status_s: Optional[float] = None

    @property
    def bytes(self) -> int:
        return sum(o.bytes for o in self.outputs)

    @property
    def files(self) -> int:
        return sum(o.files for o in self.outputs)


@dataclass(frozen=True)
class SavedState:
    model: int  # bytes of the model's state dict (weights and buffers)
    optimizer: int  # bytes of the optimizer's state once it has stepped
    ema: bool  # training keeps timm's ModelEmaV3, a deep copy of the model saved beside it
    input_shape: Tuple[int, ...] = ()  # a generator's (channels, height, width): the generation data's shape

    @property
    def checkpoint(self) -> int:
        """train/checkpoint.py save_training: the state dict of each part (model, EMA, optimizer; the scheduler's
        and the loss scaler's are a few numbers)."""
        return self.model * (2 if self.ema else 1) + self.optimizer


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if torch.is_tensor(t))


def saved_state(run, branch: str, num_classes: int) -> SavedState:
    """What training saves of ``run`` (built by ``cost.meta_model``); the optimizer steps once on zero gradients
    so that its state exists."""
    from vcarepro.tools.bench.train_step import model_input_shape
    from vcarepro.tools.preflight.cost import meta_model
    from vcarepro.train.classification import build_optimizer

    recipe = run.recipe
    model = meta_model(run, branch, num_classes)
    if branch == "cls":
        optimizer = build_optimizer(model, recipe)
    else:  # as train/generation.py builds it
        optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
    for p in model.parameters():
        p.grad = torch.zeros_like(p) if p.requires_grad else None  # a frozen one (DiT's pos_embed) has no state
    optimizer.step()
    moments = [v for state in optimizer.state_dict()["state"].values() for v in state.values()]
    return SavedState(
        tensor_bytes(model.state_dict().values()),
        tensor_bytes(moments),
        branch == "gen" or recipe.ema_decay > 0,
        tuple(model_input_shape(model)) if branch == "gen" else (),
    )


def npy_bytes(shape: Sequence[int], dtype) -> int:
    """An .npy file's size: numpy's own header for ``shape`` and ``dtype`` (format 1.0, which np.save and
    open_memmap write for these shapes), then the array's bytes."""
    dtype = np.dtype(dtype)
    header = io.BytesIO()
    descr = np.lib.format.dtype_to_descr(dtype)
    np.lib.format.write_array_header_1_0(header, {"descr": descr, "fortran_order": False, "shape": tuple(shape)})
    return header.tell() + math.prod(shape) * dtype.itemsize


def sums_bytes(names: Sequence[str]) -> int:
    """A SHA256SUMS (core/io.py write_manifest) or the digest files beside ``names``: one line per file."""
    return sum(len(sidecar_text(name, DIGEST)) for name in names)


def files_bytes(root: Path) -> Tuple[int, int]:
    """(files, bytes) below ``root``, measured."""
    files = [p for p in Path(root).rglob("*") if p.is_file()]
    return len(files), sum(p.stat().st_size for p in files)


# ----------------------------------------------------------------------------- the prepared index (data/cls)

# A typical manifest row where ImageNet is read in its official archives (data/imagenet.py): the archive's path,
# the member as the layout names it, and numbers of typical width: an offset of 11 digits (the train tar holds
# 147.9 GB), a JPEG's length of 6 (110 KB on average) and a CRC-32 of 10.
TYPICAL_MEMBER = {"train": "n01440764.tar/n01440764_10026.JPEG", "val": "ILSVRC2012_val_00000293.JPEG"}
TYPICAL_NUMBERS = (10**10, 10**5, 2**31)


def _csv_bytes(rows: Sequence[Sequence[Any]]) -> int:
    text = io.StringIO()  # the manifest's own writer: csv's \r\n line ends (data/folders.py write_manifest)
    csv.writer(text).writerows(rows)
    return len(text.getvalue().encode("utf-8"))


def _imagenet_index(params: Dict[str, Any], train: int) -> Tuple[int, int, str]:
    """(files, bytes, how) of an ImageNet index not prepared here: the manifest from its row format, classes.json
    with each class named by its wnid."""
    from vcarepro.data.folders import CLASSES, COLUMNS, MANIFEST, SOURCES
    from vcarepro.data.imagenet import REPORT, TRAIN_TAR, VAL_TAR

    classes, val = expected_classes(params), known_val_images(params)
    root = Path(params["prepare_cls"]["imagenet_root"]).absolute()
    archive = {"train": root / TRAIN_TAR, "val": root / VAL_TAR}
    row = {s: _csv_bytes([(s, classes - 1, archive[s], TYPICAL_MEMBER[s], *TYPICAL_NUMBERS)]) for s in archive}
    entries = [{"index": k, "name": "n01440764", "wnid": "n01440764"} for k in range(classes)]
    size = _csv_bytes([COLUMNS]) + train * row["train"] + val * row["val"]
    size += len(json.dumps(entries, indent=2, sort_keys=True)) + 1
    how = f"estimated from the manifest's row format for {train + val:,} images"
    return len((CLASSES, MANIFEST, SOURCES, REPORT)), size, how


def _digits_index(params: Dict[str, Any]) -> Tuple[int, int, str]:
    """(files, bytes, how) of the digits' index, prepared by the stage's own function in a scratch folder."""
    from vcarepro.data.embedded import export_digits

    prep = params["prepare_cls"]
    with tempfile.TemporaryDirectory(prefix="preflight-digits-") as tmp:
        export_digits(Path(tmp) / "cls", val_fraction=prep["val_fraction"], seed=prep["split_seed"])
        files, size = files_bytes(Path(tmp) / "cls")
    return files, size, ""


def cls_index(params: Dict[str, Any], dataset: Dataset, root: Path = CLS_DATA) -> Family:
    """data/cls: measured where this scale's set is prepared under ``root``, else from its layout."""
    if dataset.prepared:
        (files, size), how = files_bytes(root), ""
    elif params["prepare_cls"]["source"] == "digits":
        files, size, how = _digits_index(params)
    else:
        files, size, how = _imagenet_index(params, dataset.train_images)
    return Family("prepared index", str(CLS_DATA), [Output(str(CLS_DATA), size, files)], how)


# ----------------------------------------------------------------------------- the generation data (data/gen)


def _latents(examples: int, shape: Sequence[int], shard_size: int) -> Tuple[List[str], int]:
    """data/latents.py encode_to_shards: per shard float16 moments (n, 2 mirror variants, 2 moments, C, h, w) and
    int64 labels, then index.json; the stage adds meta.json."""
    from vcarepro.data.latents import INDEX, _labels_name, _moments_name

    counts = [min(shard_size, examples - start) for start in range(0, examples, shard_size)]
    names = [f"latents/{name(k)}" for k in range(len(counts)) for name in (_moments_name, _labels_name)]
    size = sum(npy_bytes((n, 2, 2, *shape), np.float16) + npy_bytes((n,), np.int64) for n in counts)
    return [*names, f"latents/{INDEX}", "meta.json"], size


def _pixels(examples: int, shape: Sequence[int], classes: Optional[int]) -> Tuple[List[str], int]:
    """stages/prepare_gen.py prepare_pixels (data/pixels.py load_split_pixels): uint8 images, their float32 inputs
    and int64 labels in train.safetensors, meta.json, and the digit FID extractor of ``classes`` (None: none)."""
    from vcarepro.metrics.digit_features import DigitFeatureNet

    names, size = ["train.safetensors", "meta.json"], examples * math.prod(shape) * (1 + 4) + examples * 8
    if classes is None:
        return names, size
    with torch.device("meta"):  # prepare_pixels trains it at its defaults
        extractor = DigitFeatureNet(num_classes=classes)
    return [*names, "fid_extractor.safetensors"], size + tensor_bytes(extractor.state_dict().values())


def gen_data(params: Dict[str, Any], dataset: Dataset, input_shape: Sequence[int], root: Path = GEN_DATA) -> Family:
    """data/gen: measured where this scale's set is prepared under ``root``, else from its format; both end with
    the SHA256SUMS of core/io.py atomic_directory(digests=True)."""
    if dataset.prepared:
        files, size = files_bytes(root)
        return Family("generation data", str(GEN_DATA), [Output(str(GEN_DATA), size, files)])
    prep, n = params["prepare_gen"], dataset.train_images
    if prep["source"] == "pixels":
        digits = expected_classes(params) if prep["fid_extractor"] == "digits" else None
        names, size = _pixels(n, input_shape, digits)
    else:
        names, size = _latents(n, input_shape, prep["shard_size"])
    output = Output(str(GEN_DATA), size + sums_bytes(names), len(names) + 1)
    return Family("generation data", str(GEN_DATA), [output])


# ----------------------------------------------------------------------------- what the runs write


def weights(runs: Sequence[Tuple[str, Any, SavedState]]) -> Family:
    """runs/<branch>/<run>/train: per seed (train/classification.py _save_trained, train/generation.py) the weights
    in safetensors with their digest file (core/io.py save_tensors), a classifier's EMA beside its raw weights where
    it keeps one and its history.json; a generator's EMA alone."""
    outputs = []
    for branch, run, state in runs:
        names = ["model.safetensors"] if branch == "cls" else []
        names += ["model_ema.safetensors"] if state.ema else []
        size = len(names) * state.model + sums_bytes(names)
        files = 2 * len(names) + (1 if branch == "cls" else 0)  # and a classifier's history.json (not counted)
        outputs.append(Output(f"{run.paths.root}/train", size * len(run.seeds), files * len(run.seeds)))
    return Family("trained weights", "runs/<branch>/<run>/train", outputs)


def _sample_members(run, image_size: int) -> int:
    """One seed's .npz (data/samples.py): uint8 (N, H, W, 3) images and int64 (N,) labels, stored."""
    n = run.sampling["num_samples"]
    return npy_bytes((n, image_size, image_size, 3), np.uint8) + npy_bytes((n,), np.int64)


def samples(runs: Sequence[Any], image_size: int) -> Family:
    """runs/gen/<run>/samples (stages/sample_gen.py): protocol.json, each seed's .npz and preview grid (the grid's
    PNG not counted), and SHA256SUMS."""
    from vcarepro.metrics.protocol import PROTOCOL_FILE

    outputs = []
    for run in runs:
        names = [PROTOCOL_FILE] + [n for s in run.seeds for n in (run.paths.samples(s).name, f"grid_seed_{s}.png")]
        size = len(run.seeds) * _sample_members(run, image_size) + sums_bytes(names)
        outputs.append(Output(str(run.paths.root / "samples"), size, len(names) + 1))
    return Family("samples", "runs/gen/<run>/samples", outputs)


LAST = "last.pt"  # each seed's resume checkpoint, as both training loops name it


def checkpoints(runs: Sequence[Tuple[str, Any, SavedState]], image_size: int) -> Family:
    """checkpoints/<branch>/<run>, which DVC does not track: per seed last.pt and the one it replaced, last.pt.prev,
    each with its digest file (train/checkpoint.py save_checkpoint); and, while a generation run samples, its seeds'
    work maps (data/samples.py, discarded once its samples are committed: the largest run's counted)."""
    from vcarepro.train.checkpoint import previous_path

    digests = sums_bytes([LAST, previous_path(LAST).name])
    outputs = [
        Output(str(run.paths.checkpoints), len(run.seeds) * (2 * s.checkpoint + digests), 0) for _, run, s in runs
    ]
    sampling = [(len(run.seeds) * _sample_members(run, image_size), run) for branch, run, _ in runs if branch == "gen"]
    if sampling:
        size, run = max(sampling, key=lambda pair: pair[0])
        outputs.append(Output(f"{run.paths.checkpoints}/seed_*/samples", size, 0))
    return Family("resume checkpoints", "checkpoints/<branch>/<run>", outputs)


def _states(params: Dict[str, Any], branches: Sequence[Any]) -> List[Tuple[str, Any, SavedState]]:
    """(branch, run, what training saves) of every selected run that can be built."""
    from vcarepro.core.errors import UserError

    states = []
    for branch in branches:
        for run in branch.runs:
            try:
                states.append((branch.name, run, saved_state(run, branch.name, expected_classes(params))))
            except UserError:  # an unknown arch or option: stepping the run says so, once
                continue
    return states


def families(params: Dict[str, Any], branches: Sequence[Any]) -> List[Family]:
    """Every family the selected runs of ``branches`` (cls, gen) write, from the params and their models' state."""
    cls, gen = branches
    states = _states(params, branches)
    found = [cls_index(params, cls.dataset)]
    shape = next((state.input_shape for branch, _, state in states if branch == "gen"), None)
    if shape is not None:
        found.append(gen_data(params, gen.dataset, shape))
    image_size = params["prepare_gen"]["image_size"]  # what samples are decoded to (train/sampling.py sample_space)
    found += [checkpoints(states, image_size), weights(states)]
    if gen.runs:
        found.append(samples(gen.runs, image_size))
    return found
