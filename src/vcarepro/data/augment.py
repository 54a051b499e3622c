"""timm's augmentation policies, made to run on the Pillow we install.

RandAugment with magnitude noise (``rand-m9-mstd0.5-inc1``, DeiT's and the lab's policy) draws each
op's level from N(9, 0.5) clipped to [0, 10]; at level 10 ``PosterizeIncreasing`` keeps
``4 - int(10 / 10 * 4) = 0`` bits. Pillow before 13 turned ``posterize(img, 0)`` into a black
image (its mask ``~(2 ** 8 - 1)`` clears every bit), which is what DeiT and the lab trained with;
Pillow 13 raises ``ValueError: bits must be between or equal to 1 and 8`` instead (4 of 3,000
transforms of a 64 px image in the first batch). The policy stays exactly the recipe's: only the
posterize ops are given back Pillow's old result for 0 bits.
"""

from __future__ import annotations

from PIL import Image, ImageOps

POSTERIZE_OPS = ("Posterize", "PosterizeIncreasing", "PosterizeOriginal")


def posterize(img: Image.Image, bits_to_keep: int, **_) -> Image.Image:
    """timm's ``posterize`` with every bit count its levels produce: 0 bits keep nothing (black), as Pillow < 13."""
    if bits_to_keep >= 8:
        return img
    if bits_to_keep <= 0:
        return Image.new(img.mode, img.size, 0)
    return ImageOps.posterize(img, bits_to_keep)


def pillow_safe(transform):
    """``transform`` (a timm / torchvision Compose) with its RandAugment / AutoAugment posterize ops mended, in
    place."""
    from timm.data.auto_augment import AugMixAugment, AutoAugment, RandAugment

    for t in getattr(transform, "transforms", [transform]):
        if isinstance(t, (RandAugment, AugMixAugment)):
            ops = t.ops
        elif isinstance(t, AutoAugment):
            ops = [op for sub_policy in t.policy for op in sub_policy]
        else:
            continue
        for op in ops:
            if op.name in POSTERIZE_OPS:
                op.aug_fn = posterize
    return transform
