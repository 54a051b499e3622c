"""Swin-T with Visual-Contrast Attention, timm-registered.

The baseline is timm's own ``swin_tiny_patch4_window7_224`` (28.3M parameters).

``vca_swin_tiny_patch4_window7_224`` is timm's ``SwinTransformer`` whose window
attention is replaced by ``VisualContrastAttention`` applied *globally*: each
block's VCA sees the whole stage grid (56/28/14/7 at 224), with no window
partition and no shift. This is our choice; the paper does not say how VCA
enters Swin. Applying VCA inside each 7x7 window would leave only 1x1 or 7x7
contrast grids (7 is prime, and the contrast grid must divide the pooled grid),
i.e. either a single contrast token or no pooling at all, and a window of 49
tokens gains nothing from linear attention. Global VCA keeps the paper's premise
(linear-cost global attention through a few contrast tokens) and Swin's
hierarchy, patch merging, MLPs and norms unchanged.

How: timm itself skips windowing when a block's window is at least its feature
map (window = grid, shift = 0, no mask), so the model is built with each stage's
window equal to its grid and each block's ``attn`` is swapped for VCA (which
then receives the full (B, H*W, C) sequence in row-major order, no prefix
tokens). ``contrast_tokens`` is one value for all stages (default 7x7: pooling
windows 8/4/2/1 at 224) or one per stage. ``layer_index`` counts blocks across
the network.
"""
from __future__ import annotations

from typing import Any, List, Optional, Tuple

import torch
from timm.models import SwinTransformer, build_model_with_cfg, generate_default_cfgs, register_model
from timm.models.swin_transformer import _cfg as _swin_cfg

from ..attention import VisualContrastAttention
from ..attention.vca import patch_grid
from .pvt import ContrastTokens, _per_stage

# pipeline arch name -> (baseline timm name, VCA timm name)
MODEL_NAMES = {"swin_tiny": ("swin_tiny_patch4_window7_224", "vca_swin_tiny_patch4_window7_224")}


class SwinVisualContrastAttention(VisualContrastAttention):
    """VCA with the call signature of timm's ``WindowAttention`` (``mask=``), on the whole stage grid."""

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:  # type: ignore[override]
        if mask is not None:
            raise ValueError("global VCA got a shifted-window mask; the block's window must cover its whole grid.")
        return super().forward(x)

    def set_window_size(self, window_size: Tuple[int, int]) -> None:
        # timm calls this on a resize; the "window" is the whole stage grid here.
        self.set_grid_size(window_size)


class VcaSwinTransformer(SwinTransformer):
    """timm's ``SwinTransformer`` with global Visual-Contrast Attention in every block."""

    def __init__(
        self,
        *,
        contrast_tokens: ContrastTokens = 49,
        stage1: str = "vca",
        stage2: str = "vca",
        tokens_pos: str = "pool+emb",
        tokens_neg: str = "pool+emb",
        stage2_softmax: str = "joint",
        local_conv: bool = True,
        weight_init: str = "",
        **kwargs: Any,
    ) -> None:
        if kwargs.get("dynamic_img_size") or kwargs.get("strict_img_size") is False:
            raise ValueError("VCA models need a fixed token grid; build the model with the img_size you feed it.")
        if kwargs.get("always_partition"):
            raise ValueError("global VCA bypasses window partitioning; do not pass always_partition=True.")
        if "window_size" in kwargs:
            raise ValueError("global VCA has no windows (each block sees its whole stage grid); drop window_size.")
        depths = kwargs.get("depths", (2, 2, 6, 2))
        kwargs["window_size"] = _stage_grids(kwargs.get("img_size", 224), kwargs.get("patch_size", 4), len(depths))
        super().__init__(weight_init="skip", **kwargs)
        per_stage = _per_stage(contrast_tokens, len(self.layers))
        layer_index = 0
        for stage, tokens in zip(self.layers, per_stage):
            for block in stage.blocks:
                window = block.attn
                if block.window_size != tuple(stage.output_resolution) or any(block.shift_size):
                    raise AssertionError("timm did not collapse the window to the stage grid")  # guard a timm change
                block.attn = SwinVisualContrastAttention(
                    window.qkv.in_features,
                    window.num_heads,
                    grid_size=stage.output_resolution,
                    num_prefix_tokens=0,
                    contrast_tokens=tokens,
                    layer_index=layer_index,
                    stage1=stage1,
                    stage2=stage2,
                    tokens_pos=tokens_pos,
                    tokens_neg=tokens_neg,
                    stage2_softmax=stage2_softmax,
                    local_conv=local_conv,
                    qkv_bias=window.qkv.bias is not None,
                    attn_drop=window.attn_drop.p,
                    proj_drop=window.proj_drop.p,
                )
                layer_index += 1
        self.weight_init_mode = "reset" if weight_init == "skip" else weight_init
        if weight_init != "skip":
            self.init_weights(needs_reset=False)

    def set_input_size(self, img_size=None, patch_size=None, window_size=None, window_ratio=None,
                       always_partition=None) -> None:
        if window_size is not None or window_ratio is not None or always_partition:
            raise ValueError("global VCA has no windows; change img_size / patch_size only.")
        img_size = img_size if img_size is not None else self.patch_embed.img_size
        patch = patch_size if patch_size is not None else self.patch_embed.patch_size
        super().set_input_size(img_size=img_size, patch_size=patch_size,
                               window_size=_stage_grids(img_size, patch, len(self.layers)))


def _stage_grids(img_size, patch_size, num_stages: int) -> List[Tuple[int, int]]:
    """Each stage's feature grid: the patch grid, then halved by every patch merging."""
    H, W = patch_grid(img_size)
    ph, pw = patch_grid(patch_size)
    grid, grids = (H // ph, W // pw), []
    for i in range(num_stages):
        if i:
            grid = ((grid[0] + 1) // 2, (grid[1] + 1) // 2)
        grids.append(grid)
    return grids


default_cfgs = generate_default_cfgs({
    # No weights are published for this build (no url / hf_hub_id); eval as timm's Swin.
    "vca_swin_tiny_patch4_window7_224": _swin_cfg(),
})


@register_model
def vca_swin_tiny_patch4_window7_224(pretrained: bool = False, **kwargs: Any) -> VcaSwinTransformer:
    """Swin-T (timm's shapes) with global Visual-Contrast Attention in every block."""
    if pretrained:
        raise ValueError("no pretrained weights are published for vca_swin_tiny_patch4_window7_224; "
                         "create it with pretrained=False.")
    model_args = dict(patch_size=4, embed_dim=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24))
    return build_model_with_cfg(VcaSwinTransformer, "vca_swin_tiny_patch4_window7_224", pretrained=False,
                                **dict(model_args, **kwargs))
