"""The token-grid helpers and checks every attention layer and backbone here shares.

The grid-aware layers see (B, N, C) tokens: ``num_prefix_tokens`` prefix tokens followed
by a row-major H x W patch grid. Here are the grid helpers (``patch_grid``, ``token_grid``),
the argument and no-trace input checks, the 3x3 depthwise local term, and :class:`GridAttention`,
the layers' base: their shared arguments, layers and forward preamble as methods, so TorchScript
compiles them with the layer.
"""

import math
from typing import Optional, Sequence, Tuple, Type, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import register_notrace_function

from vcarepro.core.errors import BadInput

# VCA's local term: a 3x3 depthwise convolution of v on the patch grid (shared with the mhsa+dwc control).
LOCAL_CONV_KERNEL = 3


def token_grid(value: Union[int, Sequence[int]], option: str) -> Tuple[int, int]:
    """A square number of pooled tokens (49 -> 7x7) or an explicit (h, w) grid; ``option`` names the knob
    (``contrast_tokens``, ``agent_tokens``) in the error."""
    if isinstance(value, int):
        side = math.isqrt(max(value, 0))
        if value < 1 or side * side != value:
            raise BadInput(
                f"{option}={value} is not a square number; pass a square count such as 49 "
                f"or an explicit (h, w) grid such as (7, 7)."
            )
        return (side, side)
    h, w = (int(v) for v in value)
    if h < 1 or w < 1:
        raise BadInput(f"{option}={tuple(value)} has an empty side; give a grid of at least 1x1 such as (7, 7).")
    return (h, w)


def patch_grid(value: Union[int, Sequence[int]]) -> Tuple[int, int]:
    """A grid side (14 -> 14x14) or an explicit (H, W) patch grid; an empty side is one clear error."""
    H, W = (value, value) if isinstance(value, int) else (int(v) for v in value)
    if H < 1 or W < 1:
        raise BadInput(f"grid_size={value!r} has an empty side: a patch grid must have positive sides (H, W >= 1).")
    return (H, W)


@register_notrace_function
def check_token_count(num_tokens: int, num_prefix_tokens: int, grid_size: Tuple[int, int], layer: str) -> None:
    """A clear error when the layer gets another token count than its grid's.

    Registered with timm as a no-trace function: under torch.fx (``create_feature_extractor``,
    ``FeatureGraphNet``) it becomes one graph call, run on the real count at execution, instead of
    Python control flow on a traced value; eager mode runs it as is.
    """
    H, W = grid_size
    if num_tokens != num_prefix_tokens + H * W:
        raise BadInput(
            f"{layer} got {num_tokens} tokens but expects {num_prefix_tokens} prefix + {H}x{W} grid = "
            f"{num_prefix_tokens + H * W}; build the model for this input size (img_size / patch_size)."
        )


@register_notrace_function
def check_unmasked(attn_mask: Optional[torch.Tensor], is_causal: bool, layer: str) -> None:
    """A clear error for an attention mask or causal attention, which timm's ``Block`` may pass and these
    layers do not support (a no-trace function for torch.fx, like :func:`check_token_count`)."""
    if attn_mask is not None or is_causal:
        raise BadInput(f"{layer} does not support attention masks or causal attention; call it with neither.")


@register_notrace_function
def check_input(
    x: torch.Tensor,
    attn_mask: Optional[torch.Tensor],
    is_causal: bool,
    num_prefix_tokens: int,
    grid_size: Tuple[int, int],
    layer: str,
) -> None:
    """The opening of each layer's ``forward``: :func:`check_unmasked`, then :func:`check_token_count` on ``x``."""
    check_unmasked(attn_mask, is_causal, layer)
    check_token_count(x.shape[1], num_prefix_tokens, grid_size, layer)


def check_layer_args(
    dim: int, num_heads: int, num_prefix_tokens: int, qk_norm: bool, norm_layer: Optional[Type[nn.Module]]
) -> None:
    """The constructor arguments every head-split attention layer here shares (timm's ``Attention`` ones)."""
    if dim % num_heads != 0:
        raise BadInput(f"dim={dim} is not divisible by num_heads={num_heads}; pick a head count that divides it.")
    if num_prefix_tokens < 0:
        raise BadInput(f"num_prefix_tokens={num_prefix_tokens} must be >= 0.")
    if qk_norm and norm_layer is None:
        raise BadInput("qk_norm=True needs a norm_layer (e.g. nn.LayerNorm).")


def check_choice(name: str, value: str, choices: Sequence[str]) -> None:
    """A clear error for a switch value outside ``choices``."""
    if value not in choices:
        raise BadInput(f"unknown {name} {value!r}; choose one of {', '.join(map(repr, choices))}.")


def local_conv_layer(dim: int) -> nn.Conv2d:
    """VCA's local term: a 3x3 depthwise convolution over the C = heads * d channels of v."""
    return nn.Conv2d(dim, dim, LOCAL_CONV_KERNEL, padding=LOCAL_CONV_KERNEL // 2, groups=dim)


def value_grid(v: torch.Tensor, grid_size: Tuple[int, int], num_prefix_tokens: int) -> torch.Tensor:
    """v (B, heads, N, d) -> its patch-grid part as an image (B, C, H, W), channel c = head * d + j as in qkv."""
    B, heads, _, d = v.shape
    H, W = grid_size
    return v[:, :, num_prefix_tokens:].transpose(-1, -2).reshape(B, heads * d, H, W)


class GridAttention(nn.Module):
    """Base of the attention layers on a prefix + patch-grid token layout: the preamble they share.

    The constructor takes timm's ``Attention`` arguments and the token layout (a layer passes its
    ``**common`` on) and builds ``qkv`` / ``q_norm`` / ``k_norm`` under timm's names, so state dicts keep
    timm's keys. A layer builds its own parts and ends with :meth:`_init_proj`: the creation order fixes
    the seeded init draws and the state-dict key order. ``attn_mask`` / ``is_causal`` are accepted for
    timm's ``Block`` and refused.
    """

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
        check_layer_args(dim, num_heads, num_prefix_tokens, qk_norm, norm_layer)
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.num_prefix_tokens = num_prefix_tokens
        self.layer_index = layer_index  # the common interface's; only VCA varies with depth
        self.grid_size = patch_grid(grid_size)
        self.attn_drop_p = attn_drop
        self._proj_args = (proj_bias, proj_drop)
        self._init_qkv(dim, qkv_bias, qk_norm, norm_layer)

    def _init_qkv(self, dim: int, qkv_bias: bool, qk_norm: bool, norm_layer: Optional[Type[nn.Module]]) -> None:
        """The qkv projection and the per-head q / k norms, as timm's ``Attention`` builds them."""
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.q_norm = norm_layer(self.head_dim) if qk_norm else nn.Identity()
        self.k_norm = norm_layer(self.head_dim) if qk_norm else nn.Identity()

    def _init_proj(self) -> None:
        """The output projection and its dropout, built last."""
        proj_bias, proj_drop = self._proj_args
        self.proj = nn.Linear(self.dim, self.dim, bias=proj_bias)
        self.proj_drop = nn.Dropout(proj_drop)

    def set_grid_size(self, grid_size: Union[int, Sequence[int]]) -> None:
        """Follow a change of input resolution (timm's ``set_input_size``)."""
        self.grid_size = patch_grid(grid_size)

    def _split_heads(self, t: torch.Tensor) -> torch.Tensor:
        """(B, L, C) -> (B, heads, L, d), channel c in head c // d as in the qkv layout."""
        B, L, _ = t.shape
        return t.reshape(B, L, self.num_heads, self.head_dim).transpose(1, 2)

    def _pooled_queries(self, q: torch.Tensor, pooled: Tuple[int, int]) -> torch.Tensor:
        """Adaptive average pooling of the patch-grid queries (B, heads, N, d) to an h x w grid: (B, heads, h*w, d)."""
        B, (H, W), (h, w) = q.shape[0], self.grid_size, pooled
        grid = q[:, :, self.num_prefix_tokens :].transpose(-1, -2).reshape(B * self.num_heads, self.head_dim, H, W)
        return F.adaptive_avg_pool2d(grid, (h, w)).reshape(B, self.num_heads, self.head_dim, h * w).transpose(-1, -2)

    def _qkv_heads(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v (B, heads, N, d) from tokens x (B, N, C), q and k normed: timm's ``Attention`` preamble."""
        B, N, _ = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        q, k = self.q_norm(q), self.k_norm(k)
        return q, k, v

    def _local(self, v: torch.Tensor) -> torch.Tensor:
        """The local term: ``local_conv`` of v's patch grid, (B, heads, N, d) -> (B, H*W, C).

        A method, not a function of the convolution: TorchScript takes no module as a function argument.
        """
        conv = self.local_conv
        assert conv is not None
        return conv(value_grid(v, self.grid_size, self.num_prefix_tokens)).flatten(2).transpose(1, 2)

    def _add_local(self, out: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
        """``local`` (B, H*W, C) added to the patch tokens of ``out`` (B, N, C); prefix tokens get none."""
        P = self.num_prefix_tokens
        return torch.cat([out[:, :P], out[:, P:] + local], dim=1)
