"""Attention layers compared here, by name, behind one constructor interface.

``mhsa`` and ``diff`` are timm's ``Attention`` and ``DiffAttention`` (so a baseline DeiT
is exactly timm's DeiT); ``vca`` is written here because no library has it, and so is
the rest of the family (``agent``, ``flatten``, ``inline``, ``circulant`` and the
``mhsa+dwc`` control), each after its official module: docs/family.md lists them.
:func:`build_attention` makes any of them for block ``layer_index`` of a model whose
tokens are ``num_prefix_tokens`` prefix tokens followed by a ``grid_size`` patch grid.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Dict, Optional, Sequence, Tuple, Type, Union

import torch.nn as nn
from timm.layers import Attention, DiffAttention

from vcarepro.attention.vca import VisualContrastAttention, lambda_init_for_layer
from vcarepro.core.choices import ATTENTIONS, CONTROLS, FAMILY, POOLED_TOKEN_OPTION
from vcarepro.core.errors import BadInput

FLOOR = 1

# name -> "module:Class" under vcarepro.attention (imported on first use)
_LAYER_PATHS = {
    "vca": "vca:VisualContrastAttention",
    "agent": "agent:AgentAttention",
    "flatten": "flatten:FocusedLinearAttention",
    "inline": "inline:InLineAttention",
    "circulant": "circulant:CirculantAttention",
    "mhsa+dwc": "controls:MhsaLocalConv",
}
# timm's layers, which see (B, N, C) only and need no token layout
_TIMM_LAYERS = {"mhsa": Attention, "diff": DiffAttention}


def attention_class(name: str) -> Type[nn.Module]:
    """The attention class for ``name``; a clear error for an unknown one."""
    if name in _TIMM_LAYERS:
        return _TIMM_LAYERS[name]
    if name not in _LAYER_PATHS:
        raise BadInput(f"unknown attention {name!r}; choose one of {', '.join(map(repr, ATTENTIONS))}.")
    module, cls = _LAYER_PATHS[name].split(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), cls)


def attention_options(name: str) -> Tuple[str, ...]:
    """The layer's own knobs (``contrast_tokens``, ``agent_tokens``, ...): what ``options`` may hold."""
    if name in _TIMM_LAYERS:
        attention_class(name)  # unknown names fail the same way
        return ()
    parameters = inspect.signature(attention_class(name).__init__).parameters.values()
    return tuple(p.name for p in parameters if p.kind is p.KEYWORD_ONLY)  # the layout and timm's come in **common


def all_attention_options() -> frozenset:
    """Every option of every attention: what a model refuses unless its own attention takes it."""
    return frozenset(o for a in ATTENTIONS for o in attention_options(a))


def build_attention(
    name: str,
    dim: int,
    num_heads: int,
    *,
    grid_size: Union[int, Sequence[int]],
    num_prefix_tokens: int,
    layer_index: int = 0,
    qkv_bias: bool = False,
    qk_norm: bool = False,
    proj_bias: bool = True,
    attn_drop: float = 0.0,
    proj_drop: float = 0.0,
    norm_layer: Optional[Type[nn.Module]] = None,
    options: Optional[Dict[str, Any]] = None,
) -> nn.Module:
    """The attention ``name`` for one block; ``options`` are the layer's own knobs (none for timm's)."""
    cls = attention_class(name)
    options = dict(options or {})
    unknown = sorted(set(options) - set(attention_options(name)))
    if unknown:
        known = attention_options(name)
        raise BadInput(
            f"{', '.join(unknown)} {'is not an option' if len(unknown) == 1 else 'are not options'} of "
            f"attention {name!r}; " + (f"choose from {', '.join(known)}." if known else "it has none.")
        )
    common = dict(
        qkv_bias=qkv_bias,
        qk_norm=qk_norm,
        proj_bias=proj_bias,
        attn_drop=attn_drop,
        proj_drop=proj_drop,
        norm_layer=norm_layer,
    )
    if name in _TIMM_LAYERS:
        if name == "diff":  # lambda_init follows depth, as in the Differential Transformer
            return cls(dim, num_heads=num_heads, depth=layer_index, **common)
        return cls(dim, num_heads=num_heads, **common)
    return cls(
        dim,
        num_heads,
        grid_size=grid_size,
        num_prefix_tokens=num_prefix_tokens,
        layer_index=layer_index,
        **common,
        **options,
    )


__all__ = [
    "ATTENTIONS",
    "Attention",
    "CONTROLS",
    "DiffAttention",
    "FAMILY",
    "POOLED_TOKEN_OPTION",
    "VisualContrastAttention",
    "all_attention_options",
    "attention_class",
    "attention_options",
    "build_attention",
    "lambda_init_for_layer",
]
