"""Agent Attention (Han et al., ECCV 2024), specified by its equations and the official layer's parameters.

Issue 15."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from helpers import attention_path, pooled_queries
from vcarepro.attention.agent import AgentAttention

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DIM, HEADS = 24, 2  # head_dim 12
GRID, AGENTS = (6, 5), (3, 2)  # non-square patch grid, non-square agent grid
# (grid, agent grid): DeiT's 14x14 / 49, a small square, uneven (overlapping) adaptive windows, a non-square one
SHAPES = [((14, 14), 49), ((4, 4), 4), ((7, 5), (3, 2)), (GRID, AGENTS)]


def make_agent(prefix: int = 1, grid=GRID, agents=AGENTS, seed: int = 0, dtype=torch.float64, **kw) -> AgentAttention:
    torch.manual_seed(seed)
    m = AgentAttention(DIM, HEADS, grid_size=grid, num_prefix_tokens=prefix, agent_tokens=agents, qkv_bias=True, **kw)
    # the biases start at N(0, 0.02); make them O(1) so a misplaced or dropped one shows in every comparison
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("_bias"):
                p.normal_()
    return m.to(dtype).eval()


def tokens(prefix: int = 1, grid=GRID, batch: int = 2, seed: int = 1, dtype=torch.float64) -> torch.Tensor:
    torch.manual_seed(seed)
    return torch.randn(batch, prefix + grid[0] * grid[1], DIM, dtype=dtype)


# -- an independent transcription of the paper's equations ----------------------------------------------


def bilinear(grid: torch.Tensor, out_h: int, out_w: int) -> torch.Tensor:
    """Bilinear resize (align_corners=False, half-pixel centres, edge clamped) of the last two axes, by hand."""
    in_h, in_w = grid.shape[-2:]

    def taps(out_size, in_size):
        result = []
        for i in range(out_size):
            src = max((i + 0.5) * in_size / out_size - 0.5, 0.0)
            lo = int(math.floor(src))
            hi = min(lo + 1, in_size - 1)
            result.append((lo, hi, src - lo))
        return result

    out = grid.new_zeros(*grid.shape[:-2], out_h, out_w)
    for r, (r0, r1, fr) in enumerate(taps(out_h, in_h)):
        for c, (c0, c1, fc) in enumerate(taps(out_w, in_w)):
            out[..., r, c] = (
                (1 - fr) * (1 - fc) * grid[..., r0, c0]
                + (1 - fr) * fc * grid[..., r0, c1]
                + fr * (1 - fc) * grid[..., r1, c0]
                + fr * fc * grid[..., r1, c1]
            )
    return out


def agent_attention_from_equations(m: AgentAttention, x: torch.Tensor) -> torch.Tensor:
    """Head by head, bias entry by bias entry, from the paper and the official layer's bias layout."""
    B, N, C = x.shape
    d, P = C // m.num_heads, m.num_prefix_tokens
    (H, W), (h, w) = m.grid_size, m.agent_grid
    n = h * w
    q, k, v = F.linear(x, m.qkv.weight, m.qkv.bias).split(C, dim=-1)
    heads = []
    for head in range(m.num_heads):
        c = slice(head * d, (head + 1) * d)
        qh, kh, vh = q[..., c], k[..., c], v[..., c]
        a = pooled_queries(qh[:, P:], (H, W), (h, w))  # (B, n, d)
        coarse_an = bilinear(m.agent_patch_bias[head], H, W)  # (n, H, W)
        coarse_na = bilinear(m.patch_agent_bias[head], H, W)
        bias_an = x.new_zeros(n, N)
        bias_na = x.new_zeros(N, n)
        for t in range(n):
            for p in range(P):  # prefix keys / queries: their own bias, no position
                bias_an[t, p] = m.agent_prefix_bias[0, head, t, p]
                bias_na[p, t] = m.prefix_agent_bias[0, head, p, t]
            for r in range(H):
                for col in range(W):
                    j = P + r * W + col
                    bias_an[t, j] = (
                        coarse_an[t, r, col] + m.agent_row_bias[0, head, t, r, 0] + m.agent_col_bias[0, head, t, 0, col]
                    )
                    bias_na[j, t] = (
                        coarse_na[t, r, col] + m.row_agent_bias[0, head, r, 0, t] + m.col_agent_bias[0, head, 0, col, t]
                    )
        aggregation = torch.softmax(a @ kh.transpose(1, 2) / math.sqrt(d) + bias_an, dim=-1)  # (B, n, N)
        broadcast = torch.softmax(qh @ a.transpose(1, 2) / math.sqrt(d) + bias_na, dim=-1)  # (B, N, n)
        heads.append(broadcast @ (aggregation @ vh))
    out = torch.cat(heads, -1)
    v_grid = v[:, P:].reshape(B, H, W, C).permute(0, 3, 1, 2)
    k_size = m.local_conv.kernel_size[0]
    local = F.conv2d(v_grid, m.local_conv.weight, m.local_conv.bias, padding=k_size // 2, groups=C)
    out = torch.cat([out[:, :P], out[:, P:] + local.flatten(2).transpose(1, 2)], 1)
    return F.linear(out, m.proj.weight, m.proj.bias)


# -- 1, 2: the two paths and the equations ------------------------------------------------------------------


@pytest.mark.parametrize("prefix", [0, 1, 2])
@pytest.mark.parametrize("fused", [True, False])
def test_matches_the_equations_head_by_head(prefix, fused):
    m = make_agent(prefix)
    x = tokens(prefix)
    with torch.no_grad():
        expected = agent_attention_from_equations(m, x)
        got = attention_path(m, fused)(x)
    assert got.shape == x.shape
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("coarse_side, dwc", [(3, 5), (9, 1)])
def test_equations_hold_when_the_coarse_bias_is_upsampled_or_downsampled_and_for_other_kernels(coarse_side, dwc):
    m = make_agent(1, coarse_bias_side=coarse_side, dwc_kernel=dwc)
    x = tokens(1)
    with torch.no_grad():
        expected = agent_attention_from_equations(m, x)
        torch.testing.assert_close(attention_path(m, False)(x), expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("grid, agents", SHAPES)
@pytest.mark.parametrize("prefix", [0, 1])
def test_fused_and_materialised_attention_agree_in_value_and_gradient(grid, agents, prefix):
    m = make_agent(prefix, grid=grid, agents=agents)
    x = tokens(prefix, grid=grid).requires_grad_()
    fused = attention_path(m, True)(x)
    (grad_fused,) = torch.autograd.grad(fused.square().sum(), x)
    ref = attention_path(m, False)(x)
    (grad_ref,) = torch.autograd.grad(ref.square().sum(), x)
    torch.testing.assert_close(fused, ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(grad_fused, grad_ref, rtol=1e-9, atol=1e-9)


def test_class_token_is_not_pooled_into_the_agents_and_gets_no_convolution():
    m = make_agent(1)
    q = torch.randn(2, HEADS, 1 + GRID[0] * GRID[1], DIM // HEADS, dtype=torch.float64)
    moved = q.clone()
    moved[:, :, 0] += 100.0
    torch.testing.assert_close(m.agents(moved), m.agents(q))
    without = make_agent(1, dwc_kernel=0)
    without.load_state_dict(m.state_dict(), strict=False)
    x = tokens(1)
    with torch.no_grad():
        a, b = m(x), without(x)
    torch.testing.assert_close(a[:, :1], b[:, :1])
    assert not torch.allclose(a[:, 1:], b[:, 1:])


def test_pooling_is_pytorchs_adaptive_average_pooling_over_all_channels():
    # the official layer pools (B, C, H, W) before the head split; per-head pooling must equal it
    m = make_agent(1, grid=(7, 5), agents=(3, 2))
    q_flat = torch.randn(2, 1 + 35, DIM, dtype=torch.float64)
    q = q_flat.reshape(2, 36, HEADS, DIM // HEADS).transpose(1, 2)
    official = F.adaptive_avg_pool2d(q_flat[:, 1:].reshape(2, 7, 5, DIM).permute(0, 3, 1, 2), (3, 2))
    official = official.reshape(2, DIM, 6).transpose(1, 2).reshape(2, 6, HEADS, DIM // HEADS).transpose(1, 2)
    torch.testing.assert_close(m.agents(q), official)
    means = pooled_queries(q[:, :, 1:].reshape(2 * HEADS, 35, -1), (7, 5), (3, 2)).reshape(2, HEADS, 6, -1)
    torch.testing.assert_close(m.agents(q), means)  # each agent the plain mean of its window


# -- 3: parameters as the official AgentAttention ------------------------------------------------------------


def official_parameter_count(dim, heads, window, agents=49, prefix=1, qkv_bias=True):
    """agent_deit.py AgentAttention: qkv, proj (bias), dwc 3x3 (bias), an/na (heads, agents, 7, 7),
    ah/aw/ha/wa (heads x agents x window each), ac/ca (heads x agents each, one class token)."""
    return (
        dim * 3 * dim
        + (3 * dim if qkv_bias else 0)
        + dim * dim
        + dim
        + dim * 9
        + dim
        + 2 * heads * agents * 49
        + 4 * heads * agents * window
        + 2 * heads * agents * prefix
    )


@pytest.mark.parametrize("dim, heads, expected", [(192, 3, 173_076), (384, 6, 641_064)])
def test_parameter_count_equals_the_official_deit_layer(dim, heads, expected):
    m = AgentAttention(dim, heads, grid_size=14, num_prefix_tokens=1, qkv_bias=True)
    count = sum(p.numel() for p in m.parameters())
    assert count == official_parameter_count(dim, heads, 14) == expected


def test_parameter_count_without_prefix_sizes_the_biases_to_the_grid():
    # DiT-S/2: 16x16 latent grid, no class token, 64 agents
    m = AgentAttention(384, 6, grid_size=16, num_prefix_tokens=0, qkv_bias=True, agent_tokens=64)
    count = sum(p.numel() for p in m.parameters())
    assert count == official_parameter_count(384, 6, 16, agents=64, prefix=0)
    assert m.agent_prefix_bias is None and m.prefix_agent_bias is None
    assert m.agent_row_bias.shape == (1, 6, 64, 16, 1) and m.col_agent_bias.shape == (1, 6, 1, 16, 64)


def test_switches_drop_exactly_their_parameters():
    full = AgentAttention(DIM, HEADS, grid_size=GRID, agent_tokens=AGENTS)
    plain = AgentAttention(DIM, HEADS, grid_size=GRID, agent_tokens=AGENTS, position_bias=False, dwc_kernel=0)
    n, (H, W) = 6, GRID
    biases = 2 * HEADS * n * 49 + 2 * HEADS * n * (H + W) + 2 * HEADS * n * 1
    conv = DIM * 9 + DIM
    assert sum(p.numel() for p in full.parameters()) - sum(p.numel() for p in plain.parameters()) == biases + conv
    x = tokens(1, dtype=torch.float32)
    assert plain(x).shape == x.shape
    torch.testing.assert_close(attention_path(plain, False)(x), attention_path(plain, True)(x), rtol=1e-5, atol=1e-6)


def test_biases_start_as_the_official_truncated_normal():
    m = AgentAttention(192, 3, grid_size=14)
    for name in ("agent_patch_bias", "patch_agent_bias", "agent_row_bias", "col_agent_bias", "agent_prefix_bias"):
        p = getattr(m, name)
        assert abs(p.std().item() - 0.02) < 0.004 and abs(p.mean().item()) < 0.004, name


# -- 4: bf16 ---------------------------------------------------------------------------------------------------


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("mode", ["autocast", "cast"])
@pytest.mark.parametrize("fused", [True, False])
def test_bf16_is_finite_and_close_to_fp32(mode, fused):
    m32 = make_agent(1, grid=(14, 14), agents=49, dtype=torch.float32).train()
    x32 = tokens(1, grid=(14, 14), dtype=torch.float32).requires_grad_()
    y32 = attention_path(m32, fused)(x32)
    (g32,) = torch.autograd.grad(y32.square().mean(), x32)
    if mode == "autocast":
        x = x32.detach().clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = attention_path(m32, fused)(x)
            (g,) = torch.autograd.grad(y.float().square().mean(), x)
    else:
        m16 = make_agent(1, grid=(14, 14), agents=49, dtype=torch.bfloat16).train()
        x = x32.detach().to(torch.bfloat16).requires_grad_()
        y = attention_path(m16, fused)(x)
        (g,) = torch.autograd.grad(y.float().square().mean(), x)
    assert y.dtype == torch.bfloat16
    assert torch.isfinite(y).all() and torch.isfinite(g).all()
    # bf16 keeps 8 mantissa bits (relative step 2^-8 = 0.4%); measured about 0.4% on outputs, 0.5% on gradients
    assert _relative(y, y32) < 0.015
    assert _relative(g, g32) < 0.02


# -- 5: clear errors ----------------------------------------------------------------------------------------


def test_agent_grid_larger_than_the_patch_grid_is_refused():
    with pytest.raises(ValueError, match=r"7x7 agent grid is larger than the 4x4 patch grid.*agent_tokens=16"):
        AgentAttention(DIM, HEADS, grid_size=4, agent_tokens=49)
    with pytest.raises(ValueError, match=r"1x6 agent grid is larger than the 6x5 patch grid"):
        AgentAttention(DIM, HEADS, grid_size=GRID, agent_tokens=(1, 6))


@pytest.mark.parametrize(
    "kw, pattern",
    [
        (dict(agent_tokens=50), "agent_tokens=50 is not a square number"),
        (dict(agent_tokens=0), "agent_tokens=0 is not a square number"),
        (dict(agent_tokens=(0, 3)), "has an empty side"),
        (dict(dwc_kernel=4), "dwc_kernel=4 must be 0"),
        (dict(dwc_kernel=-3), "dwc_kernel=-3 must be 0"),
        (dict(coarse_bias_side=0), "coarse_bias_side=0 must be at least 1"),
        (dict(num_prefix_tokens=-1), "num_prefix_tokens=-1 must be >= 0"),
        (dict(qk_norm=True), "qk_norm=True needs a norm_layer"),
    ],
)
def test_bad_knob_values_are_refused(kw, pattern):
    with pytest.raises(ValueError, match=pattern):
        AgentAttention(DIM, HEADS, grid_size=GRID, **{"agent_tokens": AGENTS, **kw})


def test_dim_not_divisible_by_heads_is_refused():
    with pytest.raises(ValueError, match="dim=25 is not divisible by num_heads=2"):
        AgentAttention(25, 2, grid_size=GRID)


def test_qk_norm_normalises_queries_before_pooling_and_keys():
    m = make_agent(1, qk_norm=True, norm_layer=nn.LayerNorm)
    x = tokens(1)
    with torch.no_grad():
        torch.testing.assert_close(attention_path(m, False)(x), attention_path(m, True)(x), rtol=1e-10, atol=1e-10)
        plain = make_agent(1)
        plain.load_state_dict(m.state_dict(), strict=False)
        assert not torch.allclose(m(x), plain(x))


# -- 6: another grid ------------------------------------------------------------------------------------------


def test_set_grid_size_resizes_the_row_and_column_biases_linearly_as_the_official_loader():
    m = make_agent(1, grid=(9, 9), agents=9)
    before = {name: p.detach().clone() for name, p in m.named_parameters()}
    m.set_grid_size((12, 7))
    assert m.grid_size == (12, 7)
    # official load_pretrained: F.interpolate(bias as (heads, agents, length), size, mode='linear')
    ah = before["agent_row_bias"][0, :, :, :, 0]
    torch.testing.assert_close(m.agent_row_bias[0, :, :, :, 0], F.interpolate(ah, size=12, mode="linear"))
    wa = before["col_agent_bias"][0, :, 0].permute(0, 2, 1)
    torch.testing.assert_close(m.col_agent_bias[0, :, 0].permute(0, 2, 1), F.interpolate(wa, size=7, mode="linear"))
    assert m.agent_col_bias.shape[-1] == 7 and m.row_agent_bias.shape[2] == 12
    torch.testing.assert_close(m.agent_patch_bias, before["agent_patch_bias"])  # the 7x7 grid follows by itself
    x = tokens(1, grid=(12, 7))
    with torch.no_grad():
        out = m(x)
        torch.testing.assert_close(out, agent_attention_from_equations(m, x), rtol=1e-10, atol=1e-10)
    assert out.shape == x.shape
    with pytest.raises(ValueError, match="3x3 agent grid is larger than the 2x2 patch grid"):
        m.set_grid_size(2)


def test_a_state_dict_saved_at_another_grid_loads_with_resized_row_and_column_biases():
    small = make_agent(0, grid=(14, 14), agents=49)
    big = make_agent(0, grid=(16, 16), agents=49, seed=3)
    big.load_state_dict(small.state_dict())
    small.set_grid_size(16)
    for name, p in small.state_dict().items():
        torch.testing.assert_close(big.state_dict()[name], p, msg=name)


# -- 7: timm ----------------------------------------------------------------------------------------------------


def test_timm_call_convention_and_a_vision_transformer_with_agent_blocks():
    from timm.models import VisionTransformer

    m = make_agent(1, dtype=torch.float32)
    x = tokens(1, dtype=torch.float32)
    assert m(x, attn_mask=None).shape == x.shape
    vit = VisionTransformer(img_size=32, patch_size=8, embed_dim=DIM, depth=2, num_heads=HEADS, num_classes=5)
    for index, block in enumerate(vit.blocks):
        block.attn = AgentAttention(
            DIM,
            HEADS,
            grid_size=vit.patch_embed.grid_size,
            num_prefix_tokens=vit.num_prefix_tokens,
            layer_index=index,
            qkv_bias=True,
            agent_tokens=4,
        )
    vit.init_weights()
    logits = vit(torch.randn(2, 3, 32, 32))
    logits.sum().backward()
    assert logits.shape == (2, 5)
    assert vit.blocks[0].attn.agent_row_bias.grad is not None
