"""Model factories. Importing this module registers the VCA backbones with timm.

``create_classifier(arch, attention)`` is the one place that maps the pipeline's
(architecture, attention) pair to a timm model name:

    ("deit_tiny", "mhsa") -> timm's own deit_tiny_patch16_224
    ("deit_tiny", "vca")  -> vca_deit_tiny_patch16_224
    ("deit_tiny", "diff") -> diff_deit_tiny_patch16_224

    ("pvt_tiny", "vca")   -> vca_pvt_tiny              (PVT v1, written here; the lab's layout)
    ("swin_tiny", "vca")  -> vca_swin_tiny_patch4_window7_224 (timm's Swin, attention swapped)
    ("cswin_tiny", "vca") -> vca_cswin_tiny_224        (CSWin, written here)
    ("pvt_tiny_gap", "mhsa"), ("cswin_tiny_2418", "mhsa"): the backbones of the lab's layouts
                             with their own attention (controls)

For PVT, Swin and CSWin, "mhsa" names the backbone's own attention.

The DiT/SiT backbone has its own factory, ``models.dit.create_dit``.
"""
from __future__ import annotations

from typing import Any

import timm
import torch.nn as nn

from . import cswin, deit, pvt, swin  # noqa: F401  (each registers its timm models)
from .deit import VcaVisionTransformer
from .placement import HIERARCHICAL_VCA_OPTIONS
from vcarepro.errors import BadInput

# arch -> {attention: timm model name}
CLASSIFIER_ARCHS = {
    "deit_tiny": {"mhsa": "deit_tiny_patch16_224", "vca": "vca_deit_tiny_patch16_224",
                  "diff": "diff_deit_tiny_patch16_224"},
    "deit_small": {"mhsa": "deit_small_patch16_224", "vca": "vca_deit_small_patch16_224",
                   "diff": "diff_deit_small_patch16_224"},
}
for _module in (pvt, swin, cswin):
    CLASSIFIER_ARCHS.update(_module.MODEL_NAMES)
CLASSIFIER_ATTENTIONS = ("mhsa", "vca", "diff")


def classifier_name(arch: str, attention: str) -> str:
    """The timm model name for an (architecture, attention) pair."""
    if arch not in CLASSIFIER_ARCHS:
        raise BadInput(f"unknown model {arch!r}; choose one of {', '.join(map(repr, CLASSIFIER_ARCHS))}.")
    names = CLASSIFIER_ARCHS[arch]
    if attention not in names:
        raise BadInput(
            f"unknown attention {attention!r} for {arch}; choose one of {', '.join(map(repr, names))}."
        )
    return names[attention]


def create_classifier(arch: str, attention: str, **kwargs: Any) -> nn.Module:
    """Create a classifier; VCA knobs (``contrast_tokens``, ``stage1``, ...) only with attention='vca'."""
    name = classifier_name(arch, attention)
    if attention != "vca":
        stray = sorted(set(kwargs) & set(HIERARCHICAL_VCA_OPTIONS))
        if stray:
            raise BadInput(f"{', '.join(stray)} only apply to attention='vca', not {attention!r}; remove them.")
    return timm.create_model(name, **kwargs)


__all__ = ["CLASSIFIER_ARCHS", "CLASSIFIER_ATTENTIONS", "VcaVisionTransformer", "classifier_name",
           "create_classifier"]
