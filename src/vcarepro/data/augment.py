"""timm's augmentation policies, made to run on the Pillow we install.

At level 10, ``rand-m9-mstd0.5-inc1``'s ``PosterizeIncreasing`` keeps 0 bits. Pillow before 13 gave a black
image, which DeiT and the lab trained with; Pillow 13 raises ``ValueError`` instead. Only the posterize ops
are given back Pillow's old result for 0 bits; the policy is otherwise the recipe's.
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
