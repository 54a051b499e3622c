"""CSWin-T (Cross-Shaped Window Transformer), baseline, Visual-Contrast Attention and the family, timm-registered.

timm has no CSWin, so CSWin-T (microsoft/CSWin-Transformer ``CSWin_64_12211_tiny_224``)
is written here on timm layers: stripe attention in two head halves (vertical /
horizontal, widths 1/2/7/7, one full branch where the stripe covers the grid) with
LePE, mean pooling after a final LayerNorm. One deviation, for small inputs only: a
stripe wider than the stage grid is clamped to it (the original would fail).

Registered: ``cswin_tiny_224`` (the original, depths 1-2-21-1), ``vca_cswin_tiny_224``
(the lab's ``AABB`` layout, depths 2-4-18-1; VCA's depthwise conv of V takes LePE's
role), ``lab_cswin_tiny_224`` (that layout with ``compared_attention=`` any attention of
the family) and ``cswin_tiny_2418_224`` (the control: CSWin's attention in the 2-4-18-1
backbone). docs/vca.md#hierarchical-backbones-the-labs-layouts gives the layouts and
their sources; ``attn_layout``, ``compared_attention``, its pooled tokens and ``depths``
are parameters, and ``layer_index`` counts blocks across the network.
"""

# No ``from __future__ import annotations`` here: torch.fx copies ``forward``'s annotations into the traced code,
# and a string annotation there becomes a name TorchScript cannot resolve (timm's fx + TorchScript check).
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.models import generate_default_cfgs, register_model

from vcarepro.attention import build_attention
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
from vcarepro.models.pvt import PreNormBlock, StagedBackbone, _new_head

# The lab's layout with any attention of the family (compared_attention=...).
LAB_MODEL = "lab_cswin_tiny_224"
# pipeline arch name -> {attention: timm name}; "mhsa" names the backbone's own attention
MODEL_NAMES = {
    "cswin_tiny": {
        "mhsa": "cswin_tiny_224",
        "vca": "vca_cswin_tiny_224",
        **{a: LAB_MODEL for a in LAB_MODEL_ATTENTIONS},
    },
    "cswin_tiny_2418": {"mhsa": "cswin_tiny_2418_224"},
}


def _check_tiling(grid_size: Tuple[int, int], stripe: Tuple[int, int]) -> None:
    H, W = grid_size
    if H % stripe[0] or W % stripe[1]:
        raise BadInput(
            f"stripes {tuple(stripe)} do not tile the {H}x{W} stage grid; use an img_size whose stage "
            f"grids are multiples of the stripe widths, or other stripe_widths (CSWin at 384 px uses "
            f"stripe_widths=(1, 2, 12, 12))."
        )


class StripeAttention(nn.Module):
    """Multi-head attention inside non-overlapping (stripe_h x stripe_w) stripes, plus LePE."""

    def __init__(
        self, dim: int, num_heads: int, grid_size: Tuple[int, int], stripe: Tuple[int, int], attn_drop: float = 0.0
    ) -> None:
        super().__init__()
        _check_tiling(grid_size, stripe)
        self.dim, self.num_heads, self.head_dim = dim, num_heads, dim // num_heads
        self.scale = self.head_dim**-0.5
        self.grid_size, self.stripe = tuple(grid_size), tuple(stripe)
        self.attn_drop_p = attn_drop
        self.get_v = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)  # LePE

    def _stripes(self, x: torch.Tensor) -> torch.Tensor:
        # (B, H*W, C) -> (B * num_stripes, C, sh, sw)
        B, _, C = x.shape
        (H, W), (sh, sw) = self.grid_size, self.stripe
        x = x.view(B, H // sh, sh, W // sw, sw, C).permute(0, 1, 3, 5, 2, 4)
        return x.reshape(-1, C, sh, sw)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        # (B', C, sh, sw) -> (B', heads, sh*sw, d)
        return x.reshape(x.shape[0], self.num_heads, self.head_dim, -1).transpose(-1, -2)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        B, N, C = q.shape
        (H, W), (sh, sw) = self.grid_size, self.stripe
        v_img = self._stripes(v)
        lepe = self._heads(self.get_v(v_img))
        dropout_p = self.attn_drop_p if self.training else 0.0
        out = F.scaled_dot_product_attention(
            self._heads(self._stripes(q)),
            self._heads(self._stripes(k)),
            self._heads(v_img),
            dropout_p=dropout_p,
            scale=self.scale,
        )
        out = (out + lepe).transpose(1, 2)  # (B', sh*sw, heads, d)
        out = out.reshape(B, H // sh, W // sw, sh, sw, C).permute(0, 1, 3, 2, 4, 5)
        return out.reshape(B, N, C)


class CrossShapedWindowAttention(nn.Module):
    """CSWin's attention: half the heads in vertical stripes, half in horizontal ones (or one full branch)."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        grid_size: Tuple[int, int],
        stripe_width: int,
        full: bool = False,
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
    ) -> None:
        super().__init__()
        H, W = grid_size
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        if full or (H, W) == (stripe_width, stripe_width):
            self.branches = nn.ModuleList([StripeAttention(dim, num_heads, grid_size, (H, W), attn_drop)])
        else:
            if num_heads % 2 or dim % 2:
                raise BadInput(f"cross-shaped attention splits dim={dim} / heads={num_heads} in two; use even ones.")
            half = dim // 2
            self.branches = nn.ModuleList(
                [
                    StripeAttention(half, num_heads // 2, grid_size, (H, min(stripe_width, W)), attn_drop),  # vertical
                    StripeAttention(
                        half, num_heads // 2, grid_size, (min(stripe_width, H), W), attn_drop
                    ),  # horizontal
                ]
            )
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    @property
    def grid_size(self) -> Tuple[int, int]:
        return self.branches[0].grid_size

    def set_grid_size(self, grid_size: Tuple[int, int]) -> None:
        """A new stage grid: stripes keep their width and span the new height / width (one full branch stays
        full). Stripes that do not tile the new grid are a BadInput and change nothing."""
        H, W = grid_size
        if len(self.branches) == 1:
            stripes = [(H, W)]
        else:
            stripes = [(H, self.branches[0].stripe[1]), (self.branches[1].stripe[0], W)]
        for stripe in stripes:
            _check_tiling((H, W), stripe)
        for branch, stripe in zip(self.branches, stripes):
            branch.grid_size, branch.stripe = (H, W), stripe

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        # the branch count is fixed at construction: index the chunks (torch.fx and TorchScript unroll this loop)
        n = len(self.branches)
        qs, ks, vs = q.chunk(n, -1), k.chunk(n, -1), v.chunk(n, -1)
        outs: List[torch.Tensor] = []
        for i, branch in enumerate(self.branches):
            outs.append(branch(qs[i], ks[i], vs[i]))
        return self.proj_drop(self.proj(torch.cat(outs, dim=-1)))


class ConvEmbed(nn.Module):
    """A strided conv + LayerNorm: the stem (7x7 / 4) and the merge between stages (3x3 / 2)."""

    def __init__(self, in_chans: int, dim: int, kernel_size: int, stride: int, padding: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(in_chans, dim, kernel_size, stride, padding)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.proj(x).flatten(2).transpose(1, 2))


class CSWinStage(nn.Module):
    def __init__(self, embed: ConvEmbed, blocks: List[nn.Module]) -> None:
        super().__init__()
        self.embed = embed
        self.blocks = nn.Sequential(*blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(self.embed(x))


def _stage_attention(compared, dim, heads, layer_index, options, stripes, shared) -> nn.Module:
    """A block's attention: the compared one (``A`` in ``attn_layout``) or CSWin's cross-shaped windows (``B``)."""
    if compared is not None:
        return build_attention(
            compared, dim, heads, num_prefix_tokens=0, layer_index=layer_index, options=options, **shared
        )
    return CrossShapedWindowAttention(dim, heads, **stripes, **shared)


class CSWinTransformer(StagedBackbone, nn.Module):
    """CSWin Transformer with cross-shaped attention (``B``) or a global compared attention (``A``) per stage, as
    ``attn_layout`` says; ``**attention_kwargs`` are the compared attention's own options."""

    def __init__(
        self,
        *,
        img_size: Union[int, Sequence[int]] = 224,
        in_chans: int = 3,
        num_classes: int = 1000,
        global_pool: str = "avg",
        embed_dim: int = 64,
        depths: Sequence[int] = (1, 2, 21, 1),
        stripe_widths: Sequence[int] = (1, 2, 7, 7),
        num_heads: Sequence[int] = (2, 4, 8, 16),
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        attn_layout: str = "BBBB",
        compared_attention: str = "vca",
        **attention_kwargs: Any,
    ) -> None:
        super().__init__()
        if global_pool not in ("avg", ""):
            raise BadInput("CSWin classifies from mean-pooled tokens; global_pool must be 'avg' (or '' for none).")
        num_stages = len(depths)
        uses_compared = attention_layout(attn_layout, num_stages)
        options_per_stage = stage_options(compared_attention, attention_kwargs, num_stages)
        self.compared_attention = compared_attention
        self.num_classes, self.in_chans = num_classes, in_chans
        self.global_pool = global_pool
        self.output_fmt = "NHWC"  # forward_features' map, as timm's Swin
        dims = [embed_dim * 2**i for i in range(num_stages)]
        self.num_features = self.head_hidden_size = dims[-1]
        dpr = torch.linspace(0, drop_path_rate, sum(depths), device="cpu").tolist()  # numbers, on any device

        self.img_size = patch_grid(img_size)
        self.stage_grids: List[Tuple[int, int]] = _stage_grids(img_size, num_stages)
        self.feature_info: List[Dict[str, Any]] = []
        stages, layer_index, reduction = [], 0, 4
        for i in range(num_stages):
            grid = self.stage_grids[i]
            if i:
                reduction *= 2
                embed = ConvEmbed(dims[i - 1], dims[i], 3, 2, 1)
            else:
                embed = ConvEmbed(in_chans, dims[0], 7, 4, 2)
            blocks = []
            compared = compared_attention if uses_compared[i] else None
            stripes = dict(stripe_width=min(stripe_widths[i], *grid), full=i == num_stages - 1)
            shared = dict(grid_size=grid, qkv_bias=qkv_bias, attn_drop=attn_drop_rate, proj_drop=drop_rate)
            for _ in range(depths[i]):
                attn = _stage_attention(
                    compared, dims[i], num_heads[i], layer_index, options_per_stage[i], stripes, shared
                )
                blocks.append(
                    PreNormBlock(dims[i], attn, mlp_ratio=mlp_ratio, drop=drop_rate, drop_path=dpr[layer_index])
                )
                layer_index += 1
            stages.append(CSWinStage(embed, blocks))
            self.feature_info.append(dict(num_chs=dims[i], reduction=reduction, module=f"stages.{i}"))
        self.stages = nn.ModuleList(stages)
        self.norm = nn.LayerNorm(dims[-1])
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(dims[-1], num_classes) if num_classes > 0 else nn.Identity()
        self.apply(self._init_weights)

    @torch.jit.ignore
    def no_weight_decay(self) -> set:
        return set()

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> Dict[str, Any]:
        # as timm's Swin: the merge into a stage joins that stage's first block
        return dict(
            stem=r"^stages\.0\.embed",
            blocks=r"^stages\.(\d+)"
            if coarse
            else [(r"^stages\.(\d+)\.embed", (0,)), (r"^stages\.(\d+)\.blocks\.(\d+)", None), (r"^norm", (99999,))],
        )

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None) -> None:
        if global_pool not in (None, "avg", ""):
            raise BadInput("CSWin classifies from mean-pooled tokens; global_pool must be 'avg' (or '' for none).")
        if global_pool is not None:
            self.global_pool = global_pool
        self.num_classes = num_classes
        self.head = _new_head(self, num_classes)

    def set_input_size(self, img_size: Optional[Union[int, Sequence[int]]] = None) -> None:
        """Follow a new input resolution: every stage's grid and its attention's (stripes keep their widths, VCA
        its contrast tokens). A resolution that cannot work (stripes that do not tile a stage grid, a contrast grid
        larger than a stage grid) is a BadInput and changes nothing."""
        if img_size is None:
            return
        grids = _stage_grids(img_size, len(self.stages))
        set_stage_grids([[block.attn for block in stage.blocks] for stage in self.stages], grids)
        self.stage_grids, self.img_size = grids, patch_grid(img_size)

    def _to_map(self, x: torch.Tensor, i: int) -> torch.Tensor:
        """Stage ``i``'s tokens (B, H*W, C) -> its feature map (B, C, H, W)."""
        H, W = self.stage_grids[i]
        return x.transpose(1, 2).reshape(x.shape[0], -1, H, W)

    def _drop_head(self, prune_end: bool) -> None:
        self.reset_classifier(0)

    def _features_out(self, x: torch.Tensor) -> torch.Tensor:
        """The last stage's normed tokens (B, H*W, C) as the (B, H, W, C) map ``forward_features`` gives."""
        H, W = self.stage_grids[-1]
        return x.reshape(x.shape[0], H, W, x.shape[-1])

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        if self.global_pool == "avg":
            x = x.flatten(1, 2).mean(dim=1)  # the mean over the (B, H*W, C) tokens the map is a view of
        x = self.head_drop(x)
        return x if pre_logits else self.head(x)


def _stage_grids(img_size: Union[int, Sequence[int]], num_stages: int) -> List[Tuple[int, int]]:
    """Each stage's token grid: the 7x7 / 4 stem (padding 2), then a 3x3 / 2 merge (padding 1) per stage."""
    H, W = patch_grid(img_size)
    grid = ((H + 2 * 2 - 7) // 4 + 1, (W + 2 * 2 - 7) // 4 + 1)
    grids = [grid]
    for _ in range(num_stages - 1):
        grid = ((grid[0] - 1) // 2 + 1, (grid[1] - 1) // 2 + 1)
        grids.append(grid)
    return grids


CSWIN_PAPER = dict(
    paper_ids="arXiv:2107.00652",
    paper_name="CSWin Transformer: A General Vision Transformer Backbone with Cross-Shaped Windows",
)


def _cfg(**kwargs: Any) -> Dict[str, Any]:
    # CSWin evaluates with crop 0.9, bicubic; no weights are published for these builds.
    return hierarchical_cfg(
        pool_size=(7, 7),
        crop_pct=0.9,
        interpolation="bicubic",
        mean=IMAGENET_DEFAULT_MEAN,
        std=IMAGENET_DEFAULT_STD,
        first_conv="stages.0.embed.proj",
        classifier="head",
        **kwargs,
    )


default_cfgs = generate_default_cfgs(
    {
        "cswin_tiny_224": _cfg(**CSWIN_PAPER),
        "cswin_tiny_2418_224": _cfg(**CSWIN_PAPER),
        "vca_cswin_tiny_224": _cfg(),
        LAB_MODEL: _cfg(),
    }
)

CSWIN_SHAPES = {
    "tiny": dict(
        embed_dim=64, depths=(1, 2, 21, 1), stripe_widths=(1, 2, 7, 7), num_heads=(2, 4, 8, 16), mlp_ratio=4.0
    ),
}
# The lab's CSwin-T backbone (agent_cswin.py, Agent_CSWin_64_24181_tiny_224): depths 2-4-18-1.
LAB_DEPTHS = dict(depths=(2, 4, 18, 1))
# The lab's placement in it (cfgs/agent_cswin_t.yaml: ATTN_TYPE AABB, NUM 9-16-49-49 = placement.LAB_STAGE_TOKENS).
LAB_CSWIN_TINY_LAYOUT = "AABB"


@register_model
def cswin_tiny_224(pretrained: bool = False, **kwargs: Any) -> CSWinTransformer:
    """CSWin-T with cross-shaped window attention (the original, depths 1-2-21-1)."""
    return build_hierarchical(
        CSWinTransformer, "cswin_tiny_224", pretrained, defaults=CSWIN_SHAPES["tiny"], kwargs=kwargs
    )


@register_model
def cswin_tiny_2418_224(pretrained: bool = False, **kwargs: Any) -> CSWinTransformer:
    """CSWin-T's attention in the lab's depths 2-4-18-1 (the control for vca_cswin_tiny_224)."""
    return build_hierarchical(
        CSWinTransformer,
        "cswin_tiny_2418_224",
        pretrained,
        defaults={**CSWIN_SHAPES["tiny"], **LAB_DEPTHS},
        kwargs=kwargs,
    )


@register_model
def vca_cswin_tiny_224(pretrained: bool = False, **kwargs: Any) -> CSWinTransformer:
    """CSWin-T in the lab's layout: depths 2-4-18-1, VCA in stages 1-2 (9 and 16 tokens), CSWin's attention in 3-4."""
    return build_hierarchical(
        CSWinTransformer,
        "vca_cswin_tiny_224",
        pretrained,
        layout=LAB_CSWIN_TINY_LAYOUT,
        compared_attention="vca",
        defaults={**CSWIN_SHAPES["tiny"], **LAB_DEPTHS},
        kwargs=kwargs,
    )


@register_model
def lab_cswin_tiny_224(pretrained: bool = False, **kwargs: Any) -> CSWinTransformer:
    """CSWin-T in the lab's layout (depths 2-4-18-1, AABB) with ``compared_attention=`` in stages 1-2.

    ``compared_attention="agent"`` is the lab's Agent-CSWin-T (agent_cswin.py): 9 and 16 agent tokens.
    """
    return build_hierarchical(
        CSWinTransformer,
        LAB_MODEL,
        pretrained,
        layout=LAB_CSWIN_TINY_LAYOUT,
        defaults={**CSWIN_SHAPES["tiny"], **LAB_DEPTHS},
        kwargs=kwargs,
    )
