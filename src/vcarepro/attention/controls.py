"""Control attentions that isolate one ingredient of VCA.

VCA shares a 3x3 depthwise convolution of v on the patch grid (its "local term") with the
lab's other efficient attentions (Agent, FLatten, InLine). The FLatten paper's DeiT-T ablation
credits its own depthwise term with +2.3 points top-1,
so part of any gain over MHSA may be the convolution rather than the contrast. Two controls
separate them:

``mhsa+dwc``  MHSA plus exactly VCA's local term (:class:`MhsaLocalConv`, here);
``vca`` with ``local_conv=False``  VCA without it (an option of ``VisualContrastAttention``).

MHSA -> MHSA+DWC -> VCA-DWC -> VCA then splits VCA's gain into the convolution's share and
the contrast's.
"""
from __future__ import annotations

from typing import Optional, Sequence, Type, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import use_fused_attn

from .vca import local_conv_layer, local_term, patch_grid
from vcarepro.errors import BadInput



class MhsaLocalConv(nn.Module):
    """Multi-head self-attention plus VCA's local term (3x3 depthwise conv of v on the patch grid).

    softmax(q k^T / sqrt(d)) v over all N tokens, per head, as timm's ``Attention``; the
    patch tokens' outputs then get conv3x3_dw(v) added before the output projection, the
    prefix tokens none -- exactly where and how VCA adds it.
    """

    fused_attn: bool

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *,
        grid_size: Union[int, Sequence[int]],
        num_prefix_tokens: int = 1,
        layer_index: int = 0,
        qkv_bias: bool = False,
        qk_norm: bool = False,
        proj_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        norm_layer: Optional[Type[nn.Module]] = None,
    ) -> None:
        super().__init__()
        if dim % num_heads != 0:
            raise BadInput(f"dim={dim} is not divisible by num_heads={num_heads}; pick a head count that divides it.")
        if qk_norm and norm_layer is None:
            raise BadInput("qk_norm=True needs a norm_layer (e.g. nn.LayerNorm).")
        if num_prefix_tokens < 0:
            raise BadInput(f"num_prefix_tokens={num_prefix_tokens} must be >= 0.")
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim ** -0.5
        self.num_prefix_tokens = num_prefix_tokens
        self.layer_index = layer_index
        self.grid_size = patch_grid(grid_size)
        self.fused_attn = use_fused_attn()
        self.attn_drop_p = attn_drop

        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.q_norm = norm_layer(self.head_dim) if qk_norm else nn.Identity()
        self.k_norm = norm_layer(self.head_dim) if qk_norm else nn.Identity()
        self.attn_drop = nn.Dropout(attn_drop)
        self.local_conv = local_conv_layer(dim)   # exactly VCA's (attention/vca.py)
        self.proj = nn.Linear(dim, dim, bias=proj_bias)
        self.proj_drop = nn.Dropout(proj_drop)

    def set_grid_size(self, grid_size: Union[int, Sequence[int]]) -> None:
        """Follow a change of input resolution (the convolution has no grid-sized parameter)."""
        self.grid_size = patch_grid(grid_size)

    def init_weights(self) -> None:
        """Nothing beyond timm's init: the convolution keeps PyTorch's default, as VCA's does."""

    def extra_repr(self) -> str:
        return f"grid_size={self.grid_size}, prefix={self.num_prefix_tokens}"

    def _local(self, v: torch.Tensor) -> torch.Tensor:
        return local_term(self.local_conv, v, self.grid_size, self.num_prefix_tokens)

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: Optional[torch.Tensor] = None,
        is_causal: bool = False,
        reference: Optional[bool] = None,
    ) -> torch.Tensor:
        """``reference=True`` materialises the attention map; the default follows ``use_fused_attn()``."""
        if attn_mask is not None or is_causal:
            raise BadInput("MHSA+DWC does not support attention masks or causal attention; call it with neither.")
        B, N, C = x.shape
        H, W = self.grid_size
        if N != self.num_prefix_tokens + H * W:
            raise BadInput(
                f"MHSA+DWC got {N} tokens but expects {self.num_prefix_tokens} prefix + {H}x{W} grid = "
                f"{self.num_prefix_tokens + H * W}; build the model for this input size (img_size / patch_size)."
            )
        q, k, v = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        q, k = self.q_norm(q), self.k_norm(k)
        reference = (not self.fused_attn) if reference is None else reference
        if reference:
            attn = self.attn_drop(((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1))
            out = attn @ v
        else:
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_drop_p if self.training else 0.0)
        out = out.transpose(1, 2).reshape(B, N, C)
        P = self.num_prefix_tokens
        out = torch.cat([out[:, :P], out[:, P:] + self._local(v)], dim=1)
        return self.proj_drop(self.proj(out))
