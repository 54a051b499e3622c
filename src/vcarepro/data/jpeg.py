"""A box of an image file, decoded as few pixels as the crop allows: the CPU's whole share of the fast input path.

libjpeg-turbo (simplejpeg) decodes a JPEG at the smallest DCT scale of 1/2, 1/4 or 1/8 that keeps the box at least
1.5x ``out`` on each side, so the bicubic resize does the last of the shrink: at 1x the DCT's shrink differed from
Pillow's resize by 2.6 levels on average, at 1.5x by 0.56. The other scales (3/8, 5/8, ...) have no SIMD code and
decode slower than full size. Anything else (PNG, CMYK or YCCK JPEGs, what strict mode refuses) goes through Pillow
as the PIL path does, so a file decodes to Pillow's pixels or fails with Pillow's reason.
"""

from __future__ import annotations

import math
from typing import Tuple

import numpy as np

from vcarepro.data.folders import Stored, check_pixels, decoded_image, read_image

JPEG_MAGIC = b"\xff\xd8"
TURBO_COLORSPACES = ("YCbCr", "Gray", "RGB")  # what libjpeg-turbo converts to RGB as Pillow does
SCALES = (8, 4, 2)  # DCT reductions with SIMD code in libjpeg-turbo
OVERSAMPLE = 1.5  # a scaled box keeps at least this many times the output's pixels a side


def image_size(data: bytes, image: Stored) -> Tuple[int, int, bool]:
    """(width, height, whether libjpeg-turbo decodes it) of an image's bytes, read from its header; an image over
    Pillow's pixel limit is refused here, before anything is decoded (:func:`~vcarepro.data.folders.check_pixels`)."""
    import simplejpeg  # here, not at import: a GPU node that trains on the PIL path needs no simplejpeg wheel

    if data[:2] == JPEG_MAGIC:
        try:
            height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
        except ValueError:
            colorspace = None  # Pillow decides, and names the fault if there is one
        if colorspace in TURBO_COLORSPACES:
            check_pixels(image, width, height)
            return width, height, True
    with decoded_image(image, data) as img:  # checks the limit too
        return img.width, img.height, False


def scale_for(size: Tuple[int, int, bool], box: Tuple[int, int, int, int], out: int) -> int:
    """The DCT reduction :func:`decode_box` decodes ``box`` at: the largest that keeps it ``OVERSAMPLE * out`` a side
    (1 for what Pillow decodes)."""
    return next((f for f in SCALES if min(box[2], box[3]) >= f * OVERSAMPLE * out), 1) if size[2] else 1


def crop_shape(size: Tuple[int, int, bool], box: Tuple[int, int, int, int], out: int) -> Tuple[int, int]:
    """(height, width) of the pixels :func:`decode_box` returns for ``box``, known before decoding, unless
    libjpeg-turbo refuses a file that Pillow then decodes at full scale."""
    top, left, height, width = box
    factor = scale_for(size, box, out)
    return math.ceil((top + height) / factor) - top // factor, math.ceil((left + width) / factor) - left // factor


def decode_box(
    data: bytes, image: Stored, size: Tuple[int, int, bool], box: Tuple[int, int, int, int], out: int, copy: bool = True
):
    """The pixels around ``box`` (top, left, height, width) of an image of ``size`` (:func:`image_size`) as uint8
    HxWx3, and the box within them as (x0, y0, x1, y1) in those pixels' units (fractional where a DCT scale applied),
    decoded at the smallest scale that keeps the box at least ``OVERSAMPLE * out`` pixels a side. ``copy=False``
    gives a view into the whole decoded image, for a caller that copies it at once."""
    full_w, full_h, turbo = size
    top, left, height, width = box
    if turbo:
        import simplejpeg

        factor = scale_for(size, box, out)
        scaled_size = (math.ceil(full_h / factor), math.ceil(full_w / factor))
        try:
            pixels = simplejpeg.decode_jpeg(
                data, "RGB", min_height=scaled_size[0], min_width=scaled_size[1], min_factor=factor
            )
            if pixels.shape[:2] != scaled_size:  # not the scale asked for: the box would not map onto it
                factor, pixels = 1, simplejpeg.decode_jpeg(data, "RGB")
        except ValueError:
            pixels = None  # a JPEG libjpeg-turbo calls faulty: Pillow's verdict, as the PIL path would give
        if pixels is not None:
            y0, x0 = top // factor, left // factor
            y1, x1 = math.ceil((top + height) / factor), math.ceil((left + width) / factor)
            crop = pixels[y0:y1, x0:x1]
            if copy:
                crop = np.ascontiguousarray(crop)  # frees the whole image now, for the next decode
            scaled = (left / factor - x0, top / factor - y0, (left + width) / factor - x0, (top + height) / factor - y0)
            return crop, scaled
    with decoded_image(image, data) as img:
        pixels = np.asarray(img.convert("RGB"))
    crop = pixels[top : top + height, left : left + width]
    return np.ascontiguousarray(crop) if copy else crop, (0.0, 0.0, float(width), float(height))


def decode_full(image: Stored) -> np.ndarray:
    """A whole image as uint8 HxWx3, as the fast path decodes it at full scale."""
    data = read_image(image)
    size = image_size(data, image)
    return decode_box(data, image, size, (0, 0, size[1], size[0]), max(size[:2]) + 1)[0]
