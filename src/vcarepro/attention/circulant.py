"""Circulant Attention (CA), arXiv 2512.21542; after LeapLabTHU/Circulant-Attention
``models/ca_deit.py`` ``CirculantAttention`` (docs/family.md compares it).

The attention matrix over the H x W patch grid (M patches, positions adding
cyclically) is block circulant with circulant blocks (BCCB): A[i, j] = a[j - i].
Per group of d = ``channels_per_kernel`` channels the kernel is
a = softmax_s(rho * sum_c sum_n q_c[n] k_c[n + s] / sqrt(d)), o_c = A v_c, and
y = proj(o * SiLU(x Wg + bg)) (``gate=False`` drops the gate). l / (rho M) is
the Frobenius-nearest BCCB projection of q k^T / sqrt(d), so A is the row
softmax of that BCCB logit matrix.

``logit_divisor``: "sqrt_n" (default, rho = M^-1/2) is what ca_deit.py computes
(ortho-normed rfft2 / irfft2), although its comment claims the paper's 1/N;
"n" (rho = 1/M) is the paper's eq. 15, exactly the BCCB projection.

d = 1 is the method ("We use d=1 in practice", ca_deit.py); d > 1 shares a
kernel among d channels, an ablation. ``num_heads`` is accepted for the common
constructor only, as the official ``Block`` never passes it on;
``self.num_heads`` is dim / d and ``self.head_dim`` is d.

The fast path is O(M log M) per channel by rfft2. Without "global" prefix
tokens it follows the official order (FFT of x, then the real qkv weights on
the spectrum: fewer transforms; a qkv bias enters only the zero-frequency bin);
with them q, k, v are computed per token, since prefix queries need the
patches' real keys and values. FFTs, softmax and products run in float32
(float64 for float64 input): torch.fft has no CPU bf16, and the official
``Linear`` casts to float32 too. Tests hold it to the attention matrix
materialised from the equations (q k^T per group, each cyclic diagonal
averaged, the row softmax), no FFT.

Prefix tokens: the official model has none (it mean-pools), and a token outside
the grid has no cyclic shift, so patches attend to the grid only.
``prefix_attention="global"`` (default) makes each prefix token an ordinary
per-group softmax query over all N tokens, so DeiT's class token still
gathers; "none" gives prefix tokens no attention output, for models that pool.
The gate applies to every token.

attn_drop drops shifts of a (the same for every row, so A stays BCCB); the
official layer has none. qk_norm is refused: with d = 1 a norm over the head
dimension maps every query and key to a constant. ``flop_counter_mapping()``
counts the FFT ops, which FlopCounterMode otherwise counts as zero.
"""

import math
from typing import Any, Callable, Dict, Literal, Optional, Sequence, Type

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import register_notrace_module

from vcarepro.attention.grid import GridAttention, check_choice, check_token_count, check_unmasked
from vcarepro.core.errors import BadInput

LogitDivisor = Literal["sqrt_n", "n"]
PrefixAttention = Literal["global", "none"]

LOGIT_DIVISORS = ("sqrt_n", "n")
PREFIX_ATTENTIONS = ("global", "none")

# Channels per circulant kernel, d: "We use d=1 in practice, as discussed in Table 5"
# (comment in CirculantAttention.forward, models/ca_deit.py).
HEAD_DIM = 1
# Output gate SiLU(Linear(x)): ``self.gate = nn.Sequential(nn.Linear(dim, dim), nn.SiLU())``
# in CirculantAttention.__init__, models/ca_deit.py (a biased Linear).
GATE = True
# Logit scale: ca_deit.py's rfft2/irfft2 with norm='ortho' give M^-1/2 times the correlation sum.
LOGIT_DIVISOR = "sqrt_n"
# Our choice (the official model has no prefix token); see the module docstring.
PREFIX_ATTENTION = "global"

# FLOP convention for the FFT ops: 5 n log2 n real flops per complex transform of n points
# (n the product of the transformed sizes), half that for a real-input (r2c) or
# real-output (c2r) transform of n real points.
COMPLEX_FFT_FLOPS_PER_POINT_LOG2 = 5.0
REAL_FFT_FLOPS_PER_POINT_LOG2 = 2.5


# -- FLOP counting ------------------------------------------------------------------------


def _fft_flops(shape: Sequence[int], dim: Sequence[int], per_point_log2: float) -> int:
    n = math.prod(int(shape[d]) for d in dim)
    transforms = math.prod(int(s) for s in shape) // max(n, 1)
    return int(round(per_point_log2 * transforms * n * math.log2(n))) if n > 1 else 0


def _r2c_flops(self_shape, dim, normalization=None, onesided=True, out_shape=None, **kwargs) -> int:
    return _fft_flops(self_shape, dim, REAL_FFT_FLOPS_PER_POINT_LOG2)  # n = the real input's size


def _c2r_flops(self_shape, dim, normalization=None, last_dim_size=None, out_shape=None, **kwargs) -> int:
    return _fft_flops(out_shape, dim, REAL_FFT_FLOPS_PER_POINT_LOG2)  # n = the real output's size


def _c2c_flops(self_shape, dim, normalization=None, forward=True, out_shape=None, **kwargs) -> int:
    return _fft_flops(self_shape, dim, COMPLEX_FFT_FLOPS_PER_POINT_LOG2)


def flop_counter_mapping() -> Dict[Any, Callable[..., int]]:
    """``custom_mapping`` for ``torch.utils.flop_counter.FlopCounterMode`` that counts the FFT ops.

    By the convention above (backward passes use the same ops, so they count too); the counter
    reports flops, 2 per multiply-accumulate, so a complex transform adds 2.5 n log2 n "MACs".
    """
    aten = torch.ops.aten
    return {aten._fft_r2c: _r2c_flops, aten._fft_c2r: _c2r_flops, aten._fft_c2c: _c2c_flops}


def _shape_text(x: torch.Tensor) -> str:
    """(2, 5, 48), as ``tuple(x.shape)`` prints, also under TorchScript."""
    dims = [str(d) for d in x.shape]
    return "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"


# -- the layer ------------------------------------------------------------------------------


# A leaf for torch.fx (timm's notrace module): its checks and FFT path branch on the input's dtype and shape
# (the working precision, the (B, N, C) check) and write the qkv bias into one frequency bin in place.
@register_notrace_module
class CirculantAttention(GridAttention):
    """Circulant Attention, a drop-in replacement for timm's ``Attention`` (see the module docstring).

    ``num_heads`` is accepted and ignored (the method is one kernel per channel); ``channels_per_kernel`` is the
    number of channels sharing a kernel (1, as published). Parameter names match ca_deit.py
    (``qkv``, ``gate.0``, ``proj``), so an official state dict loads.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *,
        channels_per_kernel: int = HEAD_DIM,
        gate: bool = GATE,
        logit_divisor: LogitDivisor = LOGIT_DIVISOR,
        prefix_attention: PrefixAttention = PREFIX_ATTENTION,
        **common: Any,
    ) -> None:
        if not isinstance(channels_per_kernel, int) or channels_per_kernel < 1 or dim % channels_per_kernel:
            raise BadInput(
                f"channels_per_kernel={channels_per_kernel} must be a positive divisor of dim={dim}; the method uses 1."
            )
        if common.get("qk_norm"):
            raise BadInput(
                "circulant attention does not support qk_norm (with one channel per kernel a norm over "
                "it makes every query and key constant); build it with qk_norm=False."
            )
        # the kernels are the "heads" (head_dim = channels_per_kernel); the num_heads argument is ignored
        super().__init__(dim, dim // channels_per_kernel, **common)
        check_choice("logit_divisor", logit_divisor, LOGIT_DIVISORS)
        check_choice("prefix_attention", prefix_attention, PREFIX_ATTENTIONS)
        self.logit_divisor = logit_divisor
        self.prefix_attention = prefix_attention
        self.gate = nn.Sequential(nn.Linear(dim, dim), nn.SiLU()) if gate else None
        self.attn_drop = nn.Dropout(self.attn_drop_p)
        self._init_proj()

    def _init_qkv(self, dim: int, qkv_bias: bool, qk_norm: bool, norm_layer: Optional[Type[nn.Module]]) -> None:
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)  # no q / k norms: qk_norm is refused

    def init_weights(self) -> None:
        """No parameters of its own: qkv, gate and proj are Linears, which timm's ViT init handles
        (ca_deit.py's ``_init_vit_weights``: trunc_normal std .02, zero bias, for all three)."""

    def extra_repr(self) -> str:
        return (
            f"grid_size={self.grid_size}, prefix={self.num_prefix_tokens}, head_dim={self.head_dim}, "
            f"gate={self.gate is not None}, logit_divisor={self.logit_divisor}, "
            f"prefix_attention={self.prefix_attention}"
        )

    # -- shared pieces ----------------------------------------------------------

    def _check_tokens(self, N: int) -> None:
        check_token_count(N, self.num_prefix_tokens, self.grid_size, "circulant attention")

    def logit_scale(self) -> float:
        """rho / sqrt(d): the factor on the plain cross-correlation sum."""
        M = self.grid_size[0] * self.grid_size[1]
        rho = M**-0.5 if self.logit_divisor == "sqrt_n" else 1.0 / M
        return rho * self.scale

    @staticmethod
    def _work_dtype(x: torch.Tensor) -> torch.dtype:
        # float32 for bf16 / fp16 / fp32 input, float64 for float64
        return torch.promote_types(x.dtype, torch.float32)

    def _prefix_global(self, q_prefix: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Prefix queries over all N tokens, per group of d channels: (B, P, C)."""
        B, P, C = q_prefix.shape
        dropout_p = self.attn_drop_p if self.training else 0.0
        q, k, v = self._split_heads(q_prefix), self._split_heads(k), self._split_heads(v)
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=self.scale)
        return out.transpose(1, 2).reshape(B, P, C)

    def _finish(self, x: torch.Tensor, mixed: torch.Tensor) -> torch.Tensor:
        out = mixed.to(x.dtype)
        if self.gate is not None:
            gate = self.gate(x)
            out = out.to(gate.dtype) * gate
        return self.proj_drop(self.proj(out))

    # -- fast path: FFTs over the grid -------------------------------------------------

    def _qkv_spectrum(self, x_grid: torch.Tensor, work: torch.dtype) -> torch.Tensor:
        """Spectra of q, k, v from the spectrum of x: (B, H, W//2+1, 3C) complex (official order)."""
        B, H, W, C = x_grid.shape
        spectrum = torch.fft.rfft2(x_grid.to(work), dim=(1, 2))
        parts = torch.view_as_real(spectrum).movedim(-1, -2)  # (B, H, Wr, 2, C): real, imaginary
        weight = self.qkv.weight
        out = F.linear(parts.to(weight.dtype), weight).to(work)  # real weights act on both parts
        if self.qkv.bias is not None:  # a constant's spectrum: M * b at frequency 0
            dc = torch.zeros_like(out[0])
            dc[0, 0, 0] = self.qkv.bias.to(work) * (H * W)
            out = out + dc
        return torch.view_as_complex(out.movedim(-2, -1).contiguous())

    def _circulant_fft(self, q_f: torch.Tensor, k_f: torch.Tensor, v_f: torch.Tensor) -> torch.Tensor:
        """o = A v on the grid from the spectra (B, H, Wr, C): returns (B, M, C) real."""
        B, H, Wr, C = q_f.shape
        W = self.grid_size[1]
        G, d = self.num_heads, self.head_dim
        corr = torch.conj(q_f) * k_f
        if d > 1:
            corr = corr.reshape(B, H, Wr, G, d).sum(-1)
        logits = torch.fft.irfft2(corr, s=(H, W), dim=(1, 2)) * self.logit_scale()  # (B, H, W, G)
        kernel = self.attn_drop(logits.reshape(B, H * W, G).softmax(dim=1))
        kernel_f = torch.fft.rfft2(kernel.reshape(B, H, W, G), dim=(1, 2))
        out_f = torch.conj(kernel_f).unsqueeze(-1) * v_f.reshape(B, H, Wr, G, d)
        out = torch.fft.irfft2(out_f.reshape(B, H, Wr, C), s=(H, W), dim=(1, 2))
        return out.reshape(B, H * W, C)

    def _forward_fft(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        H, W = self.grid_size
        P = self.num_prefix_tokens
        work = self._work_dtype(x)
        if P and self.prefix_attention == "global":
            # prefix queries need the patches' keys and values per token: project, then transform q, k, v
            qkv = self.qkv(x).to(work)
            q, k, v = qkv.chunk(3, dim=-1)
            spectra = torch.fft.rfft2(qkv[:, P:].reshape(B, H, W, 3 * C), dim=(1, 2))
            q_f, k_f, v_f = spectra.chunk(3, dim=-1)
            grid = self._circulant_fft(q_f, k_f, v_f)
            prefix = self._prefix_global(q[:, :P], k, v).to(work)
        else:
            spectra = self._qkv_spectrum(x[:, P:].reshape(B, H, W, C), work)
            q_f, k_f, v_f = spectra.chunk(3, dim=-1)
            grid = self._circulant_fft(q_f, k_f, v_f)
            prefix = grid.new_zeros(B, P, C)
        return torch.cat([prefix, grid], dim=1)

    # -- forward ---------------------------------------------------------------------------

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: Optional[torch.Tensor] = None,
        is_causal: bool = False,
    ) -> torch.Tensor:
        """``attn_mask`` / ``is_causal`` are accepted for timm's ``Block`` and must be unset."""
        check_unmasked(attn_mask, is_causal, "circulant attention")
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise BadInput(f"circulant attention expects tokens (B, N, {self.dim}), got shape {_shape_text(x)}.")
        self._check_tokens(x.shape[1])
        return self._finish(x, self._forward_fft(x))
