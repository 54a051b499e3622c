"""The attention family's DeiT models as their authors published them, timm-registered.

The pipeline compares attentions like for like (``dropin_deit_*``, models/deit.py); a
method's published DeiT model can change more than the attention, so those models are
registered here under the method's name to check their parameters and FLOPs against the
published rows (tests/test_family.py; docs/family.md's table says what each changes,
data/paper_reference.yaml ``family`` holds the numbers).
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn as nn
from timm.models import generate_default_cfgs, register_model
from timm.models.vision_transformer import Block

from vcarepro.models.deit import DEIT_SHAPES, SwappedAttentionVisionTransformer, _build, _cfg


class ConvPositionBlock(Block):
    """timm's ``Block`` with Circulant Attention's convolutional position encoding in front.

    x = x + dwconv3x3(x) on the patch grid (ca_deit.py ``Block.cpe``: a biased depthwise 3x3
    convolution, applied before ``norm1``); prefix tokens pass unchanged.
    """

    def __init__(self, dim: int, *args: Any, **kwargs: Any) -> None:
        super().__init__(dim, *args, **kwargs)
        self.cpe = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)

    def forward(
        self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None, is_causal: bool = False
    ) -> torch.Tensor:
        B, N, C = x.shape
        H, W = self.attn.grid_size  # the swapped-in attention knows the token layout
        P = self.attn.num_prefix_tokens
        grid = x[:, P:].transpose(1, 2).reshape(B, C, H, W)
        x = torch.cat([x[:, :P], x[:, P:] + self.cpe(grid).flatten(2).transpose(1, 2)], dim=1)
        # timm's Block.forward, written out (TorchScript has no super())
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x), attn_mask=attn_mask, is_causal=is_causal)))
        x = x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
        return x


# ca_deit.py VisionTransformer: no class token, no position embedding, norm then mean, bias-free qkv.
CIRCULANT_BACKBONE = dict(
    class_token=False, pos_embed="none", global_pool="avg", fc_norm=False, qkv_bias=False, block_fn=ConvPositionBlock
)
# inline_deit.py inline_deit_tiny: DeiT-T's width and depth with 6 heads; inline_deit_small: 320 wide, 10 heads.
INLINE_TINY = dict(DEIT_SHAPES["tiny"], num_heads=6)
INLINE_SMALL = dict(patch_size=16, embed_dim=320, depth=12, num_heads=10, img_size=288)

# pipeline arch name -> {attention: timm name}, for the published DeiT-T models (the complexity stage
# counts them at paper shape beside the like-for-like drop-ins)
MODEL_NAMES = {f"{a}_deit_tiny": {a: f"{a}_deit_tiny_patch16_224"} for a in ("agent", "flatten", "inline", "circulant")}

# Each published model's own paper.
AGENT_PAPER = dict(
    paper_ids="arXiv:2312.08874", paper_name="Agent Attention: On the Integration of Softmax and Linear Attention"
)
FLATTEN_PAPER = dict(
    paper_ids="arXiv:2308.00442", paper_name="FLatten Transformer: Vision Transformer using Focused Linear Attention"
)
INLINE_PAPER = dict(
    paper_ids="arXiv:2412.06590", paper_name="Bridging the Divide: Reconsidering Softmax and Linear Attention"
)
CIRCULANT_PAPER = dict(paper_ids="arXiv:2512.21542", paper_name="Vision Transformers are Circulant Attention Learners")

# Evaluation as each lab repository's data/build.py does it (TEST.CROP): Agent, FLatten and InLine resize to a
# 256 x 256 square, then centre-crop 224 (timm's crop_mode squash); Circulant resizes the shorter side to 256
# (crop_pct 0.875, center; ca_deit.py's timm _cfg says 0.9, which its evaluation never reads). The lab's released
# DeiT-T weights load through vcarepro.calibration (their key layouts, calibration/keymaps/lab.py).
SQUASH = dict(crop_mode="squash")
default_cfgs = generate_default_cfgs(
    {
        "agent_deit_tiny_patch16_224": _cfg(**SQUASH, **AGENT_PAPER),
        "agent_deit_small_patch16_224": _cfg(**SQUASH, **AGENT_PAPER),
        "flatten_deit_tiny_patch16_224": _cfg(**SQUASH, **FLATTEN_PAPER),
        "inline_deit_tiny_patch16_224": _cfg(**SQUASH, **INLINE_PAPER),
        "inline_deit_small_patch16_288": _cfg(input_size=(3, 288, 288), **SQUASH, **INLINE_PAPER),
        "circulant_deit_tiny_patch16_224": _cfg(**CIRCULANT_PAPER),
        "circulant_deit_small_patch16_224": _cfg(**CIRCULANT_PAPER),
    }
)


def _published(variant: str, attention: str, pretrained: bool, shape: dict, kwargs: dict):
    return _build(SwappedAttentionVisionTransformer, variant, pretrained, **{**shape, "attention": attention, **kwargs})


@register_model
def agent_deit_tiny_patch16_224(pretrained: bool = False, **kwargs: Any) -> SwappedAttentionVisionTransformer:
    """Agent-DeiT-T as published: DeiT-T with Agent Attention (49 agent tokens) in all 12 blocks."""
    return _published("agent_deit_tiny_patch16_224", "agent", pretrained, DEIT_SHAPES["tiny"], kwargs)


@register_model
def agent_deit_small_patch16_224(pretrained: bool = False, **kwargs: Any) -> SwappedAttentionVisionTransformer:
    """Agent-DeiT-S as published: DeiT-S with Agent Attention (49 agent tokens) in all 12 blocks."""
    return _published("agent_deit_small_patch16_224", "agent", pretrained, DEIT_SHAPES["small"], kwargs)


@register_model
def flatten_deit_tiny_patch16_224(pretrained: bool = False, **kwargs: Any) -> SwappedAttentionVisionTransformer:
    """FLatten-DeiT-T: DeiT-T with focused linear attention in all 12 blocks."""
    return _published("flatten_deit_tiny_patch16_224", "flatten", pretrained, DEIT_SHAPES["tiny"], kwargs)


@register_model
def inline_deit_tiny_patch16_224(pretrained: bool = False, **kwargs: Any) -> SwappedAttentionVisionTransformer:
    """InLine-DeiT-T as published: DeiT-T's width and depth with 6 heads, InLine attention in every block."""
    return _published("inline_deit_tiny_patch16_224", "inline", pretrained, INLINE_TINY, kwargs)


@register_model
def inline_deit_small_patch16_288(pretrained: bool = False, **kwargs: Any) -> SwappedAttentionVisionTransformer:
    """InLine-DeiT-S as published: width 320, 10 heads, 288 px (not DeiT-S's shape)."""
    return _published("inline_deit_small_patch16_288", "inline", pretrained, INLINE_SMALL, kwargs)


@register_model
def circulant_deit_tiny_patch16_224(pretrained: bool = False, **kwargs: Any) -> SwappedAttentionVisionTransformer:
    """CA-DeiT-T as published: no class token or position embedding, a conv position encoding per block."""
    return _published(
        "circulant_deit_tiny_patch16_224",
        "circulant",
        pretrained,
        DEIT_SHAPES["tiny"],
        {**CIRCULANT_BACKBONE, **kwargs},
    )


@register_model
def circulant_deit_small_patch16_224(pretrained: bool = False, **kwargs: Any) -> SwappedAttentionVisionTransformer:
    """CA-DeiT-S as published: no class token or position embedding, a conv position encoding per block."""
    return _published(
        "circulant_deit_small_patch16_224",
        "circulant",
        pretrained,
        DEIT_SHAPES["small"],
        {**CIRCULANT_BACKBONE, **kwargs},
    )
