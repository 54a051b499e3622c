"""DeiT backbones with Visual-Contrast Attention (and the differential-attention baseline), timm-registered.

The baseline is timm's own ``deit_*_patch16_224``. ``vca_deit_*`` is the same
network with every block's ``Attention`` replaced by ``VisualContrastAttention``
(layer index = block index, so lambda_init follows depth). ``diff_deit_*`` uses
timm's ``DiffAttention`` in every block.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple, Union

import torch.nn as nn
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.models import VisionTransformer, build_model_with_cfg, generate_default_cfgs, register_model

from ..attention import VisualContrastAttention
from vcarepro.errors import BadInput

# Knobs of VisualContrastAttention that a model accepts as keyword arguments.
VCA_OPTIONS = ("contrast_tokens", "stage1", "stage2", "tokens_pos", "tokens_neg", "stage2_softmax", "local_conv")


class VcaVisionTransformer(VisionTransformer):
    """timm's ``VisionTransformer`` whose blocks use Visual-Contrast Attention.

    Everything but the attention is timm's: the blocks are built as usual, then
    each ``Attention`` is swapped for a VCA layer with the same projection
    settings, and timm's ViT init runs once over the finished network.
    """

    def __init__(
        self,
        *,
        contrast_tokens: Union[int, Sequence[int]] = 49,
        stage1: str = "vca",
        stage2: str = "vca",
        tokens_pos: str = "pool+emb",
        tokens_neg: str = "pool+emb",
        stage2_softmax: str = "joint",
        local_conv: bool = True,
        weight_init: str = "",
        **kwargs: Any,
    ) -> None:
        if kwargs.get("dynamic_img_size"):
            raise BadInput(
                "VCA models need a fixed token grid; build the model with the img_size you feed it "
                "(or call set_input_size) instead of dynamic_img_size=True."
            )
        if kwargs.get("attn_layer") not in (None, "attn"):
            raise BadInput("a VCA model sets its own attention; do not pass attn_layer.")
        super().__init__(weight_init="skip", **kwargs)
        for index, block in enumerate(self.blocks):
            mhsa = block.attn
            qk_norm = not isinstance(mhsa.q_norm, nn.Identity)
            block.attn = VisualContrastAttention(
                self.embed_dim,
                mhsa.num_heads,
                grid_size=self.patch_embed.grid_size,
                num_prefix_tokens=self.num_prefix_tokens,
                contrast_tokens=contrast_tokens,
                layer_index=index,
                stage1=stage1,
                stage2=stage2,
                tokens_pos=tokens_pos,
                tokens_neg=tokens_neg,
                stage2_softmax=stage2_softmax,
                local_conv=local_conv,
                qkv_bias=mhsa.qkv.bias is not None,
                qk_norm=qk_norm,
                proj_bias=mhsa.proj.bias is not None,
                attn_drop=mhsa.attn_drop.p,
                proj_drop=mhsa.proj_drop.p,
                norm_layer=type(mhsa.q_norm) if qk_norm else None,
            )
        self.weight_init_mode = "reset" if weight_init == "skip" else weight_init
        if weight_init != "skip":
            self.init_weights(needs_reset=False)

    def set_input_size(
        self,
        img_size: Optional[Tuple[int, int]] = None,
        patch_size: Optional[Tuple[int, int]] = None,
    ) -> None:
        super().set_input_size(img_size=img_size, patch_size=patch_size)
        for block in self.blocks:
            block.attn.set_grid_size(self.patch_embed.grid_size)


def _cfg(**kwargs: Any) -> Dict[str, Any]:
    # No published VCA weights exist, so no url / hf_hub_id. Evaluation follows DeiT:
    # resize 256, center crop 224 (crop_pct 0.875), bicubic.
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
        **kwargs,
    }


default_cfgs = generate_default_cfgs({
    "vca_deit_tiny_patch16_224": _cfg(),
    "vca_deit_small_patch16_224": _cfg(),
    "diff_deit_tiny_patch16_224": _cfg(),
    "diff_deit_small_patch16_224": _cfg(),
})

# Model shapes as in DeiT (and timm's deit_*_patch16_224).
DEIT_SHAPES = {
    "tiny": dict(patch_size=16, embed_dim=192, depth=12, num_heads=3),
    "small": dict(patch_size=16, embed_dim=384, depth=12, num_heads=6),
}


def _build(model_cls, variant: str, pretrained: bool, **kwargs: Any) -> VisionTransformer:
    if pretrained:
        raise BadInput(
            f"no pretrained weights are published for {variant}; create it with pretrained=False "
            f"and train it (dvc repro), or load a checkpoint with checkpoint_path=."
        )
    return build_model_with_cfg(
        model_cls, variant, pretrained=False,
        feature_cfg=dict(out_indices=kwargs.pop("out_indices", 3), feature_cls="getter"),
        **kwargs,
    )


@register_model
def vca_deit_tiny_patch16_224(pretrained: bool = False, **kwargs: Any) -> VcaVisionTransformer:
    """DeiT-Tiny with Visual-Contrast Attention in every block."""
    return _build(VcaVisionTransformer, "vca_deit_tiny_patch16_224", pretrained, **{**DEIT_SHAPES["tiny"], **kwargs})


@register_model
def vca_deit_small_patch16_224(pretrained: bool = False, **kwargs: Any) -> VcaVisionTransformer:
    """DeiT-Small with Visual-Contrast Attention in every block."""
    return _build(VcaVisionTransformer, "vca_deit_small_patch16_224", pretrained, **{**DEIT_SHAPES["small"], **kwargs})


@register_model
def diff_deit_tiny_patch16_224(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """DeiT-Tiny with timm's DiffAttention (Differential Transformer) in every block."""
    return _build(VisionTransformer, "diff_deit_tiny_patch16_224", pretrained,
                  **{**DEIT_SHAPES["tiny"], "attn_layer": "diff", **kwargs})


@register_model
def diff_deit_small_patch16_224(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """DeiT-Small with timm's DiffAttention (Differential Transformer) in every block."""
    return _build(VisionTransformer, "diff_deit_small_patch16_224", pretrained,
                  **{**DEIT_SHAPES["small"], "attn_layer": "diff", **kwargs})
