"""Control attentions that isolate one ingredient of VCA.

FLatten's DeiT-T ablation credits its depthwise term with +2.3 points, so part of VCA's
gain over MHSA may be its 3x3 depthwise local term rather than the contrast.
``mhsa+dwc`` (:class:`MhsaLocalConv`) is MHSA plus exactly that term; ``vca`` with
``local_conv=False`` is VCA without it (docs/family.md gives the decomposition).
"""

from typing import Any, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import use_fused_attn

from vcarepro.attention.grid import GridAttention, check_input, local_conv_layer


class MhsaLocalConv(GridAttention):
    """Multi-head self-attention plus VCA's local term (3x3 depthwise conv of v on the patch grid).

    softmax(q k^T / sqrt(d)) v over all N tokens, per head, as timm's ``Attention``; the
    patch tokens' outputs then get conv3x3_dw(v) added before the output projection, the
    prefix tokens none -- exactly where and how VCA adds it.
    """

    fused_attn: bool

    def __init__(self, dim: int, num_heads: int = 8, **common: Any) -> None:
        super().__init__(dim, num_heads, **common)
        self.fused_attn = use_fused_attn()
        self.attn_drop = nn.Dropout(self.attn_drop_p)
        self.local_conv = local_conv_layer(dim)  # exactly VCA's (attention/grid.py)
        self._init_proj()

    def init_weights(self) -> None:
        """Nothing beyond timm's init: the convolution keeps PyTorch's default, as VCA's does."""

    def extra_repr(self) -> str:
        return f"grid_size={self.grid_size}, prefix={self.num_prefix_tokens}"

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: Optional[torch.Tensor] = None,
        is_causal: bool = False,
    ) -> torch.Tensor:
        check_input(x, attn_mask, is_causal, self.num_prefix_tokens, self.grid_size, "MHSA+DWC")
        B, N, C = x.shape
        q, k, v = self._qkv_heads(x)
        if self.fused_attn:  # as timm's Attention: SDPA, or the map materialised where fused attention is off
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_drop_p if self.training else 0.0)
        else:
            out = self.attn_drop(((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1)) @ v
        out = out.transpose(1, 2).reshape(B, N, C)
        out = self._add_local(out, self._local(v))
        return self.proj_drop(self.proj(out))
