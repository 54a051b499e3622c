"""Generated stand-ins for the paper scale's external inputs, in their published formats.

The smoke scale drives the paper road on 2 CPU cores, so the inputs a real run downloads are
replaced by small generated ones that the real loading code reads unchanged:

* :func:`write_mini_imagenet`: a miniature ImageNet as the official archives
  (``ILSVRC2012_img_train.tar`` of per-class ``<wnid>.tar``, a flat ``ILSVRC2012_img_val.tar``, the
  devkit's ``meta.mat`` and validation ground truth), of real JPEGs of varied sizes whose content
  (a coloured shape per class over noise) a classifier can learn;
* :func:`write_random_vae`: a random ``diffusers.AutoencoderKL`` with the SD-VAE's interface
  (4 latent channels, 8x downsampling: 256 px images, 4x32x32 latents), tiny channel widths;
* :func:`write_random_inception`: random weights in the exact format of torch-fidelity's
  ``weights-inception-2015-12-05-6726825d.pth``, each batch norm calibrated on generated images so
  that activations keep their scale through the network's depth;
* :func:`write_adm_reference`: an ADM-format reference batch (``arr_0``, ``mu``, ``sigma``, ``mu_s``,
  ``sigma_s``) whose statistics are the project's own Inception features of its images.

Everything is a function of the seed: the same seed writes the same bytes, another seed other bytes.
The Inception-derived numbers are computed on one thread, so the thread count does not change them;
the CPU's kernels still may (the numerics profile, docs/reproducibility.md), so they are reproducible per
machine kind.
``python -m vcarepro.tools.standins --out DIR [--seed S]`` writes all four under DIR.
"""

from __future__ import annotations

import argparse
import colorsys
import gzip
import io
import json
import os
import random
import tarfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
from PIL import Image, ImageDraw

from vcarepro.core.errors import BadInput, run_stage
from vcarepro.core.io import atomic_open

PathLike = Union[str, Path]

# what the official archives are called (vcarepro.data.imagenet reads these names)
TRAIN_TAR = "ILSVRC2012_img_train.tar"
VAL_TAR = "ILSVRC2012_img_val.tar"
DEVKIT_TAR = "ILSVRC2012_devkit_t12.tar.gz"
DEVKIT_DIR = "ILSVRC2012_devkit_t12"

SD_VAE_SCALING_FACTOR = 0.18215  # stabilityai/sd-vae-ft-ema's config, which DiT multiplies latents by
SMOKE_VAE_CHANNELS = (8, 8, 16, 16)  # SD's four down blocks (128, 256, 512, 512), at a tiny width
SHAPES = ("disc", "square", "triangle", "stripes", "ring", "cross", "diamond", "checker")
SIDES = (40, 90)  # the miniature's image sides in pixels, inclusive
MAT_HEADER = b"MATLAB 5.0 MAT-file, Platform: posix, written by vcarepro.tools.standins"

# the layout `python -m vcarepro.tools.standins --out DIR` writes
IMAGENET_DIR = "imagenet"
VAE_DIR = "vae"
RELEASED_DIR = "released"  # stand-ins of the released checkpoints (calibration), in their released layouts
INCEPTION_FILE = "inception.pth"
REFERENCE_FILE = "VIRTUAL_imagenet256_smoke.npz"
MANIFEST = "standins.json"
FORMAT_VERSION = 2  # raise when what a seed writes changes, so that older directories are rebuilt


# ----------------------------------------------------------------------------- images


def class_look(label: int, classes: int) -> Tuple[Tuple[int, int, int], str]:
    """The colour and shape that make class ``label`` of ``classes`` recognisable."""
    hue = (label / max(classes, 1) + 0.07 * (label // len(SHAPES))) % 1.0
    rgb = colorsys.hsv_to_rgb(hue, 0.85, 0.95)
    return tuple(int(round(255 * c)) for c in rgb), SHAPES[label % len(SHAPES)]


def draw_image(rng: np.random.Generator, label: int, classes: int, size: Tuple[int, int]) -> Image.Image:
    """One RGB image of class ``label``: its coloured shape, placed and scaled at random, over grey noise."""
    width, height = size
    grey = rng.uniform(60, 190)
    background = grey + rng.normal(0, 12, (height, width, 1)) + rng.normal(0, 6, (height, width, 3))
    image = Image.fromarray(np.clip(background, 0, 255).astype(np.uint8), "RGB")
    colour, shape = class_look(label, classes)
    colour = tuple(int(np.clip(c + rng.normal(0, 10), 0, 255)) for c in colour)
    side = min(width, height)
    radius = side * rng.uniform(0.25, 0.4)
    cx = width / 2 + rng.uniform(-0.15, 0.15) * width
    cy = height / 2 + rng.uniform(-0.15, 0.15) * height
    box = (cx - radius, cy - radius, cx + radius, cy + radius)
    draw = ImageDraw.Draw(image)
    if shape == "disc":
        draw.ellipse(box, fill=colour)
    elif shape == "square":
        draw.rectangle(box, fill=colour)
    elif shape == "triangle":
        draw.polygon([(cx, cy - radius), (cx + radius, cy + radius), (cx - radius, cy + radius)], fill=colour)
    elif shape == "stripes":
        step = max(3, side // 8)
        for x in range(-height, width + height, 2 * step):  # diagonal bands across the whole image
            draw.polygon([(x, 0), (x + step, 0), (x + step + height, height), (x + height, height)], fill=colour)
    elif shape == "ring":
        draw.ellipse(box, outline=colour, width=max(2, int(radius / 3)))
    elif shape == "cross":
        bar = radius / 3
        draw.rectangle((cx - radius, cy - bar, cx + radius, cy + bar), fill=colour)
        draw.rectangle((cx - bar, cy - radius, cx + bar, cy + radius), fill=colour)
    elif shape == "diamond":
        draw.polygon([(cx, cy - radius), (cx + radius, cy), (cx, cy + radius), (cx - radius, cy)], fill=colour)
    else:  # checker: a texture over the whole image
        cell = max(3, side // 6)
        for y in range(0, height, cell):
            for x in range((y // cell) % 2 * cell, width, 2 * cell):
                draw.rectangle((x, y, x + cell - 1, y + cell - 1), fill=colour)
    pixels = np.asarray(image, dtype=np.float64) + rng.normal(0, 8, (height, width, 3))  # sensor noise on top
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB")


def image_size(rng: np.random.Generator) -> Tuple[int, int]:
    """(width, height) with sides in SIDES; about a third square, the rest landscape or portrait."""
    width = int(rng.integers(SIDES[0], SIDES[1] + 1))
    height = width if rng.random() < 1 / 3 else int(rng.integers(SIDES[0], SIDES[1] + 1))
    return width, height


def jpeg(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def _image_rng(seed: int, split: str, label: int, index: int) -> np.random.Generator:
    # one stream per image, so an image does not change when the counts of others do
    return np.random.default_rng([seed, {"train": 0, "val": 1, "reference": 2, "calibration": 3}[split], label, index])


def synthetic_jpeg(seed: int, split: str, label: int, index: int, classes: int) -> bytes:
    rng = _image_rng(seed, split, label, index)
    return jpeg(draw_image(rng, label, classes, image_size(rng)))


def synthetic_batch(count: int, *, classes: int, seed: int, split: str, image_size_px: int = 256) -> np.ndarray:
    """uint8 (count, S, S, 3): miniature images, classes in turn, JPEG-encoded and ADM-center-cropped to S as
    ImageNet's are before they reach the VAE or Inception."""
    from vcarepro.data.latents import adm_center_crop

    images = np.empty((count, image_size_px, image_size_px, 3), dtype=np.uint8)
    for i in range(count):
        with Image.open(io.BytesIO(synthetic_jpeg(seed, split, i % classes, i // classes, classes))) as image:
            images[i] = np.asarray(adm_center_crop(image, image_size_px), dtype=np.uint8)
    return images


# ----------------------------------------------------------------------------- a miniature ImageNet


# the devkit's synset struct, in meta.mat's field order (torchvision reads the first three by position)
SYNSET_FIELDS = (
    "ILSVRC2012_ID",
    "WNID",
    "words",
    "gloss",
    "num_children",
    "children",
    "wordnet_height",
    "num_train_images",
)


@dataclass
class MiniImageNet:
    """The images and labels of a miniature ImageNet, and its official archives.

    ``classes``: wnid -> (ILSVRC2012_ID, words); ``train``: wnid -> {file name: encoded image};
    ``val``: file name -> (wnid, encoded image); ``non_leaves``: (ILSVRC2012_ID, wnid, words,
    num_children) rows of meta.mat that are not classes (the real one has 860 of them).
    """

    classes: Dict[str, Tuple[int, str]]
    train: Dict[str, Dict[str, bytes]]
    val: Dict[str, Tuple[str, bytes]]
    non_leaves: Sequence[Tuple[int, str, str, int]] = field(default_factory=list)

    @classmethod
    def synthetic(
        cls, *, classes: int = 4, train_per_class: int = 32, val_per_class: int = 8, seed: int = 0
    ) -> "MiniImageNet":
        """Generated classes under real ImageNet-1K wnids (spread over the 1000, so that a released 1000-way
        head reads them as its own classes) whose ILSVRC2012_IDs are a seeded order other than the wnid order,
        ``train_per_class`` and ``val_per_class`` JPEGs each, the val images shuffled."""
        if classes < 2 or train_per_class < 1 or val_per_class < 1:
            raise BadInput(
                f"a miniature ImageNet needs at least 2 classes and 1 train and 1 val image per class, got "
                f"classes={classes}, train_per_class={train_per_class}, val_per_class={val_per_class}."
            )
        from timm.data import ImageNetInfo

        synsets = ImageNetInfo().label_names()  # the 1000 wnids, sorted
        if classes > len(synsets):
            raise BadInput(f"a miniature ImageNet has at most {len(synsets)} classes, got classes={classes}.")
        wnids = [synsets[k * len(synsets) // classes] for k in range(classes)]
        ids = list(range(1, classes + 1))
        random.Random(seed).shuffle(ids)
        if ids == sorted(ids):  # the point of the IDs: an order that a wnid/ID mix-up cannot survive
            ids = ids[1:] + ids[:1]
        table = {}
        for label, (wnid, ilsvrc_id) in enumerate(zip(wnids, ids)):
            colour, shape = class_look(label, classes)
            table[wnid] = (ilsvrc_id, f"stand-in class {label}, {shape} in rgb{colour}")
        train = {
            w: {f"{w}_{i}.JPEG": synthetic_jpeg(seed, "train", label, i, classes) for i in range(train_per_class)}
            for label, w in enumerate(wnids)
        }
        val_items = [(label, i) for label in range(classes) for i in range(val_per_class)]
        random.Random(seed + 1).shuffle(val_items)
        val = {
            f"ILSVRC2012_val_{n:08d}.JPEG": (wnids[label], synthetic_jpeg(seed, "val", label, i, classes))
            for n, (label, i) in enumerate(val_items, 1)
        }
        non_leaves = [(classes + 1, "n00001740", "entity", 1), (classes + 2, "n00002137", "stand-in shapes", classes)]
        return cls(table, train, val, non_leaves)

    # --- pieces

    def meta_mat(self) -> bytes:
        """The devkit's ``data/meta.mat``: a ``synsets`` struct array, leaves (the classes) and non-leaves, by ID."""
        import scipy.io

        leaf_ids = [i for i, _ in self.classes.values()]
        rows = [
            (i, w, words, f"a {words}", 0, np.zeros(0), 0, len(self.train.get(w, {})))
            for w, (i, words) in self.classes.items()
        ]
        rows += [
            (
                i,
                w,
                words,
                words,
                n,
                np.array(leaf_ids[:n], dtype=np.float64),
                1,
                sum(len(files) for files in self.train.values()),
            )
            for i, w, words, n in self.non_leaves
        ]
        rows.sort(key=lambda row: row[0])
        synsets = np.empty(len(rows), dtype=[(name, "O") for name in SYNSET_FIELDS])
        for k, row in enumerate(rows):
            synsets[k] = row
        buffer = io.BytesIO()
        scipy.io.savemat(buffer, {"synsets": synsets})
        # the 116-byte text header carries savemat's clock time; a fixed one keeps the bytes a function of the seed
        return MAT_HEADER.ljust(116, b" ") + buffer.getvalue()[116:]

    def ground_truth(self) -> bytes:
        """``data/ILSVRC2012_validation_ground_truth.txt``: the ILSVRC2012_ID of each val image, in image order."""
        return "".join(f"{self.classes[w][0]}\n" for _, (w, _) in sorted(self.val.items())).encode()

    # --- the official archives

    def write_devkit(self, root: PathLike) -> Path:
        """``root/ILSVRC2012_devkit_t12.tar.gz`` with meta.mat, the validation ground truth and a readme."""
        root = Path(root)
        root.mkdir(parents=True, exist_ok=True)
        path = root / DEVKIT_TAR
        with (
            atomic_open(path) as raw,
            gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as packed,
            tarfile.open(fileobj=packed, mode="w") as tar,
        ):
            for folder in (DEVKIT_DIR, f"{DEVKIT_DIR}/data"):
                add_to_tar(tar, folder, None)
            add_to_tar(tar, f"{DEVKIT_DIR}/data/meta.mat", self.meta_mat())
            add_to_tar(tar, f"{DEVKIT_DIR}/data/ILSVRC2012_validation_ground_truth.txt", self.ground_truth())
            add_to_tar(
                tar,
                f"{DEVKIT_DIR}/readme.txt",
                b"A stand-in ILSVRC2012 devkit written by vcarepro.tools.standins: generated classes, not ImageNet.\n",
            )
        return path

    def write_official(self, root: PathLike) -> Path:
        """The three files of the official download under ``root``: train tar of class tars, val tar, devkit."""
        root = Path(root)
        root.mkdir(parents=True, exist_ok=True)
        with atomic_open(root / TRAIN_TAR) as raw, tarfile.open(fileobj=raw, mode="w") as outer:
            for wnid, files in self.train.items():
                inner = io.BytesIO()
                with tarfile.open(fileobj=inner, mode="w") as tar:
                    for name, data in files.items():
                        add_to_tar(tar, name, data)
                add_to_tar(outer, f"{wnid}.tar", inner.getvalue())
        with atomic_open(root / VAL_TAR) as raw, tarfile.open(fileobj=raw, mode="w") as tar:
            for name, (_, data) in self.val.items():
                add_to_tar(tar, name, data)
        self.write_devkit(root)
        return root


def add_to_tar(tar: tarfile.TarFile, name: str, data: Optional[bytes]) -> None:
    """A file (or, for ``None``, a directory) member with fixed owner, mode and time: same data, same bytes."""
    info = tarfile.TarInfo(name)
    info.mtime = 0
    if data is None:
        info.type, info.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(info)
    else:
        info.size, info.mode = len(data), 0o644
        tar.addfile(info, io.BytesIO(data))


def write_mini_imagenet(
    root: PathLike, *, classes: int = 4, train_per_class: int = 32, val_per_class: int = 8, seed: int = 0
) -> Path:
    """A miniature ImageNet in the official archive layout under ``root`` (see :class:`MiniImageNet`).

    ``prepare_cls`` reads it with ``source: imagenet``, ``imagenet_root: <root>`` and
    ``expect_full: false`` (a miniature never has ImageNet-1K's counts).
    """
    return MiniImageNet.synthetic(
        classes=classes, train_per_class=train_per_class, val_per_class=val_per_class, seed=seed
    ).write_official(root)


# ----------------------------------------------------------------------------- networks


def write_random_vae(
    path: PathLike,
    *,
    seed: int = 0,
    block_out_channels: Sequence[int] = SMOKE_VAE_CHANNELS,
    norm_num_groups: int = 8,
    sample_size: int = 256,
) -> Path:
    """A randomly initialised ``AutoencoderKL`` saved as a diffusers folder (config.json + safetensors).

    The SD VAE's interface: RGB in and out, 4 latent channels, a 2x downsampling in every block
    but the last (four blocks: 8x, so 256 px images give 4x32x32 latents), scaling factor
    0.18215; one layer per block and ``block_out_channels`` wide. ``AutoencoderKL.from_pretrained(path)``
    (and ``prepare_gen.vae: <path>``) loads it offline.
    """
    import torch
    from diffusers import AutoencoderKL

    blocks = len(block_out_channels)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        vae = AutoencoderKL(
            in_channels=3,
            out_channels=3,
            down_block_types=("DownEncoderBlock2D",) * blocks,
            up_block_types=("UpDecoderBlock2D",) * blocks,
            block_out_channels=tuple(block_out_channels),
            layers_per_block=1,
            act_fn="silu",
            latent_channels=4,
            norm_num_groups=norm_num_groups,
            sample_size=sample_size,
            scaling_factor=SD_VAE_SCALING_FACTOR,
        )
    path = Path(path)
    vae.save_pretrained(path, safe_serialization=True)
    return path


def _unloaded_inception():
    """torch-fidelity's ``inception-v3-compat`` network as constructed, before any weights are loaded."""
    import torch
    from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3

    from vcarepro.metrics.digit_features import INCEPTION_EXTRACTOR

    class Unloaded(FeatureExtractorInceptionV3):
        def load_state_dict(self, state_dict, *args, **kwargs):
            if state_dict:  # the constructor's call with the empty dict below is skipped
                return super().load_state_dict(state_dict, *args, **kwargs)
            return None

    empty = io.BytesIO()
    torch.save({}, empty)
    empty.seek(0)  # a file object, so torch-fidelity neither downloads nor needs a path
    return Unloaded(INCEPTION_EXTRACTOR, ["2048"], feature_extractor_weights_path=empty)


def write_random_inception(path: PathLike, *, seed: int = 0, calibration_images: int = 8) -> Path:
    """Random weights for torch-fidelity's ``inception-v3-compat``, as ``weights-inception-2015-12-05-6726825d.pth``.

    The format of torch-fidelity's converted file: ``torch.save`` of a plain dict (no
    ``_metadata``) of float32 tensors, conv weights and each batch norm's weight, bias,
    running mean and variance, no ``num_batches_tracked``. Convolutions keep PyTorch's default
    initialisation; each batch norm's running statistics are those of its input over
    ``calibration_images`` generated images, so that features keep a usable scale (with unit
    running variances they would shrink by orders of magnitude over the 94 layers).
    """
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        network = _unloaded_inception()
    norms = [m for m in network.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None  # a cumulative average: over one batch, the batch's own statistics
    images = synthetic_batch(calibration_images, classes=len(SHAPES), seed=seed, split="calibration")
    network.train()
    with torch.no_grad(), one_thread():
        network(torch.from_numpy(images).permute(0, 3, 1, 2).contiguous())
    network.eval()
    state = {
        name: tensor.detach().clone().contiguous()
        for name, tensor in network.state_dict().items()
        if not name.endswith("num_batches_tracked")
    }
    path = Path(path)
    with atomic_open(path) as f:
        torch.save(state, f)
    return path


# ----------------------------------------------------------------------------- the ADM reference batch


def write_adm_reference(
    path: PathLike,
    *,
    inception_weights: PathLike,
    num_images: int = 64,
    classes: int = 4,
    seed: int = 0,
    image_size_px: int = 256,
    batch_size: int = 32,
    device: str = "cpu",
) -> Path:
    """An ADM-format reference batch ``.npz``: ``arr_0`` uint8 (N, S, S, 3), ``mu``/``sigma``, ``mu_s``/``sigma_s``.

    The images are the miniature's (``classes`` in turn, ADM-center-cropped to S); the statistics
    (float64, 2048-d pool and 2023-d spatial, as in ADM's files) are those of these images
    through :class:`vcarepro.metrics.inception.InceptionFeatures` on ``inception_weights``, so they are
    consistent with what eval_gen measures samples with. ADM's statistics cover ImageNet train, not
    only its 10,000 images; with N <= 2048 images these covariances are singular, which the
    Frechet distance handles (it takes the square root of the eigenvalues as complex numbers).
    """
    import torch

    from vcarepro.metrics.fid_reference import reference_from_images
    from vcarepro.metrics.inception import InceptionFeatures

    if num_images < 2:
        raise BadInput(f"an ADM reference batch needs at least 2 images for a covariance, got num_images={num_images}.")
    images = synthetic_batch(num_images, classes=classes, seed=seed, split="reference", image_size_px=image_size_px)
    extractor = InceptionFeatures(inception_weights, device, batch_size=batch_size)
    batches = (
        torch.from_numpy(images[i : i + batch_size]).permute(0, 3, 1, 2) for i in range(0, num_images, batch_size)
    )
    with one_thread():
        stats, _, spatial = reference_from_images(batches, extractor, keep_features=1, seed=seed, spatial=True)
    arrays = {"arr_0": images, "mu": stats.mu, "sigma": stats.sigma, "mu_s": spatial.mu, "sigma_s": spatial.sigma}
    path = Path(path)
    with atomic_open(path) as f:
        write_npz(f, arrays)
    return path


@contextmanager
def one_thread() -> Iterator[None]:
    """One thread for torch's kernels and numpy's BLAS inside: a thread count sets the order of a kernel's sums,
    so it would set the bits."""
    import torch
    from threadpoolctl import threadpool_limits  # scikit-learn's dependency

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with threadpool_limits(limits=1):
            yield
    finally:
        torch.set_num_threads(threads)


def write_npz(file, arrays: Dict[str, np.ndarray]) -> None:
    """``np.savez``'s format with a fixed member time, the same bytes under every Python (io.write_npz_to)."""
    from vcarepro.core.io import write_npz_to

    write_npz_to(file, arrays)


# ----------------------------------------------------------------------------- all four


def write_released_checkpoints(out: PathLike, calibrate: Dict[str, Any], *, seed: int = 0) -> List[Path]:
    """Stand-ins for the released checkpoints of ``calibrate`` (the params section): each entry's model of ours,
    seeded, written in its released key layout and container (calibration.keymaps) under the released file name,
    so that the calibration stages load them through the same strict path as the authors' files."""
    import torch

    from vcarepro.calibration import build_model, entries, keymap_for

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written: Dict[str, Path] = {}
    for kind in ("cls", "gen"):
        for name, entry in entries(calibrate, kind).items():
            if entry["file"] in written:  # e.g. one DiT file behind two guidance scales
                continue
            torch.manual_seed(seed)
            model = build_model(kind, entry)
            keymap = keymap_for(entry, name)
            state = {k: v.contiguous() for k, v in keymap.to_released(model.state_dict()).items()}
            path = out / entry["file"]
            torch.save(keymap.wrap(state), path)
            written[entry["file"]] = path
    return list(written.values())


def released_settings(calibrate: Optional[Dict[str, Any]]) -> List[List[Any]]:
    """What the released stand-ins depend on (for the manifest): each entry's file, layout and model."""
    if not calibrate:
        return []
    from vcarepro.calibration import entries

    return sorted(
        [
            e["file"],
            e["layout"],
            e["arch"],
            e.get("attention", "mhsa"),
            e.get("learn_sigma", False),
            e.get("image_size", 0),
            json.dumps(e.get("options") or {}, sort_keys=True),
        ]
        for kind in ("cls", "gen")
        for e in entries(calibrate, kind).values()
    )


def write_standins(
    out: PathLike,
    *,
    seed: int = 0,
    classes: int = 4,
    train_per_class: int = 32,
    val_per_class: int = 8,
    reference_images: int = 64,
    calibrate: Optional[Dict[str, Any]] = None,
) -> List[Tuple[str, Path, bool]]:
    """All stand-ins under ``out`` (built in a temporary directory, renamed into place): ImageNet, the VAE,
    Inception, ADM's batch and, given ``calibrate`` (the params section), the released checkpoints it lists.
    Returns ``(artefact, path, written)`` rows. A directory already holding these stand-ins is kept."""
    from vcarepro.core.io import atomic_directory, write_json

    out = Path(out)
    layout = [
        ("imagenet", out / IMAGENET_DIR),
        ("vae", out / VAE_DIR),
        ("inception", out / INCEPTION_FILE),
        ("adm_reference", out / REFERENCE_FILE),
    ] + ([("released", out / RELEASED_DIR)] if calibrate else [])
    settings = {
        "seed": seed,
        "classes": classes,
        "train_per_class": train_per_class,
        "val_per_class": val_per_class,
        "reference_images": reference_images,
        "released": released_settings(calibrate),
    }
    if _holds_standins(out, settings):
        return [(name, path, False) for name, path in layout]
    if out.exists() and not (out / MANIFEST).is_file():
        raise BadInput(
            f"{out} exists and was not written by vcarepro.tools.standins (no {MANIFEST}); remove it or pass "
            f"another --out."
        )
    foreign = _not_written_here(out) if out.is_dir() else []
    if foreign:  # rebuilding replaces the whole folder: nothing but stand-ins may be in it
        raise BadInput(
            f"{out} holds {foreign[0]!r}, which vcarepro.tools.standins did not write; rebuilding replaces the whole "
            f"folder, so move that away or pass another --out."
        )
    with atomic_directory(out) as tmp:
        write_mini_imagenet(
            tmp / IMAGENET_DIR, classes=classes, train_per_class=train_per_class, val_per_class=val_per_class, seed=seed
        )
        write_random_vae(tmp / VAE_DIR, seed=seed)
        write_random_inception(tmp / INCEPTION_FILE, seed=seed)
        write_adm_reference(
            tmp / REFERENCE_FILE,
            inception_weights=tmp / INCEPTION_FILE,
            num_images=reference_images,
            classes=classes,
            seed=seed,
        )
        if calibrate:
            write_released_checkpoints(tmp / RELEASED_DIR, calibrate, seed=seed)
        files = sorted(p for p in tmp.rglob("*") if p.is_file())
        write_json(
            tmp / MANIFEST,
            {
                "format_version": FORMAT_VERSION,
                **settings,
                "files": {str(p.relative_to(tmp)): p.stat().st_size for p in files},
            },
        )
        for entry in [tmp, *tmp.rglob("*")]:  # temporary files and directories are private (0600 / 0700)
            os.chmod(entry, (0o777 if entry.is_dir() else 0o666) & ~_umask())
    return [(name, path, True) for name, path in layout]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _not_written_here(out: Path) -> List[str]:
    """The files under ``out`` (at any depth) that its standins.json does not list, in order."""
    try:
        listed = set(json.loads((out / MANIFEST).read_text()).get("files", {}))
    except (OSError, ValueError, AttributeError):
        listed = set()
    return [
        path.relative_to(out).as_posix()
        for path in sorted(out.rglob("*"))
        if not path.is_dir() and path.relative_to(out).as_posix() not in listed | {MANIFEST}
    ]


def _holds_standins(out: Path, settings: Dict[str, int]) -> bool:
    try:
        manifest = json.loads((out / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    if manifest.get("format_version") != FORMAT_VERSION or any(manifest.get(k) != v for k, v in settings.items()):
        return False
    return all(
        (out / name).is_file() and (out / name).stat().st_size == size
        for name, size in manifest.get("files", {}).items()
    )


def _size(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m vcarepro.tools.standins", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="directory to write the stand-ins into")
    parser.add_argument("--seed", type=int, default=0, help="what every generated byte is a function of")
    args = parser.parse_args(argv)
    for name, path, written in write_standins(args.out, seed=args.seed):
        state = "written" if written else "already there"
        print(f"standins: {name} -> {path} ({_size(path) / 1e6:.1f} MB, seed {args.seed}, {state})", flush=True)


if __name__ == "__main__":
    run_stage(main)
