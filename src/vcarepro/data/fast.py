"""The fast training input path: loader workers read, decode and crop; the device does every per-pixel op, batched.

The augmentation is the recipe's timm transform, the PIL path's (``build_transforms`` in vcarepro.train.classification),
taken apart. In each worker, the draws come from that transform's own objects in its order: the crop box from
timm's ``RandomResizedCropAndInterpolation.get_params``, the flip as torchvision's ``RandomHorizontalFlip`` draws it,
and the RandAugment ops, levels, signs and interpolations from timm's ``RandAugment`` and ``AugmentOp``, whose
PIL functions are swapped for recorders. The worker then decodes only the box (:mod:`vcarepro.data.jpeg`) and ships
the crop as uint8 with its plan. On the device, :class:`DeviceAugment` resizes, flips and applies the plan
(:mod:`vcarepro.data.device_ops`), and timm's ``PrefetchLoader`` normalizes and erases with timm's
``RandomErasing``. Mixup / CutMix and repeated augmentation stay where they are on the PIL path (the training loop,
the sampler).
"""

from __future__ import annotations

import copy
import math
import random
from pathlib import Path
from typing import Iterator, NamedTuple, Tuple

import numpy as np
import torch
from PIL import Image
from torch.utils.data import get_worker_info

from vcarepro.core.errors import BadInput
from vcarepro.data import device_ops
from vcarepro.data.folders import ManifestDataset
from vcarepro.data.jpeg import decode_box, image_size, read_bytes

PATHS = ("pil", "fast")
# RandAugment's PIL functions (timm.data.auto_augment.NAME_TO_OP, and vcarepro.data.augment's mended posterize), by
# name; the index is the code a plan records.
OPS = tuple(device_ops.PIXEL_OPS) + tuple(sorted(device_ops.GEOMETRIC))
SKIPPED = -1


def _affine_matrix(name: str, arg: float, size: int) -> Tuple[float, ...]:
    """The matrix Pillow's transform gets from timm's geometric op ``name`` at ``arg`` on a ``size`` square."""
    if name == "rotate":  # Image.rotate about the centre, as Pillow builds it
        angle = -math.radians(arg % 360.0)
        a, b = round(math.cos(angle), 15), round(math.sin(angle), 15)
        d, e = round(-math.sin(angle), 15), round(math.cos(angle), 15)
        centre = size / 2
        return a, b, a * -centre + b * -centre + centre, d, e, d * -centre + e * -centre + centre
    shift = arg * size if name.endswith("_rel") else arg
    return {
        "shear_x": (1, arg, 0, 0, 1, 0),
        "shear_y": (1, 0, 0, arg, 1, 0),
        "translate_x_rel": (1, 0, shift, 0, 1, 0),
        "translate_x_abs": (1, 0, shift, 0, 1, 0),
        "translate_y_rel": (1, 0, 0, 0, 1, shift),
        "translate_y_abs": (1, 0, 0, 0, 1, shift),
    }[name]


def _interpolation_code(mode) -> int:
    """device_ops' code for a PIL resample filter or a torchvision InterpolationMode (bilinear or bicubic only)."""
    name = str(getattr(mode, "name", mode)).lower()
    if name not in ("bilinear", "bicubic"):
        raise BadInput(f"the fast input path resamples bilinear or bicubic, not {name}; set input_path: pil.")
    return device_ops.BICUBIC if name == "bicubic" else device_ops.BILINEAR


class Plan:
    """One image's RandAugment draws, filled in by timm's own RandAugment: per layer an op code (or SKIPPED), its
    six parameters (an affine matrix, or the level in the first) and its interpolation."""

    __slots__ = ("codes", "params", "kinds", "layer")

    def __init__(self, layers: int) -> None:
        self.codes = [SKIPPED] * layers
        self.params = [(0.0,) * 6] * layers
        self.kinds = [0] * layers
        self.layer = -1


class _Size(Image.Image):
    """An image's size and nothing else: what timm's ``get_params`` reads of the image it crops."""

    def __init__(self, width: int, height: int) -> None:
        self._size = (width, height)


class _Layer:
    """A RandAugment op that tells the plan a new layer starts before timm's ``AugmentOp`` decides whether to apply."""

    def __init__(self, op) -> None:
        self.op = op

    def __call__(self, plan: Plan) -> Plan:
        plan.layer += 1
        return self.op(plan)


def _recorder(name: str, size: int):
    """Stands in for timm's PIL function ``name``: records what it would be called with, drawing the interpolation as
    timm's own ``_check_args_tf`` does."""
    from timm.data import auto_augment

    code = OPS.index(name)

    def record(plan: Plan, *level, **kwargs) -> Plan:
        plan.codes[plan.layer] = code
        if name in device_ops.GEOMETRIC:
            auto_augment._check_args_tf(kwargs)
            plan.params[plan.layer] = _affine_matrix(name, level[0], size)
            plan.kinds[plan.layer] = _interpolation_code(kwargs["resample"])
        elif level:
            plan.params[plan.layer] = (level[0], 0.0, 0.0, 0.0, 0.0, 0.0)
        return plan

    return record


class Draws:
    """The random part of a recipe's timm training transform, drawn per image without touching a pixel."""

    def __init__(self, transform) -> None:
        from timm.data.auto_augment import RandAugment
        from timm.data.random_erasing import RandomErasing
        from timm.data.transforms import MaybeToTensor, RandomResizedCropAndInterpolation
        from torchvision import transforms

        self.crop, self.flip, self.augment, self.erasing = None, 0.0, None, None
        self.mean, self.std, self.layers = None, None, 0
        for part in transform.transforms:
            if isinstance(part, RandomResizedCropAndInterpolation):
                self.crop = part
            elif isinstance(part, transforms.RandomHorizontalFlip):
                self.flip = part.p
            elif isinstance(part, RandAugment):
                self.augment = copy.deepcopy(part)
            elif isinstance(part, transforms.Normalize):
                self.mean, self.std = tuple(map(float, part.mean)), tuple(map(float, part.std))
            elif isinstance(part, RandomErasing):
                self.erasing = part
            elif not isinstance(part, (MaybeToTensor, transforms.ToTensor)):
                raise BadInput(
                    f"the fast input path has no device version of {type(part).__name__} in this recipe's "
                    f"augmentation; set input_path: pil."
                )
        if self.crop is None or self.crop.size[0] != self.crop.size[1]:
            raise BadInput("the fast input path needs the recipe's square RandomResizedCrop; set input_path: pil.")
        self.size = self.crop.size[0]
        kinds = self.crop.interpolation if isinstance(self.crop.interpolation, tuple) else (self.crop.interpolation,)
        self.kinds = [_interpolation_code(k) for k in kinds]
        if self.augment is not None:
            self.fill = tuple(self.augment.ops[0].kwargs["fillcolor"])
            self.layers = self.augment.num_layers
            for op in self.augment.ops:
                name = op.aug_fn.__name__
                if name not in OPS:
                    raise BadInput(
                        f"the fast input path has no device version of RandAugment's {op.name}; set input_path: pil."
                    )
                op.aug_fn = _recorder(name, self.size)
            self.augment.ops = np.array(
                [_Layer(op) for op in self.augment.ops], dtype=object
            )  # as np.random.choice takes it

    def __call__(self, width: int, height: int) -> Tuple[Tuple[int, int, int, int], int, bool, Plan]:
        """(the crop box (top, left, height, width), its interpolation, the flip, the RandAugment plan), drawn in the
        order timm's Compose draws them."""
        box = self.crop.get_params(_Size(width, height), self.crop.scale, self.crop.ratio)
        kind = random.choice(self.kinds) if len(self.kinds) > 1 else self.kinds[0]
        flip = bool(self.flip > 0 and torch.rand(1) < self.flip)
        plan = Plan(self.layers)
        if self.augment is not None:
            self.augment(plan)
        return box, kind, flip, plan


class CropBatch(NamedTuple):
    """A batch of crops as the workers ship them (``pin_memory`` and ``.to`` go field by field)."""

    pixels: torch.Tensor  # uint8: every crop's HxWx3 bytes, one after another
    sizes: torch.Tensor  # (N, 2) each crop's (H, W)
    boxes: torch.Tensor  # (N, 4) float64: the box each crop is resized from, (x0, y0, x1, y1)
    kinds: torch.Tensor  # (N,) its interpolation
    flips: torch.Tensor  # (N,) bool
    codes: torch.Tensor  # (N, layers) RandAugment op codes, SKIPPED where a layer applied nothing
    params: torch.Tensor  # (N, layers, 6) float64
    op_kinds: torch.Tensor  # (N, layers) each op's interpolation

    def to(self, device, non_blocking: bool = False) -> "CropBatch":
        return CropBatch(*(t.to(device, non_blocking=non_blocking) for t in self))


class CropSet(ManifestDataset):
    """A split of the prepared layout, each item one image's crop and draws (:class:`Draws`), decoded in the worker."""

    def __init__(self, root: str | Path, split: str, draws: Draws) -> None:
        super().__init__(root, split)
        self.draws = draws

    def _read(self, index: int):
        rel, label = self.samples[index]
        path = self.root / rel
        data = read_bytes(path)
        size = image_size(data, path)
        box, kind, flip, plan = self.draws(*size[:2])
        pixels, scaled = decode_box(data, path, size, box, self.draws.size)
        return pixels, scaled, kind, flip, plan, label


def collate(items) -> Tuple[CropBatch, torch.Tensor]:
    """The crops of a batch copied into one uint8 buffer (in shared memory inside a worker, as torch's own collate
    does), their draws as small tensors, and the labels."""
    counts = [item[0].size for item in items]
    pixels = torch.empty(0, dtype=torch.uint8)
    if get_worker_info() is not None:
        pixels = pixels.new(pixels._typed_storage()._new_shared(sum(counts)))
    flat = pixels.resize_(sum(counts)).numpy()
    start = 0
    for item, count in zip(items, counts):
        flat[start : start + count].reshape(item[0].shape)[...] = item[0]
        start += count
    plans = [item[4] for item in items]
    batch = CropBatch(
        pixels,
        torch.tensor([item[0].shape[:2] for item in items], dtype=torch.int64),
        torch.tensor([item[1] for item in items], dtype=torch.float64),
        torch.tensor([item[2] for item in items], dtype=torch.int8),
        torch.tensor([item[3] for item in items], dtype=torch.bool),
        torch.tensor([p.codes for p in plans], dtype=torch.int8),
        torch.tensor([p.params for p in plans], dtype=torch.float64),
        torch.tensor([p.kinds for p in plans], dtype=torch.int8),
    )
    return batch, torch.tensor([item[5] for item in items], dtype=torch.int64)


class DeviceAugment:
    """The per-pixel half of the recipe's augmentation, on whatever device the batch is on: resize, flip, RandAugment.

    Returns (N, 3, S, S) float32 holding 8-bit values, ready for timm's ``PrefetchLoader`` to normalize and erase.
    """

    def __init__(self, draws: Draws) -> None:
        self.size = draws.size
        self.fill = getattr(draws, "fill", (0, 0, 0))

    def __call__(self, batch: CropBatch) -> torch.Tensor:
        images = device_ops.resize_crops(batch.pixels, batch.sizes, batch.boxes, batch.kinds.long(), self.size)
        images = torch.where(batch.flips.view(-1, 1, 1, 1), images.flip(-1), images)
        codes = batch.codes.cpu()  # which images each op takes: decided on the host, with no device sync
        for layer in range(codes.shape[1]):
            for code in torch.unique(codes[:, layer]).tolist():
                if code == SKIPPED:
                    continue
                idx = torch.nonzero(codes[:, layer] == code).view(-1).to(images.device)
                images[idx] = self.op(OPS[code], images[idx], batch.params[idx, layer], batch.op_kinds[idx, layer])
        return images

    def op(self, name: str, images: torch.Tensor, params: torch.Tensor, kinds: torch.Tensor) -> torch.Tensor:
        if name in device_ops.GEOMETRIC:
            return device_ops.affine(images, params, kinds.long(), self.fill)
        return device_ops.PIXEL_OPS[name](images, params[:, 0])


class DeviceBatches:
    """Batches of a crop loader, augmented on ``device``: what timm's ``PrefetchLoader`` wraps."""

    def __init__(self, loader, augment: DeviceAugment, device: torch.device) -> None:
        self.loader, self.augment, self.device = loader, augment, device

    @property
    def sampler(self):
        return self.loader.sampler

    @property
    def dataset(self):
        return self.loader.dataset

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        for batch, targets in self.loader:
            batch = batch.to(self.device, non_blocking=True)
            yield self.augment(batch), targets.to(self.device, non_blocking=True)


def on_device(loader, draws: Draws, device: torch.device):
    """``loader`` (of a :class:`CropSet`, collated by :func:`collate`) as normalized, erased image batches on
    ``device``: the fast path's equivalent of iterating the PIL path's loader."""
    from timm.data.loader import PrefetchLoader

    erasing = draws.erasing
    return PrefetchLoader(
        DeviceBatches(loader, DeviceAugment(draws), device),
        mean=draws.mean,
        std=draws.std,
        device=device,
        re_prob=erasing.probability if erasing is not None else 0.0,
        re_mode=erasing.mode if erasing is not None else "const",
        re_count=erasing.max_count if erasing is not None else 1,
        re_num_splits=erasing.num_splits if erasing is not None else 0,
    )
