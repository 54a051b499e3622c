"""A non-neural reference on the classification split: scikit-learn's logistic regression on raw pixels.

It says where a converged classifier should land on the embedded digits (a ViT well under it is undertrained).
Only small splits are fitted: on ImageNet a pixel-space linear model says nothing and would take hours.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, Optional

import numpy as np
from PIL import Image, ImageOps
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from vcarepro.core.errors import BadInput
from vcarepro.data.folders import Stored, decoded_image, read_manifest

MAX_ITER = 5000  # lbfgs reaches its tolerance on the digits well within this


def _gray(image: Stored, image_size: Optional[int]) -> np.ndarray:
    with decoded_image(image) as img:  # a damaged file: one sentence naming it and the fix
        img = img.convert("L")
        if image_size is not None:
            img = ImageOps.fit(img, (image_size, image_size), Image.BICUBIC)
        return np.asarray(img, dtype=np.float64).ravel() / 255.0


def _pixels(root: Path, split: str, image_size: Optional[int]):
    rows = read_manifest(root, split)
    images = [_gray(image, image_size) for image, _ in rows]
    if len({len(x) for x in images}) > 1:
        raise BadInput(
            f"the {split} images of {root} differ in size; set cls_reference.image_size to a side "
            f"(e.g. 32) to resize them."
        )
    return np.stack(images), np.array([label for _, label in rows])


def logistic_regression_top1(
    root: str | Path, *, max_train_images: int, c: float = 1.0, image_size: Optional[int] = None, seed: int = 0
) -> Dict[str, object]:
    """Validation top-1 (%) of a multinomial logistic regression fitted on the training split's pixels."""
    root = Path(root)
    n_train = len(read_manifest(root, "train"))
    if n_train > max_train_images:
        return {
            "computed": False,
            "reason": f"{n_train} training images exceed cls_reference.max_train_images={max_train_images}",
        }
    x_train, y_train = _pixels(root, "train", image_size)
    x_val, y_val = _pixels(root, "val", image_size)
    if x_train.shape[1] != x_val.shape[1]:
        raise BadInput(
            f"the train and val images of {root} differ in size; set cls_reference.image_size to a "
            f"side (e.g. 32) to resize them."
        )
    model = make_pipeline(StandardScaler(), LogisticRegression(C=c, max_iter=MAX_ITER, random_state=seed))
    model.fit(x_train, y_train)
    top1 = 100.0 * float((model.predict(x_val) == y_val).mean())
    return {
        "computed": True,
        "method": "logistic regression on standardised raw pixels (scikit-learn)",
        "logreg_top1": top1,
        "c": c,
        "n_train": int(len(y_train)),
        "n_val": int(len(y_val)),
        "features": int(x_train.shape[1]),
        "image_size": image_size,
    }
