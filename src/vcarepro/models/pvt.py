"""PVT v1 (Pyramid Vision Transformer) Tiny, baseline, Visual-Contrast Attention and the family, timm-registered.

timm ships PVT v2 only, so PVT v1 (whai362/PVT) is written here on timm layers:
four patch-embedding stages with absolute position embeddings, spatial-reduction
attention (reduction 8/4/2/1), a class token only in the last stage.

Registered: ``pvt_tiny`` (the original, 13.2M parameters as published),
``vca_pvt_tiny`` (the lab's ``AAAA`` layout after ``agent_pvt.py``: no
spatial-reduction convs, 9-16-49-49 tokens, and that code's mean-pooled head with no
class token and no final norm), ``lab_pvt_tiny`` (that layout with
``compared_attention=`` any attention of the family) and ``pvt_tiny_gap`` (the
control: PVT's own attention with the lab's head). docs/vca.md#hierarchical-backbones-the-labs-layouts
gives the layouts and their sources. ``attn_layout``, ``compared_attention`` with its
options, its pooled tokens (models/placement.py) and ``class_token`` / ``global_pool`` /
``head_norm`` are parameters; ``layer_index`` counts blocks across the network.
Parameter names follow a stage layout (``stages.i.patch_embed``), not the original's.
"""

# No ``from __future__ import annotations`` here: torch.fx copies ``forward``'s annotations into the traced code,
# and a string annotation there becomes a name TorchScript cannot resolve (timm's fx + TorchScript check).
from functools import partial
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.layers import DropPath, Mlp, get_device_dtype, resample_abs_pos_embed, trunc_normal_
from timm.models import generate_default_cfgs, register_model
from timm.models._features import feature_take_indices

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

# The lab's layout with any attention of the family (compared_attention=...).
LAB_MODEL = "lab_pvt_tiny"
# pipeline arch name -> {attention: timm name}; "mhsa" names the backbone's own attention
MODEL_NAMES = {
    "pvt_tiny": {"mhsa": "pvt_tiny", "vca": "vca_pvt_tiny", **{a: LAB_MODEL for a in LAB_MODEL_ATTENTIONS}},
    "pvt_tiny_gap": {"mhsa": "pvt_tiny_gap"},
}


class SpatialReductionAttention(nn.Module):
    """PVT v1's attention: queries from every token, keys/values from a spatially reduced map.

    With ``sr_ratio`` r > 1 the patch tokens are reduced by an r x r stride-r conv and a
    LayerNorm before the key/value projection (N keys become N / r^2). Prefix tokens
    (the class token) are not part of the reduced map, as in the original code, which
    only uses reduction in stages without a class token.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        grid_size: Union[int, Sequence[int]],
        num_prefix_tokens: int = 0,
        sr_ratio: int = 1,
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
    ) -> None:
        super().__init__()
        if dim % num_heads:
            raise BadInput(f"dim={dim} is not divisible by num_heads={num_heads}.")
        if sr_ratio > 1 and num_prefix_tokens:
            raise BadInput("spatial reduction with prefix tokens is not defined in PVT; use sr_ratio=1 there.")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.grid_size = patch_grid(grid_size)
        self.num_prefix_tokens = num_prefix_tokens
        self.sr_ratio = sr_ratio
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.kv = nn.Linear(dim, dim * 2, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.attn_drop_p = attn_drop
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        if sr_ratio > 1:
            self.sr = nn.Conv2d(dim, dim, kernel_size=sr_ratio, stride=sr_ratio)
            self.norm = nn.LayerNorm(dim)  # default eps, as the original
        else:
            self.sr = None
            self.norm = None

    def set_grid_size(self, grid_size: Union[int, Sequence[int]]) -> None:
        self.grid_size = patch_grid(grid_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        q = self.q(x).reshape(B, N, self.num_heads, self.head_dim).transpose(1, 2)
        if self.sr is not None:
            H, W = self.grid_size
            reduced = self.sr(x.transpose(1, 2).reshape(B, C, H, W)).flatten(2).transpose(1, 2)
            x = self.norm(reduced)
        k, v = self.kv(x).reshape(B, -1, 2, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        dropout_p = self.attn_drop_p if self.training else 0.0
        out = nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=self.scale)
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(B, N, C)))


class PreNormBlock(nn.Module):
    """Pre-norm transformer block around a given attention module (PVT's and CSWin's are the same)."""

    def __init__(
        self,
        dim: int,
        attn: nn.Module,
        *,
        mlp_ratio: float,
        drop: float = 0.0,
        drop_path: float = 0.0,
        norm_layer=nn.LayerNorm,
    ) -> None:
        super().__init__()
        self.norm1 = norm_layer(dim)
        self.attn = attn
        self.drop_path1 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = norm_layer(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop=drop)
        self.drop_path2 = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path1(self.attn(self.norm1(x)))
        return x + self.drop_path2(self.mlp(self.norm2(x)))


class PatchEmbed(nn.Module):
    """Non-overlapping patch embedding: stride-p conv, then LayerNorm (default eps, as the original)."""

    def __init__(self, in_chans: int, embed_dim: int, patch_size: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)
        self.norm = nn.LayerNorm(embed_dim)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, Tuple[int, int]]:
        x = self.proj(x)
        H, W = x.shape[-2:]
        return self.norm(x.flatten(2).transpose(1, 2)), (H, W)


class PvtStage(nn.Module):
    def __init__(
        self,
        patch_embed: PatchEmbed,
        blocks: List[nn.Module],
        num_patches: int,
        dim: int,
        num_prefix_tokens: int,
        drop_rate: float,
    ) -> None:
        super().__init__()
        self.patch_embed = patch_embed
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim)) if num_prefix_tokens else None
        self.pos_embed = nn.Parameter(torch.zeros(1, num_patches + num_prefix_tokens, dim))
        self.pos_drop = nn.Dropout(drop_rate)
        self.blocks = nn.Sequential(*blocks)
        self.num_prefix_tokens = num_prefix_tokens

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) image or feature map -> (B, prefix + H'W', C') tokens."""
        x, _ = self.patch_embed(x)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        return self.blocks(self.pos_drop(x + self.pos_embed))


class StagedBackbone:
    """What the backbones of token stages (PVT, CSWin) share: the weight init, ``forward_features`` / ``forward``,
    ``get_classifier``, and timm's ``forward_intermediates`` / ``prune_intermediate_layers``.

    The backbone has ``stages``, ``stage_grids``, ``norm``, ``head``, ``feature_info``, ``forward_head``,
    ``_to_map(x, i)`` (stage i's tokens to its (B, C, H, W) map), ``_features_out(x)`` (the last stage's normed
    tokens as ``forward_features`` gives them) and ``_drop_head(prune_end)`` (what pruning does to its head).
    """

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            trunc_normal_(module.weight, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
        elif callable(getattr(module, "init_weights", None)):  # an attention's own parameters (VCA's, Agent's biases)
            module.init_weights()

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.head

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Image -> the last stage, normed, as ``_features_out`` gives it (see the backbone's ``output_fmt``)."""
        for i, stage in enumerate(self.stages):
            if i:
                x = self._to_map(x, i - 1)
            x = stage(x)
        return self._features_out(self.norm(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: Optional[Union[int, List[int]]] = None,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
    ) -> Union[List[torch.Tensor], Tuple[torch.Tensor, List[torch.Tensor]]]:
        """The stages' patch grids (B, C, H, W) at strides 4/8/16/32 (timm's convention: ``indices`` an int takes
        the last n, a list those stages); ``norm`` applies the final norm to the last stage's map."""
        if output_fmt != "NCHW":
            raise BadInput(f"output_fmt={output_fmt!r}: {type(self).__name__}'s intermediates are NCHW.")
        take_indices, max_index = feature_take_indices(len(self.stages), indices)
        last = len(self.stages) - 1
        intermediates: List[torch.Tensor] = []
        for i, stage in enumerate(self.stages):
            if stop_early and i > max_index:
                break
            if i:
                x = self._to_map(x, i - 1)
            x = stage(x)
            if i == last:
                x_normed = self.norm(x)
                if i in take_indices:
                    intermediates.append(self._to_map(x_normed if norm else x, i))
                x = self._features_out(x_normed)  # what forward_features gives
            elif i in take_indices:
                intermediates.append(self._to_map(x, i))
        if intermediates_only:
            return intermediates
        return x, intermediates

    def prune_intermediate_layers(
        self, indices: Union[int, List[int]] = 1, prune_norm: bool = False, prune_head: bool = True
    ) -> List[int]:
        """Drop the stages after the last one ``indices`` takes (and the norm / head), as timm's models do."""
        take_indices, max_index = feature_take_indices(len(self.stages), indices)
        prune_end = max_index < len(self.stages) - 1
        self.stages = self.stages[: max_index + 1]
        self.stage_grids = self.stage_grids[: max_index + 1]
        if prune_norm or prune_end:
            self.norm = nn.Identity()
        if prune_end:
            self.num_features = self.head_hidden_size = self.feature_info[max_index]["num_chs"]
        if prune_head or prune_end:
            self._drop_head(prune_end)
        return take_indices


def _stage_attention(compared, dim, heads, layer_index, sr_ratio, drop, options, shared) -> nn.Module:
    """A block's attention: the compared one (``A`` in ``attn_layout``) or PVT's spatial reduction (``B``)."""
    if compared is not None:
        return build_attention(compared, dim, heads, layer_index=layer_index, proj_drop=drop, options=options, **shared)
    return SpatialReductionAttention(dim, heads, sr_ratio=sr_ratio, proj_drop=drop, **shared)


class PyramidVisionTransformer(StagedBackbone, nn.Module):
    """PVT v1 with spatial-reduction attention (``B``) or the compared attention (``A``) per stage, as
    ``attn_layout`` says; ``**attention_kwargs`` are the compared attention's own options."""

    def __init__(
        self,
        *,
        img_size: Union[int, Sequence[int]] = 224,
        in_chans: int = 3,
        num_classes: int = 1000,
        global_pool: str = "token",
        class_token: bool = True,
        head_norm: bool = True,
        patch_sizes: Sequence[int] = (4, 2, 2, 2),
        embed_dims: Sequence[int] = (64, 128, 320, 512),
        num_heads: Sequence[int] = (1, 2, 5, 8),
        mlp_ratios: Sequence[float] = (8, 8, 4, 4),
        depths: Sequence[int] = (2, 2, 2, 2),
        sr_ratios: Sequence[int] = (8, 4, 2, 1),
        qkv_bias: bool = True,
        drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        attn_layout: str = "BBBB",
        compared_attention: str = "vca",
        **attention_kwargs: Any,
    ) -> None:
        super().__init__()
        if global_pool not in ("token", "avg", ""):
            raise BadInput(f"global_pool={global_pool!r}; PVT supports 'token' (the original), 'avg' or '' (none).")
        if global_pool == "token" and not class_token:
            raise BadInput("global_pool='token' reads the class token; pass class_token=True or global_pool='avg'.")
        num_stages = len(depths)
        uses_compared = attention_layout(attn_layout, num_stages)
        options_per_stage = stage_options(compared_attention, attention_kwargs, num_stages)
        self.compared_attention = compared_attention
        self.num_classes, self.in_chans = num_classes, in_chans
        self.global_pool = global_pool
        self.num_features = self.head_hidden_size = embed_dims[-1]
        self.num_prefix_tokens = 1 if class_token else 0
        self.output_fmt = _output_fmt(self.num_prefix_tokens)
        norm_layer = partial(nn.LayerNorm, eps=1e-6)
        dpr = torch.linspace(0, drop_path_rate, sum(depths), device="cpu").tolist()  # numbers, on any device

        self.patch_sizes = tuple(patch_sizes)
        self.img_size = patch_grid(img_size)
        # each stage's token grid, to reshape between stages
        self.stage_grids: List[Tuple[int, int]] = _stage_grids(img_size, patch_sizes)
        stages, in_dim, layer_index, self.feature_info = [], in_chans, 0, []
        reduction = 1
        for i in range(num_stages):
            p = patch_sizes[i]
            grid = self.stage_grids[i]
            reduction *= p
            prefix = self.num_prefix_tokens if i == num_stages - 1 else 0  # the class token joins last
            compared = compared_attention if uses_compared[i] else None
            shared = dict(grid_size=grid, num_prefix_tokens=prefix, qkv_bias=qkv_bias, attn_drop=attn_drop_rate)
            blocks = []
            for index in range(layer_index, layer_index + depths[i]):
                attn = _stage_attention(
                    compared,
                    embed_dims[i],
                    num_heads[i],
                    index,
                    sr_ratios[i],
                    drop_rate,
                    options_per_stage[i],
                    shared,
                )
                block = dict(mlp_ratio=mlp_ratios[i], drop=drop_rate, drop_path=dpr[index], norm_layer=norm_layer)
                blocks.append(PreNormBlock(embed_dims[i], attn, **block))
            layer_index += depths[i]
            stages.append(
                PvtStage(
                    PatchEmbed(in_dim, embed_dims[i], p), blocks, grid[0] * grid[1], embed_dims[i], prefix, drop_rate
                )
            )
            self.feature_info.append(dict(num_chs=embed_dims[i], reduction=reduction, module=f"stages.{i}"))
            in_dim = embed_dims[i]
        self.stages = nn.ModuleList(stages)
        self.norm = norm_layer(embed_dims[-1]) if head_norm else nn.Identity()
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(embed_dims[-1], num_classes) if num_classes > 0 else nn.Identity()
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, PvtStage):  # neither a Linear nor a LayerNorm: the shared init's branches stay first
            trunc_normal_(module.pos_embed, std=0.02)
            if module.cls_token is not None:
                trunc_normal_(module.cls_token, std=0.02)
        else:
            StagedBackbone._init_weights(module)

    @torch.jit.ignore
    def no_weight_decay(self) -> set:
        # the class token only: whai362/PVT classification/pvt.py (and the lab's agent_pvt.py) return
        # {'cls_token'}, so the position embeddings are decayed
        return {n for n, _ in self.named_parameters() if n.endswith("cls_token")}

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> Dict[str, Any]:
        # as timm's Swin: a stage's embedding (patch embed, position embedding, class token) joins its first block
        return dict(
            stem=r"^stages\.0\.(?:patch_embed|pos_embed)",
            blocks=r"^stages\.(\d+)"
            if coarse
            else [
                (r"^stages\.(\d+)\.(?:patch_embed|pos_embed|cls_token)", (0,)),
                (r"^stages\.(\d+)\.blocks\.(\d+)", None),
                (r"^norm", (99999,)),
            ],
        )

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None) -> None:
        if global_pool is not None:
            if global_pool not in ("token", "avg", ""):
                raise BadInput(f"global_pool={global_pool!r}; PVT supports 'token', 'avg' or '' (none).")
            if global_pool == "token" and not self.num_prefix_tokens:
                raise BadInput("global_pool='token' reads the class token, which this model has not; use 'avg'.")
            self.global_pool = global_pool
        self.num_classes = num_classes
        self.head = _new_head(self, num_classes)

    def set_input_size(self, img_size: Optional[Union[int, Sequence[int]]] = None) -> None:
        """Follow a new input resolution: every stage's grid, its attention's grid (and with it VCA's pooling),
        and its position embedding (resampled as timm's ViTs do). A resolution that cannot work changes nothing."""
        if img_size is None:
            return
        grids = _stage_grids(img_size, self.patch_sizes)
        set_stage_grids([[block.attn for block in stage.blocks] for stage in self.stages], grids)
        for stage, old, new in zip(self.stages, self.stage_grids, grids):
            stage.pos_embed = nn.Parameter(
                resample_abs_pos_embed(
                    stage.pos_embed.detach(),
                    new_size=list(new),
                    old_size=list(old),
                    num_prefix_tokens=stage.num_prefix_tokens,
                    verbose=False,
                ),
                requires_grad=stage.pos_embed.requires_grad,
            )  # a frozen model stays frozen
        self.stage_grids, self.img_size = grids, patch_grid(img_size)

    def _to_map(self, x: torch.Tensor, i: int) -> torch.Tensor:
        """Stage ``i``'s tokens -> its patch grid (B, C, H, W); the class token is not part of the map."""
        H, W = self.stage_grids[i]
        if i == len(self.stages) - 1:
            x = x[:, self.num_prefix_tokens :]
        return x.transpose(1, 2).reshape(x.shape[0], -1, H, W)

    def _drop_head(self, prune_end: bool) -> None:
        if prune_end:  # the class token joins in the last stage, which is gone
            self.num_prefix_tokens = 0
            self.output_fmt = _output_fmt(0)
        self.reset_classifier(0, "avg")

    def _features_out(self, x: torch.Tensor) -> torch.Tensor:
        """The last stage (normed when ``head_norm``) as ``forward_features`` gives it: a (B, H, W, C) map
        (``output_fmt`` NHWC, as timm's Swin) without a class token; with one, the tokens (B, 1 + H*W, C) as timm's
        ViTs (``output_fmt`` NLC)."""
        if self.num_prefix_tokens:
            return x
        H, W = self.stage_grids[-1]
        return x.reshape(x.shape[0], H, W, x.shape[-1])

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        if self.global_pool == "token":
            x = x[:, 0]
        elif self.global_pool == "avg":
            # the mean over the same (B, H*W, C) tokens either way: the map is a view of them
            x = x[:, self.num_prefix_tokens :].mean(dim=1) if self.num_prefix_tokens else x.flatten(1, 2).mean(dim=1)
        x = self.head_drop(x)
        return x if pre_logits else self.head(x)


def _output_fmt(num_prefix_tokens: int) -> str:
    return "NLC" if num_prefix_tokens else "NHWC"


def _new_head(model: nn.Module, num_classes: int) -> nn.Module:
    """A fresh classifier on the model's device and dtype, in its train / eval mode (as timm's reset_classifier)."""
    head = nn.Linear(model.num_features, num_classes, **get_device_dtype(model)) if num_classes > 0 else nn.Identity()
    return head.train(model.training)


def _prod(values: Sequence[int]) -> int:
    out = 1
    for v in values:
        out *= v
    return out


def _stage_grids(img_size: Union[int, Sequence[int]], patch_sizes: Sequence[int]) -> List[Tuple[int, int]]:
    """Each stage's token grid: the image divided by the patch sizes so far; a clear error if one does not divide."""
    grid, grids = patch_grid(img_size), []
    for i, p in enumerate(patch_sizes):
        if grid[0] % p or grid[1] % p:
            raise BadInput(
                f"img_size={img_size!r} does not work: stage {i} grid {grid} is not divisible by its patch "
                f"size {p}; use an img_size divisible by {_prod(patch_sizes)}."
            )
        grid = (grid[0] // p, grid[1] // p)
        grids.append(grid)
    return grids


PVT_PAPER = dict(
    paper_ids="arXiv:2102.12122",
    paper_name="Pyramid Vision Transformer: A Versatile Backbone for Dense Prediction without Convolutions",
)


def _cfg(**kwargs: Any) -> Dict[str, Any]:
    # PVT evaluates like DeiT (crop 0.875, bicubic); no weights are published for these builds.
    return hierarchical_cfg(
        pool_size=(7, 7),
        crop_pct=0.875,
        interpolation="bicubic",
        mean=IMAGENET_DEFAULT_MEAN,
        std=IMAGENET_DEFAULT_STD,
        first_conv="stages.0.patch_embed.proj",
        classifier="head",
        **kwargs,
    )


default_cfgs = generate_default_cfgs(
    {"pvt_tiny": _cfg(**PVT_PAPER), "pvt_tiny_gap": _cfg(**PVT_PAPER), "vca_pvt_tiny": _cfg(), LAB_MODEL: _cfg()}
)

PVT_SHAPES = {
    "tiny": dict(
        patch_sizes=(4, 2, 2, 2),
        embed_dims=(64, 128, 320, 512),
        num_heads=(1, 2, 5, 8),
        mlp_ratios=(8, 8, 4, 4),
        depths=(2, 2, 2, 2),
        sr_ratios=(8, 4, 2, 1),
    ),
}
# The lab's PVT head (agent_pvt.py): no class token, no final norm, the mean of the last stage's tokens.
LAB_HEAD = dict(class_token=False, global_pool="avg", head_norm=False)
# The lab's placement in PVT-T (cfgs/agent_pvt_t.yaml: ATTN_TYPE AAAA, NUM 9-16-49-49, PVT_LA_SR_RATIOS 1111);
# the tokens per stage are placement.LAB_STAGE_TOKENS.
LAB_PVT_TINY_LAYOUT = "AAAA"


@register_model
def pvt_tiny(pretrained: bool = False, **kwargs: Any) -> PyramidVisionTransformer:
    """PVT v1 Tiny with spatial-reduction attention and its class-token head (the original)."""
    return build_hierarchical(
        PyramidVisionTransformer, "pvt_tiny", pretrained, defaults=PVT_SHAPES["tiny"], kwargs=kwargs
    )


@register_model
def pvt_tiny_gap(pretrained: bool = False, **kwargs: Any) -> PyramidVisionTransformer:
    """PVT v1 Tiny with spatial-reduction attention and the lab's head (the control for vca_pvt_tiny)."""
    return build_hierarchical(
        PyramidVisionTransformer, "pvt_tiny_gap", pretrained, defaults={**PVT_SHAPES["tiny"], **LAB_HEAD}, kwargs=kwargs
    )


@register_model
def vca_pvt_tiny(pretrained: bool = False, **kwargs: Any) -> PyramidVisionTransformer:
    """PVT v1 Tiny in the lab's layout: VCA in every stage (9-16-49-49 tokens, no spatial reduction), lab head."""
    return build_hierarchical(
        PyramidVisionTransformer,
        "vca_pvt_tiny",
        pretrained,
        layout=LAB_PVT_TINY_LAYOUT,
        compared_attention="vca",
        defaults={**PVT_SHAPES["tiny"], **LAB_HEAD},
        kwargs=kwargs,
    )


@register_model
def lab_pvt_tiny(pretrained: bool = False, **kwargs: Any) -> PyramidVisionTransformer:
    """PVT v1 Tiny in the lab's layout with ``compared_attention=`` (any of vcarepro.attention) in every stage.

    ``compared_attention="agent"`` is the lab's Agent-PVT-T (agent_pvt.py): 9-16-49-49 agent tokens.
    """
    return build_hierarchical(
        PyramidVisionTransformer,
        LAB_MODEL,
        pretrained,
        layout=LAB_PVT_TINY_LAYOUT,
        defaults={**PVT_SHAPES["tiny"], **LAB_HEAD},
        kwargs=kwargs,
    )
