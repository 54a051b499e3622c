"""DiT: the class-conditional latent Diffusion Transformer, with a selectable attention layer.

facebookresearch/DiT ``models.py``, re-written so that the baseline matches it exactly:
diffusers' ``DiTTransformer2DModel`` built from scratch does not (per-block timestep and
label embedders, no adaLN-Zero zero init, LayerNorm eps 1e-5). SiT shares the network;
only the objective differs (``vcarepro.train``). Each block's attention is any of
``vcarepro.attention.ATTENTIONS`` on the patch grid ("mhsa" is the original's), and
everything else is the original's, so the "mhsa" variant's parameter count equals it.
"""

from __future__ import annotations

import inspect
import math
from typing import Any, Dict, Mapping, Optional

import torch
import torch.nn as nn
from timm.layers import Mlp, PatchEmbed

from vcarepro.attention import ATTENTIONS, all_attention_options, attention_options, build_attention
from vcarepro.core.errors import BadInput

DIT_ATTENTIONS = ATTENTIONS
# Classifier-free guidance acts on the first 3 output channels, as facebookresearch/DiT and
# willisma/SiT models.py forward_with_cfg do (`eps, rest = model_out[:, :3], model_out[:, 3:]`).
CFG_CHANNELS = 3


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """adaLN: per-sample shift/scale of (B, N, C) tokens; scale is a residual around 1."""
    return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


#################################################################################
#               Embedding layers for timesteps and class labels                 #
#################################################################################


class TimestepEmbedder(nn.Module):
    """Scalar (possibly fractional) timesteps -> sinusoidal features -> 2-layer MLP."""

    def __init__(self, hidden_size: int, frequency_embedding_size: int = 256) -> None:
        super().__init__()
        self.frequency_embedding_size = frequency_embedding_size
        self.mlp = nn.Sequential(
            nn.Linear(frequency_embedding_size, hidden_size, bias=True),
            nn.SiLU(),
            nn.Linear(hidden_size, hidden_size, bias=True),
        )

    @staticmethod
    def timestep_embedding(t: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
        """(B,) timesteps -> (B, dim) features [cos | sin], GLIDE's layout (checkpoints depend on it)."""
        half = dim // 2
        freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
        args = t.float()[:, None] * freqs[None]
        embedding = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
        if dim % 2:
            embedding = torch.cat([embedding, torch.zeros_like(embedding[:, :1])], dim=-1)
        return embedding

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.timestep_embedding(t, self.frequency_embedding_size))


class LabelEmbedder(nn.Module):
    """Class labels -> vectors; row ``num_classes`` is the null class used by classifier-free guidance."""

    def __init__(self, num_classes: int, hidden_size: int, dropout_prob: float) -> None:
        super().__init__()
        # the null-class row exists only when labels are dropped in training (as in the original)
        use_cfg_embedding = int(dropout_prob > 0)
        self.embedding_table = nn.Embedding(num_classes + use_cfg_embedding, hidden_size)
        self.num_classes = num_classes
        self.dropout_prob = dropout_prob

    def token_drop(self, labels: torch.Tensor, force_drop_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Replace a random ``dropout_prob`` fraction (or the forced ones) by the null class."""
        if force_drop_ids is None:
            drop_ids = torch.rand(labels.shape[0], device=labels.device) < self.dropout_prob
        else:
            drop_ids = force_drop_ids == 1
        return torch.where(drop_ids, torch.full_like(labels, self.num_classes), labels)

    def forward(self, labels: torch.Tensor, train: bool, force_drop_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        if (train and self.dropout_prob > 0) or force_drop_ids is not None:
            labels = self.token_drop(labels, force_drop_ids)
        return self.embedding_table(labels)


#################################################################################
#                                 Core DiT model                                #
#################################################################################


def dit_attention(
    attention: str,
    hidden_size: int,
    num_heads: int,
    *,
    block_index: int,
    grid_size: int,
    options: Mapping[str, Any],
) -> nn.Module:
    """The attention layer of block ``block_index``; qkv bias on, as in DiT. No prefix tokens: the grid is all."""
    return build_attention(
        attention,
        hidden_size,
        num_heads,
        grid_size=grid_size,
        num_prefix_tokens=0,
        layer_index=block_index,
        qkv_bias=True,
        options=options,
    )


class DiTBlock(nn.Module):
    """Transformer block conditioned by adaLN-Zero: shift, scale and a gate per branch from c."""

    def __init__(self, hidden_size: int, num_heads: int, attn: nn.Module, mlp_ratio: float = 4.0) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.attn = attn
        self.norm2 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.mlp = Mlp(
            in_features=hidden_size, hidden_features=int(hidden_size * mlp_ratio), act_layer=_tanh_gelu, drop=0
        )
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 6 * hidden_size, bias=True))

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.adaLN_modulation(c).chunk(6, dim=1)
        x = x + gate_msa.unsqueeze(1) * self.attn(modulate(self.norm1(x), shift_msa, scale_msa))
        x = x + gate_mlp.unsqueeze(1) * self.mlp(modulate(self.norm2(x), shift_mlp, scale_mlp))
        return x


def _tanh_gelu() -> nn.Module:
    # DiT's MLP uses the tanh approximation of GELU; a named function (not a lambda) pickles.
    return nn.GELU(approximate="tanh")


class FinalLayer(nn.Module):
    """adaLN-modulated LayerNorm, then a Linear to patch_size**2 * out_channels per token."""

    def __init__(self, hidden_size: int, patch_size: int, out_channels: int) -> None:
        super().__init__()
        self.norm_final = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(hidden_size, patch_size * patch_size * out_channels, bias=True)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 2 * hidden_size, bias=True))

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=1)
        return self.linear(modulate(self.norm_final(x), shift, scale))


class DiT(nn.Module):
    """Diffusion model with a Transformer backbone; ``forward(x, t, y)`` -> (B, out_channels, H, W)."""

    def __init__(
        self,
        input_size: int = 32,
        patch_size: int = 2,
        in_channels: int = 4,
        hidden_size: int = 1152,
        depth: int = 28,
        num_heads: int = 16,
        mlp_ratio: float = 4.0,
        class_dropout_prob: float = 0.1,
        num_classes: int = 1000,
        learn_sigma: bool = True,
        attention: str = "mhsa",
        attention_options: Optional[Mapping[str, Any]] = None,
    ) -> None:
        super().__init__()
        attention_options = _checked_options(attention, attention_options)
        if input_size % patch_size:
            raise BadInput(f"input_size={input_size} is not divisible by patch_size={patch_size}.")
        self.learn_sigma = learn_sigma
        self.in_channels = in_channels
        self.out_channels = in_channels * 2 if learn_sigma else in_channels
        self.patch_size = patch_size
        self.num_heads = num_heads
        self.num_classes = num_classes
        self.attention = attention

        self.x_embedder = PatchEmbed(input_size, patch_size, in_channels, hidden_size, bias=True)
        self.t_embedder = TimestepEmbedder(hidden_size)
        self.y_embedder = LabelEmbedder(num_classes, hidden_size, class_dropout_prob)
        # Fixed sin-cos positions, kept as a frozen Parameter as in the original so that
        # original checkpoints (which carry pos_embed) load and parameter counts agree.
        self.pos_embed = nn.Parameter(torch.zeros(1, self.x_embedder.num_patches, hidden_size), requires_grad=False)

        grid_size = input_size // patch_size
        self.blocks = nn.ModuleList(
            [
                DiTBlock(
                    hidden_size,
                    num_heads,
                    dit_attention(
                        attention, hidden_size, num_heads, block_index=i, grid_size=grid_size, options=attention_options
                    ),
                    mlp_ratio=mlp_ratio,
                )
                for i in range(depth)
            ]
        )
        self.final_layer = FinalLayer(hidden_size, patch_size, self.out_channels)
        self.initialize_weights()

    def initialize_weights(self) -> None:
        # Transformer Linears (attention included, whichever it is): xavier-uniform, zero bias.
        def _basic_init(module: nn.Module) -> None:
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.constant_(module.bias, 0)

        self.apply(_basic_init)

        grid = int(self.x_embedder.num_patches**0.5)
        self.pos_embed.data.copy_(get_2d_sincos_pos_embed(self.pos_embed.shape[-1], grid).unsqueeze(0))

        # The patch embedding is a Linear on flattened patches, so initialise it like one, zero bias
        # included (facebookresearch/DiT models.py initialize_weights).
        w = self.x_embedder.proj.weight.data
        nn.init.xavier_uniform_(w.view([w.shape[0], -1]))
        nn.init.constant_(self.x_embedder.proj.bias, 0)

        nn.init.normal_(self.y_embedder.embedding_table.weight, std=0.02)
        nn.init.normal_(self.t_embedder.mlp[0].weight, std=0.02)
        nn.init.normal_(self.t_embedder.mlp[2].weight, std=0.02)

        # adaLN-Zero: every block starts as the identity, and the output starts at zero.
        for block in self.blocks:
            nn.init.constant_(block.adaLN_modulation[-1].weight, 0)
            nn.init.constant_(block.adaLN_modulation[-1].bias, 0)
        nn.init.constant_(self.final_layer.adaLN_modulation[-1].weight, 0)
        nn.init.constant_(self.final_layer.adaLN_modulation[-1].bias, 0)
        nn.init.constant_(self.final_layer.linear.weight, 0)
        nn.init.constant_(self.final_layer.linear.bias, 0)

    def unpatchify(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, p*p*C) tokens -> (B, C, H, W) images."""
        c = self.out_channels
        p = self.x_embedder.patch_size[0]
        h = w = int(x.shape[1] ** 0.5)
        if h * w != x.shape[1]:
            raise BadInput(f"unpatchify expects a square token grid, got {x.shape[1]} tokens.")
        x = x.reshape(x.shape[0], h, w, p, p, c)
        x = torch.einsum("nhwpqc->nchpwq", x)
        return x.reshape(x.shape[0], c, h * p, w * p)

    def forward(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """x: (B, C, H, W) latents, t: (B,) timesteps, y: (B,) labels -> (B, out_channels, H, W)."""
        x = self.x_embedder(x) + self.pos_embed  # (B, T, D)
        c = self.t_embedder(t) + self.y_embedder(y, self.training)
        for block in self.blocks:
            x = block(x, c)
        return self.unpatchify(self.final_layer(x, c))

    def forward_with_cfg(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor, cfg_scale: float) -> torch.Tensor:
        """Classifier-free guidance on a doubled batch: x = [z; z], y = [labels; null].

        Only the first half of ``x`` is read (as in the original, so a sampler may keep
        stepping the doubled batch); both halves of the output carry the guided eps.
        """
        half = x[: len(x) // 2]
        model_out = self.forward(torch.cat([half, half], dim=0), t, y)
        # As the originals: guidance on the first CFG_CHANNELS channels only ("for exact
        # reproducibility"; the standard form would guide all in_channels). It matters for cfg > 1 only.
        eps, rest = model_out[:, :CFG_CHANNELS], model_out[:, CFG_CHANNELS:]
        cond_eps, uncond_eps = torch.split(eps, len(eps) // 2, dim=0)
        half_eps = uncond_eps + cfg_scale * (cond_eps - uncond_eps)
        return torch.cat([torch.cat([half_eps, half_eps], dim=0), rest], dim=1)


def _checked_options(attention: str, options: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    if attention not in DIT_ATTENTIONS:
        raise BadInput(f"unknown attention {attention!r}; choose one of {', '.join(map(repr, DIT_ATTENTIONS))}.")
    options = dict(options or {})
    known = attention_options(attention)
    if options and not known:
        raise BadInput(
            f"{', '.join(sorted(options))} do not apply to attention {attention!r}, which has no options; remove them."
        )
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise BadInput(f"unknown {attention} option(s) {', '.join(unknown)}; choose from {', '.join(known)}.")
    return options


#################################################################################
#                   Sine/cosine positional embedding (MAE layout)               #
#################################################################################


def get_1d_sincos_pos_embed(embed_dim: int, pos: torch.Tensor) -> torch.Tensor:
    """(M,) positions -> (M, embed_dim) as [sin(pos * omega) | cos(pos * omega)]."""
    if embed_dim % 2:
        raise BadInput(f"sin-cos embedding needs an even dimension, got {embed_dim}.")
    omega = torch.arange(embed_dim // 2, dtype=torch.float64) / (embed_dim / 2.0)
    omega = 1.0 / 10000**omega
    out = pos.reshape(-1).double()[:, None] * omega[None]
    return torch.cat([torch.sin(out), torch.cos(out)], dim=1)


def get_2d_sincos_pos_embed(embed_dim: int, grid_size: int) -> torch.Tensor:
    """(grid_size**2, embed_dim) float32 table for a row-major square token grid.

    The first half of the channels encodes the column index and the second half the
    row index (MAE's meshgrid puts w first); DiT checkpoints depend on this order.
    """
    if embed_dim % 2:
        raise BadInput(f"2-D sin-cos embedding needs an even dimension, got {embed_dim}.")
    coords = torch.arange(grid_size, dtype=torch.float64)
    rows, cols = torch.meshgrid(coords, coords, indexing="ij")
    emb = torch.cat(
        [get_1d_sincos_pos_embed(embed_dim // 2, cols), get_1d_sincos_pos_embed(embed_dim // 2, rows)], dim=1
    )
    return emb.float()


#################################################################################
#                                  DiT configs                                  #
#################################################################################

DIT_CONFIGS: Dict[str, Dict[str, int]] = {
    "dit_xl2": dict(depth=28, hidden_size=1152, num_heads=16, patch_size=2),
    "dit_xl4": dict(depth=28, hidden_size=1152, num_heads=16, patch_size=4),
    "dit_xl8": dict(depth=28, hidden_size=1152, num_heads=16, patch_size=8),
    "dit_l2": dict(depth=24, hidden_size=1024, num_heads=16, patch_size=2),
    "dit_l4": dict(depth=24, hidden_size=1024, num_heads=16, patch_size=4),
    "dit_l8": dict(depth=24, hidden_size=1024, num_heads=16, patch_size=8),
    "dit_b2": dict(depth=12, hidden_size=768, num_heads=12, patch_size=2),
    "dit_b4": dict(depth=12, hidden_size=768, num_heads=12, patch_size=4),
    "dit_b8": dict(depth=12, hidden_size=768, num_heads=12, patch_size=8),
    "dit_s2": dict(depth=12, hidden_size=384, num_heads=6, patch_size=2),
    "dit_s4": dict(depth=12, hidden_size=384, num_heads=6, patch_size=4),
    "dit_s8": dict(depth=12, hidden_size=384, num_heads=6, patch_size=8),
}

_DIT_ARGS = tuple(p for p in inspect.signature(DiT.__init__).parameters if p != "self")


def create_dit(arch: str, attention: str = "mhsa", **overrides: Any) -> DiT:
    """Build ``arch`` (a DIT_CONFIGS key) with ``attention``; overrides replace any DiT argument.

    The attention's knobs may be given flat (``contrast_tokens=16``) or as ``attention_options={...}``.
    """
    if arch not in DIT_CONFIGS:
        raise BadInput(f"unknown DiT arch {arch!r}; choose one of {', '.join(map(repr, DIT_CONFIGS))}.")
    if attention not in DIT_ATTENTIONS:
        raise BadInput(f"unknown attention {attention!r}; choose one of {', '.join(map(repr, DIT_ATTENTIONS))}.")
    options = dict(overrides.pop("attention_options", None) or {})
    for name in attention_options(attention):
        if name in overrides:
            if name in options:
                raise BadInput(f"{name} given both flat and in attention_options; give it once.")
            options[name] = overrides.pop(name)
    stray = sorted(set(overrides) & all_attention_options())
    if stray:
        raise BadInput(
            f"{', '.join(stray)} {'does' if len(stray) == 1 else 'do'} not apply to attention "
            f"{attention!r}; remove {'it' if len(stray) == 1 else 'them'}."
        )
    unknown = sorted(set(overrides) - set(_DIT_ARGS))
    if unknown:
        raise BadInput(f"unknown DiT argument(s) {', '.join(unknown)}; choose from {', '.join(_DIT_ARGS)}.")
    kwargs = {**DIT_CONFIGS[arch], **overrides}
    return DiT(attention=attention, attention_options=options, **kwargs)


__all__ = [
    "DIT_ATTENTIONS",
    "DIT_CONFIGS",
    "DiT",
    "DiTBlock",
    "FinalLayer",
    "LabelEmbedder",
    "TimestepEmbedder",
    "create_dit",
    "get_2d_sincos_pos_embed",
    "modulate",
]
