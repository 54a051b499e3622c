"""Agent Attention, arXiv 2312.08874; after LeapLabTHU/Agent-Attention
``agent_transformer/models/agent_deit.py`` ``AgentAttention`` (docs/family.md
compares it).

Per head, n agent tokens a (the patch-grid queries adaptively pooled, as the
official ``nn.AdaptiveAvgPool2d``) aggregate S = softmax(a k^T / sqrt(d) + B_an),
v_a = S v, and broadcast o = softmax(q a^T / sqrt(d) + B_na) v_a: O(N n C).
A k x k depthwise term of v is added to the patch outputs.

Prefix tokens are keys / values of the aggregation and queries of the
broadcast, never pooled nor convolved, with a learned (head, agent) bias each
way: P = 1 is the official DeiT layer (``ac_bias`` / ``ca_bias``), P = 0 the
Swin / PVT / DiT form. The position biases are the official ones, the 7 x 7
grids resized bilinearly each forward; the row / column biases are sized to
``grid_size`` and resized by 1-D linear interpolation on ``set_grid_size`` or
loading another grid's state dict, as the official ``load_pretrained`` does, so
the parameter count grows with the grid as the published Agent-DeiT-S does.

Grids are (H, W), not the official sqrt(N) x sqrt(N), so non-square grids work;
an agent grid larger than the patch grid would repeat queries and is refused.
Both maps are softmaxes, so nothing unbounded overflows in bf16; the biases are
built in float32. Each map is one ``_attend``: SDPA, or materialised where
timm's fused attention is off (``fused_attn``); tests hold both to the equations.
"""

from typing import Any, Dict, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import trunc_normal_, use_fused_attn

from vcarepro.attention.grid import GridAttention, check_input, patch_grid, token_grid
from vcarepro.core.errors import BadInput

# Agent tokens per layer: ``AgentAttention(agent_num=49)`` in agent_deit.py, and
# ``AGENT.NUM: 49-49-49-49`` in cfgs/agent_deit_t.yaml and agent_deit_s.yaml (81 for DeiT-B).
AGENT_TOKENS = 49
# Depthwise conv on v: ``nn.Conv2d(dim, dim, kernel_size=(3, 3), padding=1, groups=dim)`` in agent_deit.py.
DWC_KERNEL = 3
# Side of the coarse agent<->patch bias grids: ``an_bias`` / ``na_bias`` are
# (num_heads, agent_num, 7, 7) in agent_deit.py (and agent_swin.py, agent_pvt.py),
# whatever the agent count or window, and are resized bilinearly to the window.
COARSE_BIAS_SIDE = 7
# Every bias starts at ``trunc_normal_(std=.02)`` in agent_deit.py; the conv keeps PyTorch's default init.
BIAS_INIT_STD = 0.02

# Our parameter name -> the official one in agent_deit.py (same shapes, so a checkpoint converts by renaming;
# the prefix biases have P = 1 columns there).
OFFICIAL_NAMES = {
    "agent_patch_bias": "an_bias",
    "patch_agent_bias": "na_bias",
    "agent_row_bias": "ah_bias",
    "agent_col_bias": "aw_bias",
    "row_agent_bias": "ha_bias",
    "col_agent_bias": "wa_bias",
    "agent_prefix_bias": "ac_bias",
    "prefix_agent_bias": "ca_bias",
    "local_conv": "dwc",
}
# Biases with one entry per patch row (axis 3) or column (axis 3 / 4 as below): name -> (axis, "rows" | "cols").
_GRID_BIASES = {
    "agent_row_bias": (3, "rows"),  # (1, heads, n, H, 1)
    "agent_col_bias": (4, "cols"),  # (1, heads, n, 1, W)
    "row_agent_bias": (2, "rows"),  # (1, heads, H, 1, n)
    "col_agent_bias": (3, "cols"),  # (1, heads, 1, W, n)
}


def resize_along(tensor: torch.Tensor, axis: int, size: int) -> torch.Tensor:
    """1-D linear resize (align_corners=False) of ``tensor`` along ``axis``, computed in float32 at least."""
    if tensor.shape[axis] == size:
        return tensor
    moved = tensor.movedim(axis, -1)
    flat = moved.reshape(1, -1, moved.shape[-1]).to(torch.promote_types(tensor.dtype, torch.float32))
    out = F.interpolate(flat, size=size, mode="linear", align_corners=False)
    return out.reshape(*moved.shape[:-1], size).movedim(-1, axis).to(tensor.dtype)


class AgentAttention(GridAttention):
    """Agent Attention, a drop-in replacement for timm's ``Attention``.

    Like VCA it needs the token layout: ``grid_size`` (H, W) of the patch grid and
    ``num_prefix_tokens`` in front of it. ``dwc_kernel=0`` drops the depthwise
    convolution and ``position_bias=False`` drops every bias (the paper's ablations).
    """

    fused_attn: bool

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *,
        agent_tokens: Union[int, Sequence[int]] = AGENT_TOKENS,
        dwc_kernel: int = DWC_KERNEL,
        position_bias: bool = True,
        coarse_bias_side: int = COARSE_BIAS_SIDE,
        **common: Any,
    ) -> None:
        super().__init__(dim, num_heads, **common)
        if dwc_kernel < 0 or (dwc_kernel and dwc_kernel % 2 == 0):
            raise BadInput(
                f"dwc_kernel={dwc_kernel} must be 0 (no depthwise convolution) or odd such as 3, "
                f"so that the convolution keeps the grid size."
            )
        if coarse_bias_side < 1:
            raise BadInput(f"coarse_bias_side={coarse_bias_side} must be at least 1 (the official value is 7).")

        self.agent_grid = token_grid(agent_tokens, "agent_tokens")
        self.num_agents = self.agent_grid[0] * self.agent_grid[1]
        self.dwc_kernel = dwc_kernel
        self.fused_attn = use_fused_attn()
        self.grid_size = self._validated_grid(self.grid_size)

        self.attn_drop = nn.Dropout(self.attn_drop_p)
        self.local_conv = nn.Conv2d(dim, dim, dwc_kernel, padding=dwc_kernel // 2, groups=dim) if dwc_kernel else None

        heads, n, P = num_heads, self.num_agents, self.num_prefix_tokens
        (H, W), s = self.grid_size, coarse_bias_side
        self.position_bias = position_bias
        if position_bias:
            self.agent_patch_bias = nn.Parameter(torch.empty(heads, n, s, s))
            self.patch_agent_bias = nn.Parameter(torch.empty(heads, n, s, s))
            self.agent_row_bias = nn.Parameter(torch.empty(1, heads, n, H, 1))
            self.agent_col_bias = nn.Parameter(torch.empty(1, heads, n, 1, W))
            self.row_agent_bias = nn.Parameter(torch.empty(1, heads, H, 1, n))
            self.col_agent_bias = nn.Parameter(torch.empty(1, heads, 1, W, n))
            self.agent_prefix_bias = nn.Parameter(torch.empty(1, heads, n, P)) if P else None
            self.prefix_agent_bias = nn.Parameter(torch.empty(1, heads, P, n)) if P else None

        self._init_proj()
        self.init_weights()

    # -- construction helpers -------------------------------------------------

    def _validated_grid(self, grid_size: Union[int, Sequence[int]]) -> Tuple[int, int]:
        H, W = patch_grid(grid_size)
        h, w = self.agent_grid
        if h > H or w > W:
            raise BadInput(
                f"the {h}x{w} agent grid is larger than the {H}x{W} patch grid, so pooling would repeat queries; "
                f"choose at most {min(H, W) ** 2} agent tokens (e.g. agent_tokens={min(H, W) ** 2}) or a larger input."
            )
        return (H, W)

    def _grid_bias_names(self):
        return list(_GRID_BIASES) if self.position_bias else []

    def set_grid_size(self, grid_size: Union[int, Sequence[int]]) -> None:
        """Follow a change of input resolution (timm's ``set_input_size``).

        The coarse 7x7 biases follow by themselves; the row / column biases are
        resized by linear interpolation, as the official ``load_pretrained`` does.
        """
        self.grid_size = self._validated_grid(grid_size)
        H, W = self.grid_size
        for name in self._grid_bias_names():
            axis, kind = _GRID_BIASES[name]
            old = getattr(self, name)
            with torch.no_grad():
                new = resize_along(old.detach(), axis, H if kind == "rows" else W)
            if new.shape != old.shape:
                setattr(self, name, nn.Parameter(new, requires_grad=old.requires_grad))

    def _load_from_state_dict(self, state_dict: Dict[str, Any], prefix: str, *args: Any, **kwargs: Any) -> None:
        # A checkpoint saved at another grid: resize its row / column biases to this grid, as the
        # official load_pretrained (agent_transformer/utils.py) does before loading.
        H, W = self.grid_size
        for name in self._grid_bias_names():
            key = prefix + name
            axis, kind = _GRID_BIASES[name]
            saved = state_dict.get(key)
            if isinstance(saved, torch.Tensor) and saved.dim() == 5:
                state_dict[key] = resize_along(saved, axis, H if kind == "rows" else W)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def init_weights(self) -> None:
        """Initialise the biases as the official layer (timm's ViT init then handles the Linears)."""
        if self.position_bias:
            for name in OFFICIAL_NAMES:
                p = getattr(self, name)
                if isinstance(p, nn.Parameter):
                    trunc_normal_(p, std=BIAS_INIT_STD)

    def extra_repr(self) -> str:
        return (
            f"grid_size={self.grid_size}, agent_grid={self.agent_grid}, prefix={self.num_prefix_tokens}, "
            f"dwc_kernel={self.dwc_kernel}, position_bias={self.position_bias}"
        )

    # -- the biases, the agents and the attention -----------------------------------------

    def position_biases(self) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
        """(B_an, B_na): additive logits (float32 at least) of shape (1, heads, n, N) and (1, heads, N, n); None if off.

        Token order along N is the input's: prefix tokens first, then the row-major patch grid.
        """
        if not self.position_bias or not hasattr(self, "agent_patch_bias"):  # hasattr: static for TorchScript
            return None, None
        heads, n, P = self.num_heads, self.num_agents, self.num_prefix_tokens
        H, W = self.grid_size
        dtype = torch.promote_types(self.agent_patch_bias.dtype, torch.float32)  # bf16 parameters: sum in fp32
        # the row / column biases are sized to the grid (set_grid_size keeps them so)
        rows_a, cols_a = self.agent_row_bias.to(dtype), self.agent_col_bias.to(dtype)
        rows_n, cols_n = self.row_agent_bias.to(dtype), self.col_agent_bias.to(dtype)
        coarse_an = F.interpolate(self.agent_patch_bias.to(dtype), size=(H, W), mode="bilinear", align_corners=False)
        coarse_na = F.interpolate(self.patch_agent_bias.to(dtype), size=(H, W), mode="bilinear", align_corners=False)
        agent_to_patch = coarse_an.reshape(1, heads, n, H * W) + (rows_a + cols_a).reshape(1, heads, n, H * W)
        patch_to_agent = coarse_na.reshape(1, heads, n, H * W).transpose(-1, -2) + (rows_n + cols_n).reshape(
            1, heads, H * W, n
        )
        agent_prefix, prefix_agent = self.agent_prefix_bias, self.prefix_agent_bias
        if P and agent_prefix is not None and prefix_agent is not None:  # both exist exactly when P > 0
            agent_to_patch = torch.cat([agent_prefix.to(dtype), agent_to_patch], dim=-1)
            patch_to_agent = torch.cat([prefix_agent.to(dtype), patch_to_agent], dim=-2)
        return agent_to_patch, patch_to_agent

    def agents(self, q: torch.Tensor) -> torch.Tensor:
        """The n agent tokens (B, heads, n, d): adaptive average pooling of the patch-grid queries."""
        return self._pooled_queries(q, self.agent_grid)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        """softmax(q k^T / sqrt(d) + bias) v: SDPA, or the map materialised where fused attention is off."""
        if bias is not None:
            bias = bias.to(q.dtype)
        if self.fused_attn:
            dropout_p = self.attn_drop_p if self.training else 0.0
            return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p, scale=self.scale)
        logits = (q * self.scale) @ k.transpose(-2, -1)
        if bias is not None:
            logits = logits + bias
        return self.attn_drop(logits.softmax(dim=-1)) @ v

    # -- forward ----------------------------------------------------------------------

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: Optional[torch.Tensor] = None,
        is_causal: bool = False,
    ) -> torch.Tensor:
        check_input(x, attn_mask, is_causal, self.num_prefix_tokens, self.grid_size, "Agent attention")
        B, N, C = x.shape
        q, k, v = self._qkv_heads(x)
        agents = self.agents(q)
        agent_to_token, token_to_agent = self.position_biases()

        agent_v = self._attend(agents, k, v, agent_to_token)  # aggregation: n x N map
        out = self._attend(q, agents, agent_v, token_to_agent)  # broadcast: N x n map
        out = out.transpose(1, 2).reshape(B, N, C)

        if self.local_conv is not None:
            out = self._add_local(out, self._local(v))
        return self.proj_drop(self.proj(out))
