"""Focused Linear Attention (FLatten), arXiv 2308.00442; after
LeapLabTHU/FLatten-Transformer ``models/flatten_swin.py`` ``FocusedLinearAttention``
as of commit e205a01 (docs/family.md compares it).

k gets a learnable per-token row E; a(x) = (ReLU(x) + 1e-6) / softplus(s) and
the focusing map phi(x) = ||a|| / ||a ** p|| * a ** p are taken over all C
channels before the heads split, as the official code does. Per head
O = Q K^T V / (rowsum(Q K^T) + N eps), plus a k x k depthwise term of v
(one d-channel kernel shared by the heads, as the official ``dwc``).

The layer associates Q (K^T V / N) / (Q . mean(K) + eps), O(N d^2); tests hold
it to the N x N map materialised from the equations. Against fp16 overflow
(LeapLabTHU/FLatten-Transformer#15, #18) it scales by 1/N (the official fix), raises a / max(a) to
the power p (phi is invariant to the rescale and the power stays in (0, 1]),
and runs in float32 with autocast off: bf16 has the range but not the
resolution for eps = 1e-6.

Prefix tokens (the official models have none and mean-pool) are ordinary
queries and keys here (``prefix_pos_encoding`` gives their key rows); with no
grid position they get no depthwise term. ``set_grid_size`` resizes E's grid
rows bicubically, as the official ``load_pretrained`` does.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from typing import Any, Literal, Optional, Sequence, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import register_notrace_module

from vcarepro.attention.grid import GridAttention, check_choice, check_input, patch_grid
from vcarepro.core.errors import BadInput

PosEncoding = Literal["learned", "none"]
POS_ENCODINGS = ("learned", "none")

# Focusing power p; models/flatten_swin.py FocusedLinearAttention(focusing_factor=3),
# config.py _C.MODEL.LA.FOCUSING_FACTOR = 3 (every released model).
FOCUSING_FACTOR = 3
# Depthwise-conv kernel; FocusedLinearAttention(kernel_size=5), config.py _C.MODEL.LA.KERNEL_SIZE = 5.
DWC_KERNEL = 5
# Added after the ReLU so every feature is positive; flatten_swin.py: kernel_function(q) + 1e-6.
FEATURE_EPS = 1e-6
# Added to Q . mean(K); flatten_swin.py: z = 1 / (q @ k.mean(dim=-2, ...).transpose(-2, -1) + 1e-6).
NORMALIZER_EPS = 1e-6
# s starts at 0, so the features start divided by softplus(0) = ln 2; flatten_swin.py:
# self.scale = nn.Parameter(torch.zeros(size=(1, 1, dim))).
SCALE_INIT = 0.0
# E starts at 0; flatten_swin.py: self.positional_encoding = nn.Parameter(torch.zeros(1, Wh * Ww, dim)),
# never re-initialised (the official models' _init_weights touch only Linear and LayerNorm).
POS_ENCODING_INIT = 0.0
# How E follows a new grid; utils.py load_pretrained: F.interpolate(..., mode='bicubic').
POS_ENCODING_INTERPOLATION = "bicubic"


def focus(a: torch.Tensor, power: float) -> torch.Tensor:
    """phi(a) = ||a|| / ||a ** p|| * a ** p over the last dimension (a > 0).

    It raises a / max(a) to the power, not a: the same function, but the power cannot overflow.
    """
    norm = a.norm(dim=-1, keepdim=True)
    powered = (a / a.amax(dim=-1, keepdim=True)) ** power
    return powered / powered.norm(dim=-1, keepdim=True) * norm


# A leaf for torch.fx (timm's notrace module): its float32 island (autocast off on the input's device,
# float64 kept) branches on the input's dtype and device.
@register_notrace_module
class FocusedLinearAttention(GridAttention):
    """Focused Linear Attention, a drop-in replacement for timm's ``Attention``.

    It needs the token layout: ``grid_size`` (H, W) of the patch grid (for the
    depthwise convolution and the per-position key encoding) and
    ``num_prefix_tokens`` in front of it.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *,
        focusing_factor: float = FOCUSING_FACTOR,
        dwc_kernel: Optional[int] = DWC_KERNEL,
        pos_encoding: PosEncoding = "learned",
        # The official layer has one E row per token it is given; it is never given a
        # class token. True gives each prefix token its own learned key row (what the
        # official table would hold for a class token in the sequence, and what DeiT's
        # own position embedding gives it); False leaves prefix keys without one.
        prefix_pos_encoding: bool = True,
        **common: Any,
    ) -> None:
        # q and k get timm's per-head norms straight after the projection (before E and the feature map)
        super().__init__(dim, num_heads, **common)
        if not (isinstance(focusing_factor, (int, float)) and math.isfinite(focusing_factor) and focusing_factor > 0):
            raise BadInput(
                f"focusing_factor={focusing_factor!r} must be a positive number (the paper uses 3; 1 is plain "
                f"ReLU linear attention)."
            )
        if dwc_kernel is not None and (not isinstance(dwc_kernel, int) or dwc_kernel < 1 or dwc_kernel % 2 == 0):
            raise BadInput(
                f"dwc_kernel={dwc_kernel!r} must be a positive odd integer (5 in the paper) so the convolution keeps "
                f"the grid size, or None for no depthwise convolution."
            )
        check_choice("pos_encoding", pos_encoding, POS_ENCODINGS)
        if self.attn_drop_p:
            raise BadInput(
                f"attn_drop={self.attn_drop_p} has nothing to drop: focused linear attention never forms its "
                f"attention map (the official layer defines attn_drop and never applies it); use attn_drop=0."
            )

        self.focusing_factor = focusing_factor
        self.dwc_kernel = dwc_kernel
        self.pos_encoding_kind = pos_encoding
        self.prefix_pos_encoding = prefix_pos_encoding

        # s and E keep the official 3-D shapes (1, 1, C) and (1, L, C): the official optimizer
        # (optimizer.py set_weight_decay_and_lr) and timm's both exempt only 1-D parameters and
        # biases from weight decay, so both are decayed, as in the official training. s replaces the
        # base's float ``scale`` under the official name.
        self.scale = nn.Parameter(torch.empty(1, 1, dim))
        H, W = self.grid_size
        self.pos_encoding = (
            nn.Parameter(torch.empty(1, self._pos_prefix_rows + H * W, dim)) if pos_encoding == "learned" else None
        )
        self.dwc = (
            nn.Conv2d(self.head_dim, self.head_dim, dwc_kernel, padding=dwc_kernel // 2, groups=self.head_dim)
            if dwc_kernel is not None
            else None
        )
        self._init_proj()
        self.init_weights()

    # -- construction helpers -------------------------------------------------

    @property
    def _pos_prefix_rows(self) -> int:
        return self.num_prefix_tokens if self.prefix_pos_encoding else 0

    def init_weights(self) -> None:
        """The official initialisation of FLatten's own parameters (timm's ViT init handles the Linears)."""
        nn.init.constant_(self.scale, SCALE_INIT)
        if self.pos_encoding is not None:
            nn.init.constant_(self.pos_encoding, POS_ENCODING_INIT)
        if self.dwc is not None:
            self.dwc.reset_parameters()  # PyTorch's default, which the official models leave in place

    def set_grid_size(self, grid_size: Union[int, Sequence[int]]) -> None:
        """Follow a change of input resolution: E's grid rows are resized bicubically, prefix rows kept."""
        new = patch_grid(grid_size)
        if self.pos_encoding is not None and new != self.grid_size:
            (H, W), (h, w), P = self.grid_size, new, self._pos_prefix_rows
            table = self.pos_encoding.detach()
            work = torch.float64 if table.dtype == torch.float64 else torch.float32  # no half bicubic on CPU
            grid = table[:, P:].reshape(1, H, W, self.dim).permute(0, 3, 1, 2).to(work)
            grid = F.interpolate(grid, size=(h, w), mode=POS_ENCODING_INTERPOLATION, align_corners=False)
            grid = grid.permute(0, 2, 3, 1).reshape(1, h * w, self.dim).to(table.dtype)
            # a frozen table stays frozen (timm's set_input_size on a frozen model)
            self.pos_encoding = nn.Parameter(
                torch.cat([table[:, :P], grid], dim=1), requires_grad=self.pos_encoding.requires_grad
            )
        self.grid_size = new

    def extra_repr(self) -> str:
        return (
            f"grid_size={self.grid_size}, prefix={self.num_prefix_tokens}, focusing_factor={self.focusing_factor}, "
            f"dwc_kernel={self.dwc_kernel}, pos_encoding={self.pos_encoding_kind}, "
            f"prefix_pos_encoding={self.prefix_pos_encoding}"
        )

    # -- pieces shared by both paths ------------------------------------------

    def _key_encoding(self, dtype: torch.dtype) -> Optional[torch.Tensor]:
        """E as (1, N, C) with zero rows for prefix tokens that have none; None without E."""
        if self.pos_encoding is None:
            return None
        table = self.pos_encoding.to(dtype)
        missing = self.num_prefix_tokens - self._pos_prefix_rows
        return F.pad(table, (0, 0, missing, 0)) if missing else table

    def feature_maps(self, q: torch.Tensor, k: torch.Tensor):
        """phi(q), phi(k) over all C channels of each token, (B, N, C) in, (B, N, C) out."""
        encoding = self._key_encoding(k.dtype)
        if encoding is not None:
            k = k + encoding
        s = F.softplus(self.scale.to(q.dtype))
        q = (F.relu(q) + FEATURE_EPS) / s
        k = (F.relu(k) + FEATURE_EPS) / s
        return focus(q, self.focusing_factor), focus(k, self.focusing_factor)

    def _local(self, v: torch.Tensor) -> torch.Tensor:
        """Depthwise conv of the grid values, one kernel shared by the heads: (B, heads, N, d) -> (B, H*W, C)."""
        B = v.shape[0]
        H, W = self.grid_size
        grid = v[:, :, self.num_prefix_tokens :].transpose(-1, -2).reshape(B * self.num_heads, self.head_dim, H, W)
        local = self.dwc(grid).reshape(B, self.dim, H * W)
        return local.transpose(1, 2)

    @staticmethod
    def _linear(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Q (K^T V / N) / (Q . mean(K) + eps), linear in N; each factor scaled by N^-1/2 as the official fix."""
        N = k.shape[-2]
        kv = (k * N**-0.5).transpose(-2, -1) @ (v * N**-0.5)
        z = 1.0 / (q @ k.mean(dim=-2, keepdim=True).transpose(-2, -1) + NORMALIZER_EPS)
        return (q @ kv) * z

    # -- forward ----------------------------------------------------------------------

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: Optional[torch.Tensor] = None,
        is_causal: bool = False,
    ) -> torch.Tensor:
        check_input(x, attn_mask, is_causal, self.num_prefix_tokens, self.grid_size, "FocusedLinearAttention")
        B, N, C = x.shape

        q, k, v = self._qkv_heads(x)
        # the feature maps mix all heads' channels, so they work on (B, N, C)
        q, k = (t.transpose(1, 2).reshape(B, N, C) for t in (q, k))

        # float32 island (float64 stays float64): see the module docstring
        work = torch.float64 if x.dtype == torch.float64 else torch.float32
        # the meta device (timm's shape checks) has no autocast to switch off
        with torch.autocast(device_type=x.device.type, enabled=False) if x.device.type != "meta" else nullcontext():
            fq, fk = self.feature_maps(q.to(work), k.to(work))
            out = self._linear(self._split_heads(fq), self._split_heads(fk), v.to(work))
        out = out.to(v.dtype).transpose(1, 2).reshape(B, N, C)

        if self.dwc is not None:
            out = self._add_local(out, self._local(v))
        return self.proj_drop(self.proj(out))
