"""Swin-T with Visual-Contrast Attention, timm-registered.

The baseline is timm's own ``swin_tiny_patch4_window7_224`` (28.3M parameters).

``vca_swin_tiny_patch4_window7_224`` is the lab's layout for Swin-T
(LeapLabTHU/Agent-Attention ``agent_transformer/cfgs/agent_swin_t.yaml``: ``WINDOW_SIZE: 56``,
``ATTN_TYPE: AAAB``, ``NUM: 9-16-49-49``; ``models/agent_swin.py``): in stages 1-3 every
block's window attention is replaced by ``VisualContrastAttention`` over the *whole* stage
grid (a 56 window at 224 covers 56/28/14, so no partition and no shift), with 9, 16 and 49
contrast tokens; stage 4 keeps Swin's own 7x7 window attention with its relative position
bias (the lab's 'B' stage uses window max(7, 56 // 8) = 7). Swin's hierarchy, patch
merging, MLPs and norms are timm's, unchanged.

``attn_layout`` (``A`` = global VCA, ``B`` = Swin's windows) and ``contrast_tokens`` (one
count or one per stage) are parameters: ``attn_layout="AAAA", contrast_tokens=49`` puts
VCA everywhere. ``window_size`` applies to the ``B`` stages. At other resolutions the ``A``
stages stay global (the lab fixes a 56 window, which would partition larger grids);
that is our choice.

How: timm skips windowing when a block's window is at least its feature map (window =
grid, shift = 0, no mask), so each ``A`` stage is built with its window equal to its grid
and each of its blocks' ``attn`` is swapped for VCA, which then receives the full
(B, H*W, C) sequence in row-major order, no prefix tokens. ``layer_index`` counts blocks
across the network, ``B`` blocks included.
"""
from __future__ import annotations

from typing import Any, List, Optional, Tuple

import torch
from timm.layers import to_2tuple
from timm.models import SwinTransformer, build_model_with_cfg, generate_default_cfgs, register_model
from timm.models.swin_transformer import _cfg as _swin_cfg
from timm.models.swin_transformer import calc_stage_window_sizes

from ..attention import VisualContrastAttention
from ..attention.vca import patch_grid
from .placement import ContrastTokens, attention_layout, per_stage
from vcarepro.errors import BadInput

# pipeline arch name -> {attention: timm name}; "mhsa" names the backbone's own attention
MODEL_NAMES = {"swin_tiny": {"mhsa": "swin_tiny_patch4_window7_224", "vca": "vca_swin_tiny_patch4_window7_224"}}
# The lab's placement in Swin-T (cfgs/agent_swin_t.yaml).
LAB_SWIN_TINY_VCA = dict(attn_layout="AAAB", contrast_tokens=(9, 16, 49, 49))


class SwinVisualContrastAttention(VisualContrastAttention):
    """VCA with the call signature of timm's ``WindowAttention`` (``mask=``), on the whole stage grid."""

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:  # type: ignore[override]
        if mask is not None:
            raise BadInput("global VCA got a shifted-window mask; the block's window must cover its whole grid.")
        return super().forward(x)

    def set_window_size(self, window_size: Tuple[int, int]) -> None:
        # timm calls this on a resize; the "window" is the whole stage grid here.
        self.set_grid_size(window_size)


class VcaSwinTransformer(SwinTransformer):
    """timm's ``SwinTransformer`` with global Visual-Contrast Attention in the ``A`` stages of ``attn_layout``."""

    def __init__(
        self,
        *,
        attn_layout: str = "AAAA",
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
            raise BadInput("VCA models need a fixed token grid; build the model with the img_size you feed it.")
        if kwargs.get("always_partition"):
            raise BadInput("global VCA bypasses window partitioning; do not pass always_partition=True.")
        depths = kwargs.get("depths", (2, 2, 6, 2))
        uses_vca = attention_layout(attn_layout, len(depths))
        own_window = kwargs.pop("window_size", 7)
        if not (isinstance(own_window, int) or (len(own_window) == 2 and all(isinstance(v, int) for v in own_window))):
            raise BadInput(f"window_size={own_window!r}: give one int or (h, w) for Swin's own (B) stages; the VCA "
                             f"(A) stages see their whole grid.")
        own_window = to_2tuple(own_window)
        grids = _stage_grids(kwargs.get("img_size", 224), kwargs.get("patch_size", 4), len(depths))
        kwargs["window_size"] = [grid if vca else own_window for grid, vca in zip(grids, uses_vca)]
        super().__init__(weight_init="skip", **kwargs)
        self.uses_vca = uses_vca
        tokens_per_stage = per_stage(contrast_tokens, len(self.layers))
        layer_index = 0
        for stage, tokens, vca in zip(self.layers, tokens_per_stage, self.uses_vca):
            if not vca:  # Swin's own window attention stays
                layer_index += len(stage.blocks)
                continue
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
            raise BadInput("the VCA stages have no windows; change img_size / patch_size only.")
        img_size = img_size if img_size is not None else self.patch_embed.img_size
        patch = patch_size if patch_size is not None else self.patch_embed.patch_size
        grids = _stage_grids(img_size, patch, len(self.layers))
        # Swin's own stages keep timm's rule (the window scales with the grid); VCA stages see the whole grid
        patch_grid_new = tuple(g // p for g, p in zip(patch_grid(img_size), patch_grid(patch)))
        own = calc_stage_window_sizes(patch_grid_new, self._ref_window_sizes, self._ref_grid_size)
        super().set_input_size(img_size=img_size, patch_size=patch_size,
                               window_size=[grid if vca else window
                                            for grid, window, vca in zip(grids, own, self.uses_vca)])


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
    """Swin-T (timm's shapes) in the lab's layout: global VCA in stages 1-3 (9-16-49 tokens), Swin's windows in 4."""
    if pretrained:
        raise BadInput("no pretrained weights are published for vca_swin_tiny_patch4_window7_224; "
                         "create it with pretrained=False.")
    model_args = dict(patch_size=4, embed_dim=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24), **LAB_SWIN_TINY_VCA)
    return build_model_with_cfg(VcaSwinTransformer, "vca_swin_tiny_patch4_window7_224", pretrained=False,
                                **dict(model_args, **kwargs))
