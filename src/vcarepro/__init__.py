"""vca-repro: Visual-Contrast Attention and the pipeline that reproduces its paper.

Importing the package registers the VCA backbones with timm, so
``timm.create_model("vca_deit_tiny_patch16_224")`` works after ``import vcarepro``.
"""
from . import models  # noqa: F401  (registers timm models)
from .attention import VisualContrastAttention

__version__ = "0.1.0"
__all__ = ["VisualContrastAttention", "models"]
