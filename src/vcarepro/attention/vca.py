"""Visual-Contrast Attention (VCA), arXiv 2511.00833.

Stage I pools the patch-grid queries to n contrast tokens, makes two streams
t+ / t- (plus learnable embeddings) and contrasts what they read from all N
keys; Stage II lets every query attend to [t+; t-] with one joint softmax and
takes the lambda-weighted difference. Cost O(N n C) against MHSA's O(N^2 C).
docs/vca.md gives the equations, the defaults and their evidence, and the
ablation switches (``stage1`` / ``stage2``, ``tokens_pos`` / ``tokens_neg``,
``stage2_softmax``: one module, not copies of it).

Pooling is PyTorch's adaptive average pooling (overlapping windows where h does
not divide H, as the lab's Agent Attention pools); a contrast grid larger than
the patch grid would repeat queries and is refused. The lambda vectors are 1-D
parameters, as in the Differential Transformer, so the optimizers leave them out
of weight decay; e+ / e- are decayed.

Each attention is one ``_attend``: SDPA, or the map materialised where timm's
fused attention is off (``fused_attn``), as timm's ``Attention``; tests hold
both to the equations written out. The layer keeps to
TorchScript's subset (no closures, no bound methods as values, no postponed
annotations) and its checks are timm no-trace functions, so models using it
script and fx-trace as timm's DeiT does (tests/test_timm_vit.py).
"""

import math
from typing import Any, Literal, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import RmsNormFp32, trunc_normal_, use_fused_attn

from vcarepro.attention.grid import (
    GridAttention,
    check_choice,
    check_input,
    local_conv_layer,
    patch_grid,
    token_grid,
)
from vcarepro.core.errors import BadInput

StageKind = Literal["vca", "diff"]
TokenKind = Literal["pool", "emb", "pool+emb"]
SoftmaxKind = Literal["joint", "separate"]

STAGE_KINDS = ("vca", "diff")
TOKEN_KINDS = ("pool", "emb", "pool+emb")
SOFTMAX_KINDS = ("joint", "separate")

# How e+ / e- start (``contrast_embed_init``): the paper does not say; "normal" (std 1) is what two ports of
# the released classifier do (docs/vca.md names them), "trunc_normal" (std 0.02) timm's token init.
CONTRAST_EMBED_INITS = {"normal": 1.0, "trunc_normal": 0.02}
# Init std of the lambda re-parametrisation vectors, as in the Differential Transformer.
LAMBDA_INIT_STD = 0.1
# RMSNorm epsilon, as in the Differential Transformer (and timm's DiffAttention).
RMS_NORM_EPS = 1e-5


def lambda_init_for_layer(layer_index: int) -> float:
    """Differential Transformer's depth-dependent lambda_init, layer_index from 0."""
    return 0.8 - 0.6 * math.exp(-0.3 * layer_index)


class DifferentialLambda(nn.Module):
    """lambda = exp(q1 . k1) - exp(q2 . k2) + lambda_init, from four 1-D vectors of length head_dim."""

    def __init__(self, head_dim: int, lambda_init: float) -> None:
        super().__init__()
        self.lambda_init = lambda_init
        self.q1 = nn.Parameter(torch.empty(head_dim))
        self.k1 = nn.Parameter(torch.empty(head_dim))
        self.q2 = nn.Parameter(torch.empty(head_dim))
        self.k2 = nn.Parameter(torch.empty(head_dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for vector in (self.q1, self.k1, self.q2, self.k2):
            nn.init.normal_(vector, mean=0.0, std=LAMBDA_INIT_STD)

    def forward(self) -> torch.Tensor:
        """The scalar lambda, in float32 whatever the parameters' dtype (and outside autocast's reach)."""
        first = torch.exp((self.q1.float() * self.k1.float()).sum())
        second = torch.exp((self.q2.float() * self.k2.float()).sum())
        return first - second + self.lambda_init


class VisualContrastAttention(GridAttention):
    """Visual-Contrast Attention, a drop-in replacement for timm's ``Attention``.

    Unlike MHSA it needs to know the token layout: ``grid_size`` (H, W) of the
    patch grid and ``num_prefix_tokens`` in front of it.
    """

    fused_attn: bool

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *,
        contrast_tokens: Union[int, Sequence[int]] = 49,
        stage1: StageKind = "vca",
        stage2: StageKind = "vca",
        tokens_pos: TokenKind = "pool+emb",
        tokens_neg: TokenKind = "pool+emb",
        stage2_softmax: SoftmaxKind = "joint",
        local_conv: bool = True,
        contrast_embed_init: str = "normal",
        apply_attn_drop: bool = False,
        **common: Any,
    ) -> None:
        super().__init__(dim, num_heads, **common)
        check_choice("stage1", stage1, STAGE_KINDS)
        check_choice("stage2", stage2, STAGE_KINDS)
        check_choice("tokens_pos", tokens_pos, TOKEN_KINDS)
        check_choice("tokens_neg", tokens_neg, TOKEN_KINDS)
        check_choice("stage2_softmax", stage2_softmax, SOFTMAX_KINDS)
        check_choice("contrast_embed_init", contrast_embed_init, tuple(CONTRAST_EMBED_INITS))
        if "diff" in (stage1, stage2) and self.head_dim % 2:
            raise BadInput(
                f"a 'diff' stage splits each head in two halves, but head_dim={self.head_dim} is odd; "
                f"use an even head dimension."
            )
        self.contrast_grid = token_grid(contrast_tokens, "contrast_tokens")
        self.num_contrast_tokens = self.contrast_grid[0] * self.contrast_grid[1]
        self.stage1 = stage1
        self.stage2 = stage2
        self.tokens_pos = tokens_pos
        self.uses_negative_stream = "vca" in (stage1, stage2)
        self.tokens_neg = tokens_neg if self.uses_negative_stream else None
        # whether any stream's contrast tokens come from pooling the queries
        self.pools = any(s is not None and "pool" in s for s in (self.tokens_pos, self.tokens_neg))
        self.stage2_softmax = stage2_softmax
        self.lambda_init = lambda_init_for_layer(self.layer_index)
        self.contrast_embed_init = contrast_embed_init
        # Whether attn_drop is applied to the attention maps of both stages. The released classifier declares the
        # dropout module but applies the maps directly (wom-sama/DACS_CNPM trkh/models/visual_contrast_attention.py:
        # "defines attention dropout for API parity but applies the normalized maps directly in both contrast
        # stages"), so the default is False; tannguyenbmt47/VCA_object_detection models.py applies it (True).
        # Every paper recipe trains with attn_drop 0, where the two are the same network.
        self.apply_attn_drop = apply_attn_drop
        self.attn_drop = nn.Dropout(self.attn_drop_p)
        self.attn_drop_p = self.attn_drop_p if apply_attn_drop else 0.0
        self.fused_attn = use_fused_attn()
        self.grid_size = self._validated_grid(self.grid_size)

        n = self.num_contrast_tokens
        self.embed_pos = nn.Parameter(torch.empty(n, dim)) if "emb" in tokens_pos else None
        self.embed_neg = (
            nn.Parameter(torch.empty(n, dim)) if self.tokens_neg is not None and "emb" in self.tokens_neg else None
        )
        # lambda1 weighs Stage I's negative stream, lambda2 Stage II's
        self.lambda1 = DifferentialLambda(self.head_dim, self.lambda_init)
        self.lambda2 = DifferentialLambda(self.head_dim, self.lambda_init)
        # RMSNorm over the head dimension, shared by the heads (as the Differential
        # Transformer's sub-layer norm); computed in float32 for bf16 safety.
        self.stage1_norm = RmsNormFp32(self.head_dim, eps=RMS_NORM_EPS)
        self.stage2_norm = RmsNormFp32(self.head_dim, eps=RMS_NORM_EPS)
        self.local_conv = local_conv_layer(dim) if local_conv else None
        self._init_proj()
        self.init_weights()

    # -- construction helpers -------------------------------------------------

    def _validated_grid(self, grid_size: Union[int, Sequence[int]]) -> Tuple[int, int]:
        H, W = patch_grid(grid_size)
        h, w = self.contrast_grid
        if self.pools and (h > H or w > W):
            raise BadInput(
                f"the {h}x{w} contrast-token grid is larger than the {H}x{W} patch grid, so pooling would repeat "
                f"queries; choose at most {min(H, W) ** 2} contrast tokens (e.g. contrast_tokens={min(H, W) ** 2}) "
                f"or a larger input."
            )
        return (H, W)

    def set_grid_size(self, grid_size: Union[int, Sequence[int]]) -> None:
        """Follow a change of input resolution (timm's ``set_input_size``)."""
        self.grid_size = self._validated_grid(grid_size)

    def init_weights(self) -> None:
        """Initialise VCA's own parameters (timm's ViT init calls this; it leaves the Linears to timm)."""
        for embed in (self.embed_pos, self.embed_neg):
            if embed is not None:
                std = CONTRAST_EMBED_INITS[self.contrast_embed_init]
                if self.contrast_embed_init == "normal":
                    nn.init.normal_(embed, std=std)
                else:
                    trunc_normal_(embed, std=std)
        self.lambda1.reset_parameters()
        self.lambda2.reset_parameters()

    def extra_repr(self) -> str:
        return (
            f"grid_size={self.grid_size}, contrast_grid={self.contrast_grid}, prefix={self.num_prefix_tokens}, "
            f"layer_index={self.layer_index}, stage1={self.stage1}, stage2={self.stage2}, "
            f"tokens=({self.tokens_pos}, {self.tokens_neg}), stage2_softmax={self.stage2_softmax}, "
            f"contrast_embed_init={self.contrast_embed_init}, apply_attn_drop={self.apply_attn_drop}"
        )

    # -- the contrast tokens -------------------------------------------------------

    def lambdas(self) -> torch.Tensor:
        """(lambda1, lambda2) as a float32 tensor of shape (2,)."""
        return torch.stack([self.lambda1(), self.lambda2()])

    def contrast_tokens(self, q: torch.Tensor) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """The n contrast tokens of each stream, (B, heads, n, d); t- is None when unused."""
        pooled = self._pooled_queries(q, self.contrast_grid) if self.pools else None
        t_pos = self._stream(self.tokens_pos, self.embed_pos, pooled, q)
        assert t_pos is not None  # the positive stream always exists
        return t_pos, self._stream(self.tokens_neg, self.embed_neg, pooled, q)

    def _stream(
        self, kind: Optional[str], embed: Optional[torch.Tensor], pooled: Optional[torch.Tensor], q: torch.Tensor
    ) -> Optional[torch.Tensor]:
        """One stream's tokens from the pooled queries and / or its embedding; None for an unused stream."""
        if kind is None:
            return None
        if kind == "pool":
            return pooled
        assert embed is not None
        e = self._split_heads(embed.unsqueeze(0)).to(q.dtype)
        if kind == "emb":
            return e.expand(q.shape[0], -1, -1, -1)
        assert pooled is not None
        return pooled + e

    # -- attention primitives ---------------------------------------------------

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        """softmax(q k^T * scale) v: SDPA, or the map materialised where fused attention is off."""
        if self.fused_attn:
            dropout_p = self.attn_drop_p if self.training else 0.0
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=scale)
        attn = ((q * scale) @ k.transpose(-2, -1)).softmax(dim=-1)
        if self.apply_attn_drop:
            attn = self.attn_drop(attn)
        return attn @ v

    @staticmethod
    def _halves(x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        first, second = x.chunk(2, dim=-1)
        return first, second

    def _differential(
        self,
        qa: torch.Tensor,
        ka: torch.Tensor,
        qb: torch.Tensor,
        kb: torch.Tensor,
        v: torch.Tensor,
        lam: torch.Tensor,
        scale: float,
        same_keys: bool = False,
    ) -> torch.Tensor:
        """softmax(qa ka^T) v - lam * softmax(qb kb^T) v, in one attention call when ka is kb."""
        if same_keys or ka is kb:  # same keys: one call over the stacked queries
            out = self._attend(torch.cat([qa, qb], dim=2), ka, v, scale)
            n_a = qa.shape[2]
            out_a, out_b = out[:, :, :n_a], out[:, :, n_a:]
        else:
            out_a, out_b = self._attend(qa, ka, v, scale), self._attend(qb, kb, v, scale)
        return out_a - lam.to(out_a.dtype) * out_b

    # -- the two stages -------------------------------------------------------------

    def _global_contrast(
        self,
        t_pos: torch.Tensor,
        t_neg: Optional[torch.Tensor],
        k: torch.Tensor,
        v: torch.Tensor,
        lam: torch.Tensor,
    ) -> torch.Tensor:
        if self.stage1 == "vca":
            assert t_neg is not None
            out = self._differential(t_pos, k, t_neg, k, v, lam, self.scale, same_keys=True)
        else:
            (t1, t2), (k1, k2) = self._halves(t_pos), self._halves(k)
            out = self._differential(t1, k1, t2, k2, v, lam, (self.head_dim // 2) ** -0.5)
        return (1.0 - self.lambda_init) * self.stage1_norm(out)

    def _patch_contrast(
        self,
        q: torch.Tensor,
        t_pos: torch.Tensor,
        t_neg: Optional[torch.Tensor],
        v_hat: torch.Tensor,
        lam: torch.Tensor,
    ) -> torch.Tensor:
        if self.stage2 == "diff":
            (q1, q2), (t1, t2) = self._halves(q), self._halves(t_pos)
            out = self._differential(q1, t1, q2, t2, v_hat, lam, (self.head_dim // 2) ** -0.5)
        elif self.stage2_softmax == "separate":
            assert t_neg is not None
            out = self._differential(q, t_pos, q, t_neg, v_hat, lam, self.scale)
        else:
            assert t_neg is not None
            # one joint softmax over [t+; t-]: A+ v_hat - lam A- v_hat = A [v_hat; -lam v_hat]
            values = torch.cat([v_hat, -lam.to(v_hat.dtype) * v_hat], dim=2)
            out = self._attend(q, torch.cat([t_pos, t_neg], dim=2), values, self.scale)
        return (1.0 - self.lambda_init) * self.stage2_norm(out)

    # -- forward ----------------------------------------------------------------------

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: Optional[torch.Tensor] = None,
        is_causal: bool = False,
    ) -> torch.Tensor:
        check_input(x, attn_mask, is_causal, self.num_prefix_tokens, self.grid_size, "VCA")
        B, N, C = x.shape
        q, k, v = self._qkv_heads(x)
        lams = self.lambdas()
        lam1, lam2 = lams[0], lams[1]
        t_pos, t_neg = self.contrast_tokens(q)

        v_hat = self._global_contrast(t_pos, t_neg, k, v, lam1)
        out = self._patch_contrast(q, t_pos, t_neg, v_hat, lam2)
        out = out.transpose(1, 2).reshape(B, N, C)

        if self.local_conv is not None:
            out = self._add_local(out, self._local(v))
        return self.proj_drop(self.proj(out))
