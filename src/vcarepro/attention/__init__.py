"""Attention layers compared in the paper, by name.

``mhsa`` is timm's own ``Attention`` (so a baseline DeiT is exactly timm's DeiT),
``diff`` is timm's ``DiffAttention`` (the Differential Transformer), and ``vca``
is Visual-Contrast Attention, written here because no library has it.
"""
from timm.layers import Attention, DiffAttention

from .vca import VisualContrastAttention, lambda_init_for_layer
from vcarepro.errors import BadInput

ATTENTION_LAYERS = {
    "mhsa": Attention,
    "diff": DiffAttention,
    "vca": VisualContrastAttention,
}


def attention_class(name: str):
    """The attention class for ``name``; a clear error for an unknown one."""
    try:
        return ATTENTION_LAYERS[name]
    except KeyError:
        raise BadInput(
            f"unknown attention {name!r}; choose one of {', '.join(map(repr, ATTENTION_LAYERS))}."
        ) from None


__all__ = ["ATTENTION_LAYERS", "Attention", "DiffAttention", "VisualContrastAttention",
           "attention_class", "lambda_init_for_layer"]
