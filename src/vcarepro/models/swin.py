"""Swin-T with Visual-Contrast Attention (or another attention of the family), timm-registered.

The baseline is timm's own ``swin_tiny_patch4_window7_224``. ``vca_swin_tiny_patch4_window7_224``
is the lab's ``AAAB`` layout (VCA over the whole grid in stages 1-3, Swin's 7x7 windows in
stage 4) and ``lab_swin_tiny_patch4_window7_224`` takes ``compared_attention=`` any attention
of the family; docs/vca.md#hierarchical-backbones-the-labs-layouts gives their sources.
At other resolutions the ``A`` stages stay global (the lab's fixed 56 window would
partition larger grids); that is our choice.

timm skips windowing when a window covers its feature map, so each ``A`` stage is built
with window = grid and its blocks become ``WholeGridBlock``: timm's block with the
compared attention (made by ``build_attention``) receiving the whole row-major sequence.
``layer_index`` counts blocks across the network, ``B`` blocks included.
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

import torch
from timm.layers import to_2tuple
from timm.models import SwinTransformer, generate_default_cfgs, register_model
from timm.models.swin_transformer import SwinTransformerBlock, calc_stage_window_sizes
from timm.models.swin_transformer import _cfg as _swin_cfg

from vcarepro.attention import attention_options, build_attention
from vcarepro.attention.grid import patch_grid
from vcarepro.core.errors import BadInput
from vcarepro.models.placement import (
    LAB_MODEL_ATTENTIONS,
    attention_layout,
    build_hierarchical,
    hierarchical_cfg,
    set_stage_grids,
    stage_options,
)

# The lab's layout with any attention of the family (compared_attention=...).
LAB_MODEL = "lab_swin_tiny_patch4_window7_224"
# pipeline arch name -> {attention: timm name}; "mhsa" names the backbone's own attention
MODEL_NAMES = {
    "swin_tiny": {
        "mhsa": "swin_tiny_patch4_window7_224",
        "vca": "vca_swin_tiny_patch4_window7_224",
        **{a: LAB_MODEL for a in LAB_MODEL_ATTENTIONS},
    }
}
# The lab's placement in Swin-T (cfgs/agent_swin_t.yaml: ATTN_TYPE AAAB, NUM 9-16-49-49 = placement.LAB_STAGE_TOKENS).
LAB_SWIN_TINY_LAYOUT = "AAAB"


class WholeGridBlock(SwinTransformerBlock):
    """timm's Swin block whose attention sees the whole stage grid: no partition, no shift, no mask.

    The attention is the compared layer itself, called on (B, H*W, C) as in a plain ViT, so torch.fx finds its
    module's no-trace functions and its state dict is the layer's own. The block's state is timm's, unchanged.
    """

    def _attn(self, x: torch.Tensor) -> torch.Tensor:
        B, H, W, C = x.shape
        return self.attn(x.reshape(B, H * W, C)).reshape(B, H, W, C)

    def set_input_size(
        self, feat_size: Tuple[int, int], window_size: Tuple[int, int], always_partition: Optional[bool] = None
    ) -> None:
        # the "window" is the whole stage grid (timm's own window sizes are ignored here)
        self.attn.set_grid_size(feat_size)
        self.input_resolution = tuple(feat_size)
        self.window_size, self.shift_size = tuple(feat_size), (0, 0)
        self.window_area = feat_size[0] * feat_size[1]


class VcaSwinTransformer(SwinTransformer):
    """timm's ``SwinTransformer`` with a global compared attention (VCA by default) in the ``A`` stages of
    ``attn_layout``. Keyword arguments that are options of ``compared_attention`` go to it, the rest to timm
    (with ``compared_attention="circulant"``, ``head_dim`` is Circulant's)."""

    def __init__(
        self,
        *,
        attn_layout: str = "AAAA",
        compared_attention: str = "vca",
        weight_init: str = "",
        **kwargs: Any,
    ) -> None:
        own = set(attention_options(compared_attention)) | {"contrast_tokens"}  # stage_options refuses a stray one
        attention_kwargs = {k: kwargs.pop(k) for k in list(kwargs) if k in own}
        if kwargs.get("dynamic_img_size") or kwargs.get("strict_img_size") is False:
            raise BadInput(
                f"{compared_attention} models need a fixed token grid; build the model with the img_size you feed it."
            )
        if kwargs.get("always_partition"):
            raise BadInput(
                f"global {compared_attention} bypasses window partitioning; do not pass always_partition=True."
            )
        depths = kwargs.get("depths", (2, 2, 6, 2))
        uses_vca = attention_layout(attn_layout, len(depths))
        options_per_stage = stage_options(compared_attention, attention_kwargs, len(depths))
        own_window = kwargs.pop("window_size", 7)
        if not (isinstance(own_window, int) or (len(own_window) == 2 and all(isinstance(v, int) for v in own_window))):
            raise BadInput(
                f"window_size={own_window!r}: give one int or (h, w) for Swin's own (B) stages; the VCA "
                f"(A) stages see their whole grid."
            )
        own_window = to_2tuple(own_window)
        grids = _stage_grids(kwargs.get("img_size", 224), kwargs.get("patch_size", 4), len(depths))
        kwargs["window_size"] = [grid if vca else own_window for grid, vca in zip(grids, uses_vca)]
        super().__init__(weight_init="skip", **kwargs)
        self.uses_vca = uses_vca  # whether each stage holds the compared attention
        self.compared_attention = compared_attention
        layer_index = 0
        for stage, options, vca in zip(self.layers, options_per_stage, self.uses_vca):
            if not vca:  # Swin's own window attention stays
                layer_index += len(stage.blocks)
                continue
            for block in stage.blocks:
                window = block.attn
                if block.window_size != tuple(stage.output_resolution) or any(block.shift_size):
                    raise AssertionError("timm did not collapse the window to the stage grid")  # guard a timm change
                attn = build_attention(
                    compared_attention,
                    window.qkv.in_features,
                    window.num_heads,
                    grid_size=stage.output_resolution,
                    num_prefix_tokens=0,
                    layer_index=layer_index,
                    qkv_bias=window.qkv.bias is not None,
                    attn_drop=window.attn_drop.p,
                    proj_drop=window.proj_drop.p,
                    options=options,
                )
                block.__class__ = WholeGridBlock  # adds methods only: same state, same init
                block.attn = attn
                layer_index += 1
        self.weight_init_mode = "reset" if weight_init == "skip" else weight_init
        if weight_init != "skip":
            self.init_weights(needs_reset=False)

    def set_input_size(
        self, img_size=None, patch_size=None, window_size=None, window_ratio=None, always_partition=None
    ) -> None:
        if window_size is not None or window_ratio is not None or always_partition:
            raise BadInput("the compared attention's stages have no windows; change img_size / patch_size only.")
        img_size = img_size if img_size is not None else self.patch_embed.img_size
        patch = patch_size if patch_size is not None else self.patch_embed.patch_size
        grids = _stage_grids(img_size, patch, len(self.layers))
        # all or nothing: the compared attentions check their new grids first (a contrast grid larger than a stage
        # grid is a BadInput that leaves the model as it was); timm then resizes every stage
        set_stage_grids(
            [[block.attn for block in stage.blocks] if vca else [] for stage, vca in zip(self.layers, self.uses_vca)],
            grids,
        )
        # Swin's own stages keep timm's rule (the window scales with the grid); VCA stages see the whole grid
        patch_grid_new = tuple(g // p for g, p in zip(patch_grid(img_size), patch_grid(patch)))
        own = calc_stage_window_sizes(patch_grid_new, self._ref_window_sizes, self._ref_grid_size)
        super().set_input_size(
            img_size=img_size,
            patch_size=patch_size,
            window_size=[grid if vca else window for grid, window, vca in zip(grids, own, self.uses_vca)],
        )


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


# Eval as timm's Swin (its _cfg: crop 0.9, bicubic, head.fc); no weights are published for these builds.
default_cfgs = generate_default_cfgs(
    {name: hierarchical_cfg(**_swin_cfg()) for name in ("vca_swin_tiny_patch4_window7_224", LAB_MODEL)}
)
SWIN_TINY_SHAPE = dict(patch_size=4, embed_dim=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24))


@register_model
def vca_swin_tiny_patch4_window7_224(pretrained: bool = False, **kwargs: Any) -> VcaSwinTransformer:
    """Swin-T (timm's shapes) in the lab's layout: global VCA in stages 1-3 (9-16-49 tokens), Swin's windows in 4."""
    return build_hierarchical(
        VcaSwinTransformer,
        "vca_swin_tiny_patch4_window7_224",
        pretrained,
        layout=LAB_SWIN_TINY_LAYOUT,
        compared_attention="vca",
        defaults=SWIN_TINY_SHAPE,
        kwargs=kwargs,
    )


@register_model
def lab_swin_tiny_patch4_window7_224(pretrained: bool = False, **kwargs: Any) -> VcaSwinTransformer:
    """Swin-T in the lab's layout with ``compared_attention=`` global in stages 1-3, Swin's windows in 4.

    ``compared_attention="agent"`` is the lab's Agent-Swin-T (agent_swin.py): 9-16-49 agent tokens.
    """
    return build_hierarchical(
        VcaSwinTransformer, LAB_MODEL, pretrained, layout=LAB_SWIN_TINY_LAYOUT, defaults=SWIN_TINY_SHAPE, kwargs=kwargs
    )
