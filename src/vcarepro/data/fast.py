"""The fast training input path: loader workers read, decode and crop; the device does every per-pixel op, batched.

The recipe's timm transform (``build_transforms``), taken apart: each worker draws crop box, flip and RandAugment
ops from that transform's own objects in its order (their PIL functions swapped for recorders), decodes only the
box (:mod:`vcarepro.data.jpeg`) and ships a uint8 crop with its plan; :class:`DeviceAugment` and
:class:`DevicePrefetcher` apply it on the device. docs/performance.md (the training input path) says more.
"""

from __future__ import annotations

import copy
import math
import os
import random
from pathlib import Path
from typing import Iterator, List, NamedTuple, Tuple

import numpy as np
import torch
from PIL import Image
from torch.utils.data import get_worker_info

from vcarepro.core.errors import BadInput
from vcarepro.data import device_ops
from vcarepro.data.folders import ManifestDataset, read_image
from vcarepro.data.jpeg import crop_shape, decode_box, image_size

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


class _Recorder:
    """Stands in for timm's PIL function ``name``: records what it would be called with, drawing the interpolation as
    timm's own ``_check_args_tf`` does. (A class, not a closure: the draws travel to spawned loader workers.)"""

    def __init__(self, name: str, size: int) -> None:
        self.name, self.size, self.code = name, size, OPS.index(name)

    def __call__(self, plan: Plan, *level, **kwargs) -> Plan:
        from timm.data import auto_augment

        plan.codes[plan.layer] = self.code
        if self.name in device_ops.GEOMETRIC:
            auto_augment._check_args_tf(kwargs)
            plan.params[plan.layer] = _affine_matrix(self.name, level[0], self.size)
            plan.kinds[plan.layer] = _interpolation_code(kwargs["resample"])
        elif level:
            plan.params[plan.layer] = (level[0], 0.0, 0.0, 0.0, 0.0, 0.0)
        return plan


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
                op.aug_fn = _Recorder(name, self.size)
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
    """A batch of crops as the workers ship it: the tensors (pinned and moved to the device field by field), and the
    device side's schedule, worked out on the host so that the device never waits for the host to read it back."""

    pixels: torch.Tensor  # uint8: every crop's HxWx3 bytes, one after another
    sizes: torch.Tensor  # (N, 2) each crop's (H, W)
    boxes: torch.Tensor  # (N, 4) float64: the box each crop is resized from, (x0, y0, x1, y1)
    kinds: torch.Tensor  # (N,) its interpolation
    flips: torch.Tensor  # (N,) bool
    params: torch.Tensor  # (N, layers, 6) float64: each RandAugment layer's op parameters
    op_kinds: torch.Tensor  # (N, layers) each op's interpolation
    order: torch.Tensor  # the crops in resize order, then, per layer, the images each op takes
    chunks: Tuple[Tuple[int, ...], ...]  # resize chunks into order[:N] (device_ops.resize_plan)
    groups: Tuple[Tuple[int, ...], ...]  # (layer, op code, first, last, any bilinear, any bicubic) into order[N:]

    def to(self, device, non_blocking: bool = False) -> "CropBatch":
        return CropBatch(*(t.to(device, non_blocking=non_blocking) if torch.is_tensor(t) else t for t in self))

    def pin_memory(self) -> "CropBatch":
        return CropBatch(*(t.pin_memory() if torch.is_tensor(t) else t for t in self))


def op_groups(codes: np.ndarray, kinds: np.ndarray) -> Tuple[List[int], List[Tuple[int, ...]]]:
    """Per RandAugment layer, the images each op code takes: (their indices, one after another; (layer, code, first,
    last, any bilinear, any bicubic) for each op a layer applies)."""
    order: List[int] = []
    groups = []
    for layer in range(codes.shape[1]):
        for code in np.unique(codes[:, layer]).tolist():
            if code != SKIPPED:
                members = np.flatnonzero(codes[:, layer] == code)
                bicubic = kinds[members, layer] == device_ops.BICUBIC
                interpolations = (not bicubic.all(), bool(bicubic.any()))
                groups.append((layer, code, len(order), len(order) + len(members), *interpolations))
                order += members.tolist()
    return order, groups


class CropSet(ManifestDataset):
    """A split of the prepared layout, each item one image's crop and draws (:class:`Draws`), decoded in the worker."""

    def __init__(self, root: str | Path, split: str, draws: Draws) -> None:
        super().__init__(root, split)
        self.draws = draws

    def _head(self, index: int):
        """(image, bytes, size, label, draws) of an image: all that is known before its pixels are decoded."""
        image, label = self.samples[index]
        data = read_image(image)
        size = image_size(data, image)
        return image, data, size, label, self.draws(*size[:2])

    def _read(self, index: int):
        image, data, size, label, (box, kind, flip, plan) = self._head(index)
        pixels, scaled = decode_box(data, image, size, box, self.draws.size)
        return pixels, scaled, kind, flip, plan, label

    def __getitems__(self, indices: List[int]) -> "Fetched":
        """A whole batch, as torch's loader fetches one: every image's draws first, then each image decoded and its
        crop copied once, into the batch's buffer (the draws run faster together than between decodes, and a crop
        copied straight into the batch is not copied twice). The buffer is sized for the crops as decoded, at their DCT
        scale, not for their boxes at full size, up to 64 times more."""
        heads = [self._head(index) for index in indices]  # each header read, and checked against the pixel limit
        planned = [3 * math.prod(crop_shape(size, box, self.draws.size)) for _, _, size, _, (box, *_) in heads]
        pixels = _bytes_for_a_batch(sum(planned))
        flat, start, shapes, scaled = pixels.numpy(), 0, [], []
        for i, (image, data, size, _, (box, *_)) in enumerate(heads):
            crop, where = decode_box(data, image, size, box, self.draws.size, copy=False)
            if start + crop.size > flat.size:  # libjpeg-turbo refused it and Pillow decoded it at full scale
                pixels = _grown(pixels[:start], start + crop.size + sum(planned[i + 1 :]))
                flat = pixels.numpy()
            flat[start : start + crop.size].reshape(crop.shape)[...] = crop
            start += crop.size
            shapes.append(crop.shape[:2])
            scaled.append(where)
        draws = [(where, kind, flip, plan, label) for where, (*_, label, (_, kind, flip, plan)) in zip(scaled, heads)]
        return Fetched(pixels[:start], shapes, draws)

    def collate(self, items) -> Tuple[CropBatch, torch.Tensor]:
        """The loader's ``collate_fn``: :func:`collate` at this split's output size."""
        return collate(items, self.draws.size)


class Fetched(NamedTuple):
    """A batch as :meth:`CropSet.__getitems__` reads it: its crops already in one buffer, and each one's draws."""

    pixels: torch.Tensor
    shapes: List[Tuple[int, int]]
    draws: List[tuple]  # (box within the crop, interpolation, flip, plan, label)


def _bytes_for_a_batch(count: int) -> torch.Tensor:
    """A uint8 buffer for a batch's crops: in shared memory inside a loader worker, as torch's own collate allocates
    its batches, so that the batch reaches the training process without a copy.

    The shared memory is an anonymous file (memfd), shared by its descriptor as torch's default strategy shares its
    own: it has no name in /dev/shm, so a worker that dies, or fails to allocate, leaves nothing behind there (torch's
    allocator leaves its /dev/shm/torch_* file when the allocation fails)."""
    if get_worker_info() is None or count == 0:
        return torch.empty(count, dtype=torch.uint8)
    if not hasattr(os, "memfd_create"):  # not Linux
        return torch.empty(0, dtype=torch.uint8).set_(torch.UntypedStorage._new_shared(count))
    fd = os.memfd_create("vcarepro-crops", os.MFD_CLOEXEC)
    try:
        os.posix_fallocate(fd, 0, count)  # no room is an error here, not a SIGBUS at the first write
        storage = torch.UntypedStorage._new_shared_fd_cpu(fd, count)  # keeps a duplicate of the descriptor
    finally:
        os.close(fd)
    return torch.empty(0, dtype=torch.uint8).set_(storage)


def _grown(kept: torch.Tensor, count: int) -> torch.Tensor:
    """A batch buffer of ``count`` bytes that starts with ``kept``."""
    pixels = _bytes_for_a_batch(count)
    pixels[: kept.numel()] = kept
    return pixels


def collate(items, out: int) -> Tuple[CropBatch, torch.Tensor]:
    """A batch (a :class:`Fetched`, or a list of :meth:`CropSet.__getitem__`'s items, whose crops are then copied into
    one buffer) as a :class:`CropBatch`: the crops, their draws as small tensors, the device side's schedule for crops
    resized to ``out``; and the labels."""
    if isinstance(items, Fetched):
        pixels, shapes, draws = items
    else:
        pixels = _bytes_for_a_batch(sum(item[0].size for item in items))
        flat, start = pixels.numpy(), 0
        for item in items:
            flat[start : start + item[0].size].reshape(item[0].shape)[...] = item[0]
            start += item[0].size
        shapes, draws = [item[0].shape[:2] for item in items], [item[1:] for item in items]
    plans = [d[3] for d in draws]
    sizes = torch.tensor(shapes, dtype=torch.int64)
    boxes = torch.tensor([d[0] for d in draws], dtype=torch.float64)
    op_kinds = np.array([p.kinds for p in plans], dtype=np.int8).reshape(len(draws), -1)
    resize_order, chunks = device_ops.resize_plan(sizes, boxes, out)
    ops_order, groups = op_groups(np.array([p.codes for p in plans], dtype=np.int8).reshape(len(draws), -1), op_kinds)
    batch = CropBatch(
        pixels,
        sizes,
        boxes,
        torch.tensor([d[1] for d in draws], dtype=torch.int8),
        torch.tensor([d[2] for d in draws], dtype=torch.bool),
        torch.tensor([p.params for p in plans], dtype=torch.float64).view(len(draws), -1, 6),
        torch.from_numpy(op_kinds),
        torch.tensor(resize_order + ops_order, dtype=torch.int64),
        tuple(chunks),
        tuple(groups),
    )
    return batch, torch.tensor([d[4] for d in draws], dtype=torch.int64)


class DeviceAugment:
    """The per-pixel half of the recipe's augmentation on ``device``: resize, flip, RandAugment.

    Takes a :class:`CropBatch` where the workers left it (on the host) and returns (N, 3, S, S) float32 holding 8-bit
    values on ``device``. It copies the batch without waiting, and every decision is read from the batch's schedule,
    never from the device: nothing in it waits for the device to catch up.
    """

    def __init__(self, draws: Draws, device: torch.device) -> None:
        self.size, self.device = draws.size, torch.device(device)
        self.fill = torch.tensor(getattr(draws, "fill", (0, 0, 0)), device=self.device)

    def __call__(self, batch: CropBatch) -> torch.Tensor:
        n = batch.sizes.shape[0]
        on = batch.to(self.device, non_blocking=True)
        plan = on.order[:n], on.chunks
        images = device_ops.resize_crops(on.pixels, on.sizes, on.boxes, on.kinds.long(), self.size, plan)
        images = torch.where(on.flips.view(-1, 1, 1, 1), images.flip(-1), images)
        for layer, code, first, last, any_bilinear, any_bicubic in on.groups:
            idx = on.order[n + first : n + last]
            params, kinds, name = on.params[idx, layer], on.op_kinds[idx, layer].long(), OPS[code]
            if name in device_ops.GEOMETRIC:
                images[idx] = device_ops.affine(images[idx], params, kinds, self.fill, (any_bilinear, any_bicubic))
            else:
                images[idx] = device_ops.PIXEL_OPS[name](images[idx], params[:, 0])
        return images


class DevicePrefetcher:
    """A crop loader's batches, augmented, normalized and erased on ``device``: what the training loop iterates.

    timm's ``PrefetchLoader``, with the fast path's device side inside its stream: it normalizes and erases the next
    batch (with timm's ``RandomErasing``) on a side stream while the current one trains, but runs what its inner
    loader does on the training stream, which would put the resize and RandAugment in every step's way. Build it once
    for a run: a new CUDA stream each epoch would leave the caching allocator's blocks of the old one unusable.
    """

    def __init__(self, loader, draws: Draws, device: torch.device) -> None:
        self.loader, self.device = loader, torch.device(device)
        self.augment = DeviceAugment(draws, self.device)
        self.mean = torch.tensor([255 * m for m in draws.mean], device=self.device).view(1, 3, 1, 1)
        self.std = torch.tensor([255 * s for s in draws.std], device=self.device).view(1, 3, 1, 1)
        self.erasing = copy.copy(draws.erasing)  # the transform's own RandomErasing, drawing on the device
        if self.erasing is not None:
            self.erasing.device = self.device
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None

    def __len__(self) -> int:
        return len(self.loader)

    # the wrapped loader's, as timm's PrefetchLoader exposes them: the loop reseeds and reads them through this object
    @property
    def sampler(self):
        return self.loader.sampler

    @property
    def dataset(self):
        return self.loader.dataset

    @property
    def generator(self) -> torch.Generator:
        return self.loader.generator

    def prepare(self, batch: CropBatch, targets: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        images = self.augment(batch).sub_(self.mean).div_(self.std)
        if self.erasing is not None:
            images = self.erasing(images)
        return images, targets.to(self.device, non_blocking=True)

    def __iter__(self) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        if self.stream is None:
            yield from (self.prepare(*batch) for batch in self.loader)
            return
        consumer, ready = torch.cuda.current_stream(self.device), None
        for batch in self.loader:
            # the blocks the training step freed may be handed to this batch: let the step finish with them first
            self.stream.wait_stream(consumer)
            with torch.cuda.stream(self.stream):
                upcoming = self.prepare(*batch)
            if ready is not None:
                yield ready
            consumer = torch.cuda.current_stream(self.device)
            consumer.wait_stream(self.stream)
            ready = upcoming
        if ready is not None:
            yield ready
