"""timm's PIL training ops as batched, device-agnostic torch code, each rounded as Pillow rounds it.

Every op takes a float batch ``(N, C, H, W)`` holding whole numbers in [0, 255] (an 8-bit image, as Pillow
keeps it between ops) and per-image arguments, and returns the same. The arithmetic follows Pillow's C code
step by step (its resampling filters and fixed-point rounding, its LUTs, the float32 order of its blends and
3x3 filter, the float64 of its affine sampler), so an op here gives Pillow's pixels to within one level;
tests/test_fast_loader.py holds each op to Pillow's with a stated tolerance. torchvision's tensor functionals
do not: their bicubic resize and affine kernels differ from Pillow's, and they take one argument per batch.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Dict, Iterator, List, Tuple

import torch

PRECISION = float(1 << 22)  # Pillow's fixed point for 8-bit resampling (Resample.c, PRECISION_BITS)
BILINEAR, BICUBIC = 0, 1  # codes of a sample's interpolation, as its plan records them
CHUNK_PIXELS = 1 << 23  # input pixels resized at once: bounds the padded buffer (~100 MB as float32)


def _resize_filter(x: torch.Tensor, kind: torch.Tensor) -> torch.Tensor:
    """Pillow's resize filters at ``x`` (float64): bicubic with a = -0.5, support 2; bilinear, support 1."""
    x = x.abs()
    a = -0.5
    cubic = torch.where(
        x < 1.0, ((a + 2.0) * x - (a + 3.0)) * x * x + 1, torch.where(x < 2.0, (((x - 5) * x + 8) * x - 4) * a, 0.0)
    )
    linear = torch.where(x < 1.0, 1.0 - x, 0.0)
    return torch.where(kind == BICUBIC, cubic, linear)


def resample_weights(lo: torch.Tensor, hi: torch.Tensor, size: torch.Tensor, kind: torch.Tensor, out: int, span: int):
    """Pillow's ``precompute_coeffs`` and ``normalize_coeffs_8bpc`` for a batch: ``(N, out, span)`` weights that map
    ``span`` input pixels (of which the first ``size`` exist) onto ``out``, reading the box [lo, hi)."""
    lo, hi, size, kind = (t.double()[:, None, None] for t in (lo, hi, size, kind))
    scale = (hi - lo) / out
    filterscale = scale.clamp(min=1.0)
    support = torch.where(kind == BICUBIC, 2.0, 1.0) * filterscale
    center = lo + (torch.arange(out, dtype=torch.float64, device=lo.device)[None, :, None] + 0.5) * scale
    x = torch.arange(span, dtype=torch.float64, device=lo.device)[None, None, :]
    inside = (x >= (center - support + 0.5).trunc().clamp(min=0)) & (
        x < (center + support + 0.5).trunc().clamp(max=size)
    )
    w = torch.where(inside, _resize_filter((x - center + 0.5) * (1.0 / filterscale), kind), 0.0)
    total = w.sum(-1, keepdim=True)
    w = torch.where(total != 0, w / total, w)
    return torch.where(w < 0, (w * PRECISION - 0.5).trunc(), (w * PRECISION + 0.5).trunc()).float() / PRECISION


def _round8(x: torch.Tensor) -> torch.Tensor:
    """Pillow's ``clip8`` of a fixed-point sum: round half up, clamp to [0, 255]."""
    return (x + 0.5).floor_().clamp_(0, 255)


@contextmanager
def _full_fp32(device: torch.device) -> Iterator[None]:
    """Float32 matmuls in full float32 for the block, also where the run allows TF32 (its 10-bit mantissa would move
    pixels by a level), through whichever of PyTorch's two switches is in use."""
    matmul = torch.backends.cuda.matmul
    if device.type != "cuda":
        yield
        return
    try:
        before = matmul.allow_tf32
        matmul.allow_tf32 = False
    except RuntimeError:  # the newer fp32_precision API was set, after which the old switch may not be read
        before = matmul.fp32_precision
        matmul.fp32_precision = "ieee"
    try:
        yield
    finally:
        if isinstance(before, bool):
            matmul.allow_tf32 = before
        else:
            matmul.fp32_precision = before


def resize_plan(sizes: torch.Tensor, boxes: torch.Tensor, out: int) -> Tuple[List[int], List[Tuple[int, ...]]]:
    """On the host: the order the crops are resized in, and its chunks (first, last, padded height and width, whether
    the first pass runs down), so that the device side never waits for a value of its own.

    Pillow resizes in two passes, rounding to 8 bits between them: along the width first, unless the height shrinks
    by more than twice what the width does (Pillow 13, python-pillow/Pillow#9549; judged here on the box, which a DCT
    scale shrinks in both directions alike). A chunk holds crops of one pass order and similar areas.
    """
    heights, widths = sizes[:, 0].tolist(), sizes[:, 1].tolist()
    shrink = (boxes[:, 2:] - boxes[:, :2] - out).tolist()
    tall = [lost_h > 0 and lost_h > 2 * lost_w for lost_w, lost_h in shrink]
    order = sorted(range(len(heights)), key=lambda i: (tall[i], heights[i] * widths[i]))
    chunks, first = [], 0
    while first < len(order):
        last, height, width = first, 0, 0
        while last < len(order) and tall[order[last]] == tall[order[first]]:
            i = order[last]
            rows, cols = (widths[i], heights[i]) if tall[i] else (heights[i], widths[i])
            if last > first and (last + 1 - first) * max(height, rows) * max(width, cols) > CHUNK_PIXELS:
                break
            height, width, last = max(height, rows), max(width, cols), last + 1
        chunks.append((first, last, height, width, tall[order[first]]))
        first = last
    return order, chunks


def resize_crops(
    pixels: torch.Tensor, sizes: torch.Tensor, boxes: torch.Tensor, kinds: torch.Tensor, out: int, plan=None
) -> torch.Tensor:
    """Each crop resized to ``out`` x ``out`` as Pillow's ``resize(box=...)``: ``(N, 3, out, out)`` float.

    ``pixels``: every crop's uint8 HxWx3 bytes, one after another; ``sizes`` (N, 2) their (H, W); ``boxes`` (N, 4)
    the (x0, y0, x1, y1) each reads; ``kinds`` (N,) BILINEAR or BICUBIC. ``plan``: (the order, on the device; the
    chunks) of :func:`resize_plan`, made on the host from a host copy of ``sizes`` and ``boxes``; without it this
    function makes it (reading them back where they are on a GPU). Each pass is a batched matrix product with
    Pillow's fixed-point filter weights over a chunk of crops padded to one size.
    """
    if plan is None:
        order, chunks = resize_plan(sizes.cpu(), boxes.cpu(), out)
        plan = torch.tensor(order, device=pixels.device), chunks
    order, chunks = plan
    counts = sizes[:, 0] * sizes[:, 1]
    starts = torch.cumsum(counts, 0) - counts
    result = torch.empty(sizes.shape[0], 3, out, out, device=pixels.device)
    for first, last, height, width, tall in chunks:
        idx = order[first:last]
        result[idx] = _resize_chunk(pixels, starts[idx], sizes[idx], boxes[idx], kinds[idx], out, height, width, tall)
    return result


def _resize_chunk(pixels, starts, sizes, boxes, kinds, out, height, width, tall):
    """A chunk of crops resized; read transposed where ``tall``, so that the first pass runs down the crop."""
    m = sizes.shape[0]
    rows, cols = sizes[:, 0, None, None], sizes[:, 1, None, None]
    if tall:  # the transposed crop: its rows are the crop's columns
        sizes = sizes.flip(1)
        boxes = torch.stack([boxes[:, 1], boxes[:, 0], boxes[:, 3], boxes[:, 2]], 1)
    # each pixel of the chunk padded to (m, height, width); the padding reads pixel 0, which zero weights ignore
    y = torch.arange(height, device=pixels.device)[None, :, None]
    x = torch.arange(width, device=pixels.device)[None, None, :]
    r, c = (x, y) if tall else (y, x)
    source = torch.where((r < rows) & (c < cols), starts[:, None, None] + r * cols + c, 0)
    padded = pixels.view(-1, 3)[source.view(-1)].view(m, height, width, 3).permute(0, 3, 1, 2).float()
    wx = resample_weights(boxes[:, 0], boxes[:, 2], sizes[:, 1], kinds, out, width)  # (m, out, width)
    wy = resample_weights(boxes[:, 1], boxes[:, 3], sizes[:, 0], kinds, out, height)  # (m, out, height)
    with _full_fp32(pixels.device):
        across = _round8(padded.reshape(m, 3 * height, width) @ wx.transpose(1, 2))  # (m, 3*height, out)
        across = across.view(m, 3, height, out).permute(0, 2, 1, 3).reshape(m, height, 3 * out)
        down = _round8(wy @ across).view(m, out, 3, out)  # (m, out rows, 3, out columns)
    return down.permute(0, 2, 3, 1) if tall else down.permute(0, 2, 1, 3)


# ----------------------------------------------------------------------------- per-pixel ops (LUTs, blends)


def apply_lut(images: torch.Tensor, lut: torch.Tensor) -> torch.Tensor:
    """Pillow's ``point``: ``lut`` (N, 256) or (N, C, 256) of whole numbers, clipped to 8 bits as Pillow clips it."""
    n, c = images.shape[:2]
    lut = lut.clamp(0, 255).to(images.dtype)
    lut = (lut if lut.dim() == 3 else lut[:, None]).expand(n, c, 256)
    return torch.gather(lut, 2, images.long().view(n, c, -1)).view_as(images)


def _levels(images: torch.Tensor) -> torch.Tensor:
    return torch.arange(256, device=images.device, dtype=torch.float64)[None]


def _histogram(images: torch.Tensor) -> torch.Tensor:
    """(N, C, 256) pixel counts of each image's channels (a scatter, not ``bincount``: that reads its input's maximum
    back from the device)."""
    n, c = images.shape[:2]
    bins = (torch.arange(n * c, device=images.device)[:, None] * 256 + images.long().view(n * c, -1)).view(-1)
    counts = torch.zeros(n * c * 256, dtype=torch.long, device=images.device)
    return counts.scatter_add_(0, bins, torch.ones_like(bins)).view(n, c, 256)


def auto_contrast(images: torch.Tensor, _args: torch.Tensor) -> torch.Tensor:
    """``ImageOps.autocontrast``: each channel stretched so its darkest value is 0 and its brightest 255."""
    lo = images.amin(dim=(2, 3)).double()[..., None]
    hi = images.amax(dim=(2, 3)).double()[..., None]
    scale = 255.0 / (hi - lo).clamp(min=1)
    lut = (_levels(images)[:, None] * scale - lo * scale).trunc()
    return apply_lut(images, torch.where(hi <= lo, _levels(images)[:, None].expand_as(lut), lut))


def equalize(images: torch.Tensor, _args: torch.Tensor) -> torch.Tensor:
    """``ImageOps.equalize``: each channel's histogram flattened, in Pillow's integer steps."""
    hist = _histogram(images)
    top = 255 - torch.flip(hist, [-1]).ne(0).long().argmax(-1, keepdim=True)  # the brightest value present
    step = (hist.sum(-1, keepdim=True) - hist.gather(-1, top)) // 255
    below = torch.cumsum(hist, -1) - hist  # pixels darker than each value
    lut = (step // 2 + below) // step.clamp(min=1)
    keep = (hist.ne(0).sum(-1, keepdim=True) <= 1) | (step == 0)
    levels = torch.arange(256, device=images.device).expand_as(lut)
    return apply_lut(images, torch.where(keep, levels, lut))


def invert(images: torch.Tensor, _args: torch.Tensor) -> torch.Tensor:
    return 255.0 - images


def posterize(images: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    """``posterize`` as vcarepro.data.augment mends it: 8 bits keep the image, 0 (or fewer) make it black."""
    bits = bits.round().long()[:, None]
    mask = (~((1 << (8 - bits.clamp(1, 8))) - 1)) & 0xFF
    levels = torch.arange(256, device=images.device)[None]
    lut = torch.where(bits >= 8, levels, torch.where(bits <= 0, 0, levels & mask))
    return apply_lut(images, lut)


def solarize(images: torch.Tensor, thresholds: torch.Tensor) -> torch.Tensor:
    levels = _levels(images)
    return apply_lut(images, torch.where(levels < thresholds.double()[:, None], levels, 255 - levels))


def solarize_add(images: torch.Tensor, adds: torch.Tensor, threshold: int = 128) -> torch.Tensor:
    levels = _levels(images)
    return apply_lut(images, torch.where(levels < threshold, (levels + adds.double()[:, None]).clamp(max=255), levels))


def blend(degenerate: torch.Tensor, images: torch.Tensor, factors: torch.Tensor) -> torch.Tensor:
    """``Image.blend(degenerate, image, factor)`` for 8 bits: float32 ``d + f * (i - d)``, clipped, truncated."""
    f = factors.float().view(-1, 1, 1, 1)
    return (degenerate + f * (images - degenerate)).trunc_().clamp_(0, 255)


def _gray(images: torch.Tensor) -> torch.Tensor:
    """Pillow's ``convert("L")`` of RGB (ITU-R 601-2, 16-bit fixed point), (N, 1, H, W)."""
    r, g, b = images.long().unbind(1)
    return ((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16).to(images.dtype)[:, None]


def color(images: torch.Tensor, factors: torch.Tensor) -> torch.Tensor:
    return blend(_gray(images).expand_as(images), images, factors)


def contrast(images: torch.Tensor, factors: torch.Tensor) -> torch.Tensor:
    gray = _gray(images).long()
    mean = (gray.sum(dim=(1, 2, 3)).double() / gray[0].numel() + 0.5).floor()
    return blend(mean.to(images.dtype).view(-1, 1, 1, 1).expand_as(images), images, factors)


def brightness(images: torch.Tensor, factors: torch.Tensor) -> torch.Tensor:
    return blend(torch.zeros_like(images), images, factors)


def sharpness(images: torch.Tensor, factors: torch.Tensor) -> torch.Tensor:
    """``ImageEnhance.Sharpness``: a blend with ``ImageFilter.SMOOTH``, whose float32 sums run in Pillow's order."""
    side, middle = 1 / 13, 5 / 13  # multiplied into float32 tensors as float32, as Pillow stores its kernel

    def row(r: torch.Tensor, k: float) -> torch.Tensor:  # KERNEL1x3 of Filter.c
        return r[..., :-2] * side + r[..., 1:-1] * k + r[..., 2:] * side

    smooth = images.clone()
    inner = 0.5 + row(images[..., 2:, :], side)
    inner = inner + row(images[..., 1:-1, :], middle)
    inner = inner + row(images[..., :-2, :], side)
    smooth[..., 1:-1, 1:-1] = inner.clamp_(0, 255).trunc_()
    return blend(smooth, images, factors)


# ----------------------------------------------------------------------------- geometry (Pillow's affine transform)


def _bicubic(v1, v2, v3, v4, d):
    """Geometry.c's BICUBIC (a = -1), in its float64 order."""
    p2 = -v1 + v3
    p3 = 2 * (v1 - v2) + v3 - v4
    p4 = -v1 + v2 - v3 + v4
    return v2 + d * (p2 + d * (p3 + d * p4))


def affine(
    images: torch.Tensor, matrices: torch.Tensor, kinds: torch.Tensor, fill: torch.Tensor, interpolations=(True, True)
) -> torch.Tensor:
    """``Image.transform(size, AFFINE, matrix, resample, fillcolor=fill)`` per image: output pixel (x, y) reads the
    input at ``matrix @ (x + 0.5, y + 0.5, 1)``, bilinear or bicubic (a = -1) with edge-clamped taps, truncated;
    a point outside the input takes ``fill`` (C,). ``interpolations``: whether any image is bilinear, and any
    bicubic, as the host knows it (the kernels of the other are then not run)."""
    n, c, h, w = images.shape
    dev = images.device
    a, b, off_x, d, e, off_y = (m.double().view(n, 1, 1) for m in matrices.unbind(1))
    xs = torch.arange(w, device=dev, dtype=torch.float64)[None, None, :] + 0.5
    ys = torch.arange(h, device=dev, dtype=torch.float64)[None, :, None] + 0.5
    xin = a * xs + b * ys + off_x
    yin = d * xs + e * ys + off_y
    inside = (xin >= 0) & (xin < w) & (yin >= 0) & (yin < h)
    xin, yin = xin - 0.5, yin - 0.5
    x0, y0 = xin.floor(), yin.floor()
    dx, dy = (xin - x0)[:, None], (yin - y0)[:, None]
    flat = images.double().reshape(n, c, h * w)

    def tap(row: torch.Tensor, col: torch.Tensor) -> torch.Tensor:  # (n, c, h, w) pixels at clamped (row, col)
        index = (row.clamp(0, h - 1) * w + col.clamp(0, w - 1)).long().view(n, 1, -1).expand(n, c, -1)
        return torch.gather(flat, 2, index).view(n, c, h, w)

    any_bilinear, any_bicubic = interpolations
    values = 0.0
    if any_bilinear:
        rows = [tap(y0 + k, x0) + (tap(y0 + k, x0 + 1) - tap(y0 + k, x0)) * dx for k in (0, 1)]
        values = rows[0] + (rows[1] - rows[0]) * dy
    if any_bicubic:
        rows = [_bicubic(*(tap(y0 + k, x0 + j) for j in (-1, 0, 1, 2)), dx) for k in (-1, 0, 1, 2)]
        values = torch.where(kinds.view(n, 1, 1, 1) == BICUBIC, _bicubic(*rows, dy), values)
    out = torch.where(inside[:, None], values.clamp(0, 255).trunc(), fill.to(torch.float64).view(1, c, 1, 1))
    return out.to(images.dtype)


GEOMETRIC = frozenset({"rotate", "shear_x", "shear_y", "translate_x_abs", "translate_y_abs", "translate_x_rel",
                       "translate_y_rel"})  # fmt: skip
PIXEL_OPS: Dict[str, object] = {
    "auto_contrast": auto_contrast,
    "equalize": equalize,
    "invert": invert,
    "posterize": posterize,
    "solarize": solarize,
    "solarize_add": solarize_add,
    "color": color,
    "contrast": contrast,
    "brightness": brightness,
    "sharpness": sharpness,
}
