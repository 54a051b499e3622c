"""The feature extractor a scale measures its generated images with, behind one interface.

``extractor(images)`` maps uint8 (B, C, H, W) to ``(features, logits)``: FID / KID / precision-recall's
space and the Inception Score's logits. Paper scale: ``inception.InceptionFeatures``; embedded: :class:`DigitFeatures`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Tuple

import numpy as np
import torch

from vcarepro.core.errors import BadInput
from vcarepro.metrics.digit_features import DIGITS_EXTRACTOR, INCEPTION_EXTRACTOR, load_feature_net


class DigitFeatures:
    """The embedded scale's digit classifier: penultimate features and logits (1- or 3-channel input)."""

    def __init__(self, weights: str | Path, device: torch.device, batch_size: int = 500):
        self.net = load_feature_net(weights).to(device).eval()
        self.device = device
        self.batch_size = batch_size
        self.feature_dim = self.net.feature_dim

    @torch.no_grad()
    def __call__(self, images: torch.Tensor) -> Tuple[np.ndarray, np.ndarray]:
        features = self.net.features(images.to(self.device).float() / 255.0)
        logits = self.net.classify(features)
        return features.double().cpu().numpy(), logits.double().cpu().numpy()


def make_extractor(
    gen_meta: Dict[str, Any],
    prepare_gen: Dict[str, Any],
    device: torch.device,
    *,
    batch_size: int = 100,
    gen_data: str | Path = "data/gen",
):
    """The extractor named by ``data/gen/meta.json``'s ``fid_extractor`` (digits | inception), and its name."""
    if gen_meta["fid_extractor"] == "digits":
        return DigitFeatures(Path(gen_data) / "fid_extractor.safetensors", device), DIGITS_EXTRACTOR
    if gen_meta["fid_extractor"] == "inception":
        from vcarepro.metrics.inception import InceptionFeatures

        return InceptionFeatures(prepare_gen["inception_weights"], device, batch_size=batch_size), INCEPTION_EXTRACTOR
    raise BadInput(f"fid_extractor={gen_meta['fid_extractor']!r} is unknown; use 'digits' or 'inception'.")
