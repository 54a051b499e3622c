"""Model factories. Importing this module registers the VCA backbones with timm.

``create_classifier(arch, attention)`` is the one place that maps the pipeline's
(architecture, attention) pair to a timm model name:

    ("deit_tiny", "mhsa") -> timm's own deit_tiny_patch16_224
    ("deit_tiny", "vca")  -> vca_deit_tiny_patch16_224
    ("deit_tiny", "diff") -> diff_deit_tiny_patch16_224

Hierarchical backbones (PVT, Swin, CSwin) and the DiT/SiT backbone join this
table in their own modules.
"""
from __future__ import annotations

from typing import Any

import timm
import torch.nn as nn

from . import deit  # noqa: F401  (registers vca_deit_* / diff_deit_*)
from .deit import VCA_OPTIONS, VcaVisionTransformer

# arch -> timm name of the MHSA baseline; "<attention>_<name>" is the variant.
CLASSIFIER_ARCHS = {
    "deit_tiny": "deit_tiny_patch16_224",
    "deit_small": "deit_small_patch16_224",
}
CLASSIFIER_ATTENTIONS = ("mhsa", "vca", "diff")


def classifier_name(arch: str, attention: str) -> str:
    """The timm model name for an (architecture, attention) pair."""
    if arch not in CLASSIFIER_ARCHS:
        raise ValueError(f"unknown model {arch!r}; choose one of {', '.join(map(repr, CLASSIFIER_ARCHS))}.")
    if attention not in CLASSIFIER_ATTENTIONS:
        raise ValueError(
            f"unknown attention {attention!r}; choose one of {', '.join(map(repr, CLASSIFIER_ATTENTIONS))}."
        )
    base = CLASSIFIER_ARCHS[arch]
    return base if attention == "mhsa" else f"{attention}_{base}"


def create_classifier(arch: str, attention: str, **kwargs: Any) -> nn.Module:
    """Create a classifier; VCA knobs (``contrast_tokens``, ``stage1``, ...) only with attention='vca'."""
    name = classifier_name(arch, attention)
    if attention != "vca":
        stray = sorted(set(kwargs) & set(VCA_OPTIONS))
        if stray:
            raise ValueError(f"{', '.join(stray)} only apply to attention='vca', not {attention!r}; remove them.")
    return timm.create_model(name, **kwargs)


__all__ = ["CLASSIFIER_ARCHS", "CLASSIFIER_ATTENTIONS", "VcaVisionTransformer", "classifier_name",
           "create_classifier"]
