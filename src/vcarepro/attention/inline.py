"""InLine attention: injective linear attention with a local attention residual.

arXiv 2412.06590; after LeapLabTHU/InLine ``models/inline_deit.py``
``InLineAttention`` (docs/family.md compares it). Per head, with s = d^-1/2 / N:

    A_ij = s phi(q_i) . phi(k_j) - (1/N) sum_l s phi(q_i) . phi(k_l) + 1/N
    o    = proj(concat_heads(A v) + l)

where l is a 3x3 depthwise convolution of v over the patch grid whose kernel,
per sample and channel, an MLP (``residual``) predicts from the mean token.
Rows of A sum to 1 for any scores (not a distribution: entries can be
negative), which makes the map injective where normalised linear attention is
scale invariant. The paper omits s; the official code folds it into phi(q),
so A here is what the released models compute.

A v is computed linearly in N on centred keys and values,
s phi(q_i) (sum_j phi(k_j)_c^T v_j,c) + mean_j v_j: the official form
rearranged so that no two large terms cancel in bf16 / fp16 (keys sharing a
large mean otherwise cost 16% in fp16, 140% in bf16). The k / v sum is scaled
as the official code does, so it cannot grow with N. Tests hold it to A
materialised from the equations and to the nine shifted neighbours summed.

Prefix tokens, as the official DeiT handles the class token: ordinary tokens of
the global term and of the mean that predicts the kernel, with no local term.
Parameter names and shapes are the official ones, so a released InLine-DeiT
checkpoint's attention weights load.
"""

from typing import Any, Callable, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from vcarepro.attention.grid import GridAttention, check_input, value_grid
from vcarepro.core.errors import BadInput

# Kernel functions phi offered by the official code (models/inline_swin.py,
# InLineAttention(kernel_func=...)); none of the released models passes one, so
# every published InLine model, and models/inline_deit.py, uses the identity.
KERNELS = ("identity", "relu", "leakyrelu", "exp")
DEFAULT_KERNEL = "identity"
# exp_kernel(x, t=0.2) = exp(0.2 x) in models/inline_swin.py.
EXP_KERNEL_TEMPERATURE = 0.2
# The local residual predicts one 3x3 kernel per channel: the second Conv1d of
# InLineAttention.residual outputs dim * 9 channels, reshaped to (B*C, 1, 3, 3)
# and applied with padding 1 (models/inline_deit.py).
LOCAL_KERNEL_SIZE = 3
# Published models all have the local residual (models/inline_deit.py always builds it).
DEFAULT_LOCAL_RESIDUAL = True


def kernel_function(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """phi for a kernel name in KERNELS (elementwise)."""
    if name == "identity":
        return lambda t: t
    if name == "relu":
        return F.relu
    if name == "leakyrelu":
        return F.leaky_relu  # nn.LeakyReLU's default slope 0.01, as the official code uses
    if name == "exp":
        return lambda t: torch.exp(EXP_KERNEL_TEMPERATURE * t)
    raise BadInput(f"unknown kernel {name!r}; choose one of {', '.join(map(repr, KERNELS))}.")


class InLineAttention(GridAttention):
    """Injective linear attention with the local attention residual, a drop-in for timm's ``Attention``.

    Knobs beyond timm's: ``kernel`` is the feature map phi applied to queries and
    keys ("identity", the published choice; "relu", "leakyrelu", "exp");
    ``local_residual`` switches the predicted 3x3 depthwise term on (published)
    or off (the paper's ablation without local modelling).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *,
        kernel: str = DEFAULT_KERNEL,
        local_residual: bool = DEFAULT_LOCAL_RESIDUAL,
        **common: Any,
    ) -> None:
        super().__init__(dim, num_heads, **common)
        if self.attn_drop_p:
            raise BadInput(
                f"attn_drop={self.attn_drop_p}: InLine never forms the attention map on its linear path (the "
                f"official code ignores attn_drop too); set attn_drop=0 and use proj_drop or drop_path instead."
            )
        self.phi = kernel_function(kernel)
        self.kernel = kernel
        self.exp_temperature = EXP_KERNEL_TEMPERATURE
        self.local_kernel_size = LOCAL_KERNEL_SIZE  # an attribute, which TorchScript reads (a global it does not)

        # Predicts the local kernels from the mean token: two 1x1 convolutions grouped by
        # head with a GELU between, dim -> dim -> 9 * dim (models/inline_deit.py,
        # InLineAttention.residual). Conv1d, not Linear, so official checkpoints load.
        taps = LOCAL_KERNEL_SIZE * LOCAL_KERNEL_SIZE
        self.residual = (
            nn.Sequential(
                nn.Conv1d(dim, dim, kernel_size=1, groups=num_heads),
                nn.GELU(),
                nn.Conv1d(dim, dim * taps, kernel_size=1, groups=num_heads),
            )
            if local_residual
            else None
        )
        self._init_proj()
        self.init_weights()

    # -- construction helpers -------------------------------------------------

    def init_weights(self) -> None:
        """PyTorch's default init for the local-kernel predictor, as in the official models (timm's ViT
        init only touches Linear and norm layers, so the official Conv1d kept its default)."""
        if self.residual is not None:
            for layer in self.residual:
                if isinstance(layer, nn.Conv1d):
                    layer.reset_parameters()

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, num_heads={self.num_heads}, grid_size={self.grid_size}, "
            f"prefix={self.num_prefix_tokens}, kernel={self.kernel}, local_residual={self.residual is not None}"
        )

    # -- pieces shared by both paths ------------------------------------------

    def _qkv(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """phi(q), phi(k), v, each (B, heads, N, d)."""
        q, k, v = self._qkv_heads(x)
        return self._kernel(q), self._kernel(k), v

    def _kernel(self, t: torch.Tensor) -> torch.Tensor:
        """phi by name, as :func:`kernel_function` (``self.phi``) computes it; a branch, not a stored function,
        so that the layer scripts."""
        if self.kernel == "relu":
            return F.relu(t)
        if self.kernel == "leakyrelu":
            return F.leaky_relu(t)
        if self.kernel == "exp":
            return torch.exp(self.exp_temperature * t)
        return t

    def local_kernels(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, 3, 3): one 3x3 kernel per sample and channel, predicted from the mean of all N tokens."""
        B, _, C = x.shape
        residual = self.residual
        assert residual is not None
        r = residual(x.mean(dim=1).unsqueeze(-1))  # (B, 9C, 1); channel c owns outputs 9c .. 9c+8
        return r.reshape(B, C, self.local_kernel_size, self.local_kernel_size)

    # -- the global and the local term -------------------------------------------------

    def _global_linear(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """sum_j A_ij v_j by associativity, O(N d^2) per head, on centred keys and values.

        sum_j A_ij v_j = s phi(q_i) sum_j (k_j - k_mean)^T (v_j - v_mean) + v_mean, because the centred
        keys sum to zero. The official form s q (sum_j k_j^T v_j) + (1 - N s q . k_mean) v_mean adds two
        terms that nearly cancel when the keys share a large mean, losing the result in bf16 / fp16."""
        N = k.shape[2]
        k_mean, v_mean = k.mean(dim=2, keepdim=True), v.mean(dim=2, keepdim=True)
        root = (self.scale / N) ** 0.5  # each factor carries sqrt(s): the d x d sum is a mean (fp16/bf16-safe)
        kv = ((k - k_mean) * root).transpose(-2, -1) @ ((v - v_mean) * root)  # (B, heads, d, d)
        return q @ kv + v_mean

    def _local_conv(self, v: torch.Tensor, kernels: torch.Tensor) -> torch.Tensor:
        """Per-sample depthwise 3x3 conv of the patch values as one grouped conv2d -> (B, H*W, C)."""
        B, C = kernels.shape[:2]
        H, W = self.grid_size
        grid = value_grid(v, self.grid_size, self.num_prefix_tokens).reshape(1, B * C, H, W)
        out = F.conv2d(
            grid,
            kernels.reshape(B * C, 1, self.local_kernel_size, self.local_kernel_size),
            padding=self.local_kernel_size // 2,
            groups=B * C,
        )
        return out.reshape(B, C, H * W).transpose(1, 2)

    # -- forward ----------------------------------------------------------------------

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: Optional[torch.Tensor] = None,
        is_causal: bool = False,
    ) -> torch.Tensor:
        check_input(x, attn_mask, is_causal, self.num_prefix_tokens, self.grid_size, "InLine")
        B, N, C = x.shape
        q, k, v = self._qkv(x)
        out = self._global_linear(q, k, v).transpose(1, 2).reshape(B, N, C)
        if self.residual is not None:
            out = self._add_local(out, self._local_conv(v, self.local_kernels(x)))
        return self.proj_drop(self.proj(out))
