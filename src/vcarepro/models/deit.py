"""DeiT backbones with Visual-Contrast Attention (and the differential-attention baseline), timm-registered.

The baseline is timm's own ``deit_*_patch16_224``. ``vca_deit_*`` is the same
network with every block's ``Attention`` replaced by ``VisualContrastAttention``
(layer index = block index, so lambda_init follows depth). ``diff_deit_*`` uses
timm's ``DiffAttention`` in every block.

They are ordinary timm models (tests/test_timm_vit.py): a complete pretrained cfg, features_only /
forward_intermediates, torch.fx tracing, TorchScript (all but FLatten), set_input_size, layer-wise lr
decay, and ``pretrained=True`` with ``pretrained_cfg_overlay=dict(file=...)`` for weights a user trained.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Dict, Optional, Tuple

import torch
import torch.nn as nn
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.layers import to_2tuple
from timm.models import VisionTransformer, build_model_with_cfg, generate_default_cfgs, register_model
from timm.models._builder import resolve_pretrained_cfg

from vcarepro.attention import attention_options, build_attention
from vcarepro.core.errors import BadInput

# Knobs of VisualContrastAttention that a model accepts as keyword arguments.
VCA_OPTIONS = attention_options("vca")


class SwappedAttentionVisionTransformer(VisionTransformer):
    """timm's ``VisionTransformer`` whose blocks use another attention (any of ``vcarepro.attention``).

    Everything but the attention is timm's: the blocks are built as usual, then each
    ``Attention`` is swapped for the named layer with the same projection settings, the
    block index as its ``layer_index`` (VCA's lambda_init follows depth), and timm's ViT
    init runs once over the finished network. ``**options`` not taken by timm's ViT are
    the attention's own knobs (``contrast_tokens``, ``agent_tokens``, ...).
    """

    def __init__(self, *, attention: str, weight_init: str = "", **kwargs: Any) -> None:
        own = attention_options(attention)
        options = {k: kwargs.pop(k) for k in list(kwargs) if k in own}
        if kwargs.get("dynamic_img_size"):
            raise BadInput(
                f"{attention} models need a fixed token grid; build the model with the img_size you feed it "
                "(or call set_input_size) instead of dynamic_img_size=True."
            )
        if kwargs.get("attn_layer") not in (None, "attn"):
            raise BadInput(f"a {attention} model sets its own attention; do not pass attn_layer.")
        super().__init__(weight_init="skip", **kwargs)
        self.attention = attention
        for index, block in enumerate(self.blocks):
            mhsa = block.attn
            qk_norm = not isinstance(mhsa.q_norm, nn.Identity)
            block.attn = build_attention(
                attention,
                self.embed_dim,
                mhsa.num_heads,
                grid_size=self.patch_embed.grid_size,
                num_prefix_tokens=self.num_prefix_tokens,
                layer_index=index,
                qkv_bias=mhsa.qkv.bias is not None,
                qk_norm=qk_norm,
                proj_bias=mhsa.proj.bias is not None,
                attn_drop=mhsa.attn_drop.p,
                proj_drop=mhsa.proj_drop.p,
                norm_layer=type(mhsa.q_norm) if qk_norm else None,
                options=options,
            )
        self.weight_init_mode = "reset" if weight_init == "skip" else weight_init
        if weight_init != "skip":
            self.init_weights(needs_reset=False)

    def set_input_size(
        self,
        img_size: Optional[Tuple[int, int]] = None,
        patch_size: Optional[Tuple[int, int]] = None,
    ) -> None:
        # The attentions first: one that cannot work at the new grid refuses before anything has moved.
        new_img = to_2tuple(img_size) if img_size is not None else self.patch_embed.img_size
        new_patch = to_2tuple(patch_size) if patch_size is not None else self.patch_embed.patch_size
        grid = (new_img[0] // new_patch[0], new_img[1] // new_patch[1])
        for block in self.blocks:
            if hasattr(block.attn, "set_grid_size"):
                block.attn.set_grid_size(grid)
        super().set_input_size(img_size=img_size, patch_size=patch_size)


class VcaVisionTransformer(SwappedAttentionVisionTransformer):
    """timm's ``VisionTransformer`` whose blocks use Visual-Contrast Attention."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(attention="vca", **kwargs)


def _cfg(**kwargs: Any) -> Dict[str, Any]:
    # No published VCA weights exist, so no url / hf_hub_id: pretrained=True needs a file the caller gives
    # (pretrained_cfg_overlay=dict(file=...)). Evaluation follows DeiT: resize 256, center crop 224
    # (crop_pct 0.875), bicubic. The license is the project's (pyproject.toml: MIT), for any weights it trains.
    return {
        "url": "",
        "num_classes": 1000,
        "input_size": (3, 224, 224),
        "pool_size": None,
        "crop_pct": 0.875,
        "interpolation": "bicubic",
        "fixed_input_size": True,
        "mean": IMAGENET_DEFAULT_MEAN,
        "std": IMAGENET_DEFAULT_STD,
        "first_conv": "patch_embed.proj",
        "classifier": "head",
        "license": "mit",
        "paper_ids": "arXiv:2511.00833",
        "paper_name": "Linear Differential Vision Transformer: Learning Visual Contrasts via Pairwise Differentials",
        "notes": (
            "no pretrained weights are published; train them with this pipeline (dvc repro) and load them "
            "with pretrained=True, pretrained_cfg_overlay=dict(file='model.safetensors')",
        ),
        **kwargs,
    }


# the baseline's own paper (the drop-ins keep VCA's: they are this project's comparison)
DIFF_PAPER = dict(paper_ids="arXiv:2410.05258", paper_name="Differential Transformer")

default_cfgs = generate_default_cfgs(
    {
        "vca_deit_tiny_patch16_224": _cfg(),
        "vca_deit_small_patch16_224": _cfg(),
        "diff_deit_tiny_patch16_224": _cfg(**DIFF_PAPER),
        "diff_deit_small_patch16_224": _cfg(**DIFF_PAPER),
        "dropin_deit_tiny_patch16_224": _cfg(),
        "dropin_deit_small_patch16_224": _cfg(),
    }
)

# A drop-in built without attention= is DeiT itself (timm builds every registered model from its name alone).
DROPIN_DEFAULT = dict(attention="mhsa")

# Model shapes as in DeiT (and timm's deit_*_patch16_224).
DEIT_SHAPES = {
    "tiny": dict(patch_size=16, embed_dim=192, depth=12, num_heads=3),
    "small": dict(patch_size=16, embed_dim=384, depth=12, num_heads=6),
}


def _has_weights_source(variant: str, kwargs: Dict[str, Any]) -> bool:
    """Whether the resolved pretrained cfg names weights timm can load (a file, a state dict, a url or a hub id)."""
    cfg = resolve_pretrained_cfg(
        variant,
        pretrained_cfg=kwargs.get("pretrained_cfg"),
        pretrained_cfg_overlay=kwargs.get("pretrained_cfg_overlay"),
    )
    return any(getattr(cfg, field, None) for field in ("file", "state_dict", "url", "hf_hub_id"))


def _build(model_cls, variant: str, pretrained: bool, **kwargs: Any) -> VisionTransformer:
    if pretrained and not _has_weights_source(variant, kwargs):
        raise BadInput(
            f"no pretrained weights are published for {variant}; pass your own with "
            f"pretrained_cfg_overlay=dict(file='model.safetensors'), or create it with pretrained=False."
        )
    # timm's factory kwargs device= / dtype= reach timm's layers; our attention layers join them: built under the
    # device, cast to the dtype
    device, dtype = kwargs.get("device"), kwargs.get("dtype")
    with torch.device(device) if device is not None else nullcontext():
        model = build_model_with_cfg(
            model_cls,
            variant,
            pretrained=pretrained,
            feature_cfg=dict(out_indices=kwargs.pop("out_indices", 3), feature_cls="getter"),
            **kwargs,
        )
    return model if dtype is None else model.to(dtype=dtype)


@register_model
def vca_deit_tiny_patch16_224(pretrained: bool = False, **kwargs: Any) -> VcaVisionTransformer:
    """DeiT-Tiny with Visual-Contrast Attention in every block."""
    return _build(VcaVisionTransformer, "vca_deit_tiny_patch16_224", pretrained, **{**DEIT_SHAPES["tiny"], **kwargs})


@register_model
def vca_deit_small_patch16_224(pretrained: bool = False, **kwargs: Any) -> VcaVisionTransformer:
    """DeiT-Small with Visual-Contrast Attention in every block."""
    return _build(VcaVisionTransformer, "vca_deit_small_patch16_224", pretrained, **{**DEIT_SHAPES["small"], **kwargs})


@register_model
def dropin_deit_tiny_patch16_224(pretrained: bool = False, **kwargs: Any) -> SwappedAttentionVisionTransformer:
    """DeiT-Tiny exactly, but every block's attention is ``attention=`` (any of vcarepro.attention; ``"mhsa"``,
    DeiT itself, when not given).

    The like-for-like comparison: 3 heads, class token, DeiT's head. A method's published DeiT
    model may change more than its attention (InLine's 6 heads, Circulant's missing class token);
    those are registered as ``<method>_deit_tiny_patch16_224`` (models/family.py).
    """
    return _build(
        SwappedAttentionVisionTransformer,
        "dropin_deit_tiny_patch16_224",
        pretrained,
        **{**DEIT_SHAPES["tiny"], **DROPIN_DEFAULT, **kwargs},
    )


@register_model
def dropin_deit_small_patch16_224(pretrained: bool = False, **kwargs: Any) -> SwappedAttentionVisionTransformer:
    """DeiT-Small exactly, but every block's attention is ``attention=`` (any of vcarepro.attention)."""
    return _build(
        SwappedAttentionVisionTransformer,
        "dropin_deit_small_patch16_224",
        pretrained,
        **{**DEIT_SHAPES["small"], **DROPIN_DEFAULT, **kwargs},
    )


@register_model
def diff_deit_tiny_patch16_224(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """DeiT-Tiny with timm's DiffAttention (Differential Transformer) in every block."""
    return _build(
        VisionTransformer,
        "diff_deit_tiny_patch16_224",
        pretrained,
        **{**DEIT_SHAPES["tiny"], "attn_layer": "diff", **kwargs},
    )


@register_model
def diff_deit_small_patch16_224(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """DeiT-Small with timm's DiffAttention (Differential Transformer) in every block."""
    return _build(
        VisionTransformer,
        "diff_deit_small_patch16_224",
        pretrained,
        **{**DEIT_SHAPES["small"], "attn_layer": "diff", **kwargs},
    )
