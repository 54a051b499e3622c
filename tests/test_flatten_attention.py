"""Focused Linear Attention (FLatten), specified by its equations (issue 15)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from vcarepro.attention.flatten import FocusedLinearAttention, focus

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DIM, HEADS = 48, 3  # head_dim 16
GRID = (5, 7)  # non-square: rows and columns must not be swapped anywhere
# (grid, prefix): a 14x14 DeiT-like grid, a small square one, a non-square one; prefix 0 (DiT) to 2
SHAPES = [((14, 14), 1), ((14, 14), 0), ((4, 4), 1), ((5, 7), 0), ((5, 7), 2), ((7, 5), 1)]

VARIANTS = {
    "default": {},
    "no_prefix_rows": dict(prefix_pos_encoding=False),
    "no_pos_encoding": dict(pos_encoding="none"),
    "no_dwc": dict(dwc_kernel=None),
    "kernel3": dict(dwc_kernel=3),
    "plain_relu": dict(focusing_factor=1),
    "sharp": dict(focusing_factor=7),
    "qk_norm": dict(qk_norm=True, norm_layer=nn.LayerNorm),
}


def make_flatten(prefix: int = 1, grid=GRID, seed: int = 0, dtype=torch.float64, **kw) -> FocusedLinearAttention:
    torch.manual_seed(seed)
    m = FocusedLinearAttention(DIM, HEADS, grid_size=grid, num_prefix_tokens=prefix, qkv_bias=True, **kw)
    # s and E start at zero: perturb every parameter so a swapped or dropped one shows
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return m.to(dtype).eval()


def tokens(prefix: int = 1, grid=GRID, batch: int = 2, seed: int = 1, dtype=torch.float64) -> torch.Tensor:
    torch.manual_seed(seed)
    return torch.randn(batch, prefix + grid[0] * grid[1], DIM, dtype=dtype)


# -- the paper's equations, written token by token -----------------------------------------


def phi(row: torch.Tensor, s: torch.Tensor, p: float) -> torch.Tensor:
    """Focused feature of one token (C channels): a = (ReLU(x) + 1e-6) / softplus(s), ||a|| a^p / ||a^p||."""
    a = (torch.clamp(row, min=0) + 1e-6) / torch.log1p(torch.exp(s))
    return torch.sqrt((a * a).sum()) * a**p / torch.sqrt((a**p * a**p).sum())


def flatten_from_equations(m: FocusedLinearAttention, x: torch.Tensor) -> torch.Tensor:
    """One batch element at a time, one head, query and key at a time; the conv as a sum over offsets."""
    B, N, C = x.shape
    d, P, p = C // m.num_heads, m.num_prefix_tokens, m.focusing_factor
    (H, W) = m.grid_size
    q, k, v = F.linear(x, m.qkv.weight, m.qkv.bias).split(C, dim=-1)
    s = m.scale.reshape(C)
    if m.pos_encoding is not None:  # E: a row per token, zero for prefix tokens without one
        table = m.pos_encoding[0]
        if not m.prefix_pos_encoding:
            table = torch.cat([torch.zeros(P, C, dtype=x.dtype), table])
        k = k + table
    out = torch.zeros_like(x)
    for b in range(B):
        fq = [phi(q[b, i], s, p) for i in range(N)]
        fk = [phi(k[b, j], s, p) for j in range(N)]
        for h in range(m.num_heads):
            c = slice(h * d, (h + 1) * d)
            for i in range(N):
                w = torch.stack([fq[i][c] @ fk[j][c] for j in range(N)])
                out[b, i, c] = (w[:, None] * v[b, :, c]).sum(0) / (w.sum() + N * 1e-6)
    if m.dwc is not None:  # one d-channel kernel for every head; channel c uses kernel c % d
        K = m.dwc_kernel
        r = K // 2
        grid = F.pad(v[:, P:].reshape(B, H, W, C), (0, 0, r, r, r, r))
        weight = m.dwc.weight.reshape(d, K, K).repeat(m.num_heads, 1, 1)  # (C, K, K)
        bias = m.dwc.bias.repeat(m.num_heads)
        local = bias.expand(B, H, W, C).clone()
        for dy in range(K):
            for dx in range(K):
                local = local + grid[:, dy : dy + H, dx : dx + W] * weight[:, dy, dx]
        out[:, P:] = out[:, P:] + local.reshape(B, H * W, C)
    return F.linear(out, m.proj.weight, m.proj.bias)


def focus_as_written(a: torch.Tensor, power: float) -> torch.Tensor:
    """phi(a) = ||a|| / ||a ** p|| * a ** p, the power of a itself."""
    powered = a**power
    return powered / powered.norm(dim=-1, keepdim=True) * a.norm(dim=-1, keepdim=True)


def feature_maps(m: FocusedLinearAttention, x: torch.Tensor):
    """phi(q), phi(k) as written, over all C channels of each token, split into heads (B, heads, N, d); and v."""
    B, N, C = x.shape
    q, k, v = m._qkv_heads(x)
    q, k = (t.transpose(1, 2).reshape(B, N, C) for t in (q, k))
    encoding = m._key_encoding(k.dtype)
    if encoding is not None:
        k = k + encoding
    s = F.softplus(m.scale.to(q.dtype))
    fq, fk = (m._split_heads(focus_as_written((F.relu(t) + 1e-6) / s, m.focusing_factor)) for t in (q, k))
    return fq, fk, v


def attention_map(fq: torch.Tensor, fk: torch.Tensor) -> torch.Tensor:
    """The normalised N x N map Q K^T / (rowsum + N eps), per head: (B, heads, N, N)."""
    scores = fq @ fk.transpose(-2, -1)
    return scores / (scores.sum(dim=-1, keepdim=True) + fk.shape[-2] * 1e-6)


def materialised(m: FocusedLinearAttention, x: torch.Tensor) -> torch.Tensor:
    """The layer's output with the N x N map formed instead of its linear association."""
    B, N, C = x.shape
    fq, fk, v = feature_maps(m, x)
    out = (attention_map(fq, fk) @ v).transpose(1, 2).reshape(B, N, C)
    if m.dwc is not None:
        out = m._add_local(out, m._local(v))
    return m.proj(out)


@pytest.mark.parametrize("prefix", [0, 1, 2])
def test_matches_the_equations_token_by_token(prefix):
    m = make_flatten(prefix=prefix, grid=(3, 4))
    x = tokens(prefix, grid=(3, 4))
    with torch.no_grad():
        expected = flatten_from_equations(m, x)
        got = m(x)
        torch.testing.assert_close(materialised(m, x), expected, rtol=1e-10, atol=1e-10)
    assert got.shape == x.shape
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


def test_gradients_match_the_equations():
    m = make_flatten(prefix=1, grid=(3, 4))
    x = tokens(1, grid=(3, 4), batch=1).requires_grad_()
    (expected,) = torch.autograd.grad(flatten_from_equations(m, x).square().sum(), x)
    (got,) = torch.autograd.grad(m(x).square().sum(), x)
    torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("variant", ["no_prefix_rows", "no_pos_encoding", "kernel3", "sharp"])
def test_variants_match_the_equations(variant):
    m = make_flatten(prefix=1, grid=(3, 4), **VARIANTS[variant])
    x = tokens(1, grid=(3, 4))
    with torch.no_grad():
        torch.testing.assert_close(m(x), flatten_from_equations(m, x), rtol=1e-10, atol=1e-10)


def test_the_map_is_nonnegative_and_rows_sum_to_just_under_one():
    m = make_flatten(prefix=1)
    x = tokens(1)
    with torch.no_grad():
        fq, fk, _ = feature_maps(m, x)
        attn = attention_map(fq, fk)
    assert attn.shape == (2, HEADS, 1 + 35, 1 + 35)
    assert (attn >= 0).all()
    # rows sum to S / (S + N eps), S the unnormalised row sum: just under 1
    scores = (fq @ fk.transpose(-1, -2)).sum(-1)
    torch.testing.assert_close(attn.sum(-1), scores / (scores + 36 * 1e-6), rtol=1e-12, atol=0)
    assert (attn.sum(-1) < 1).all() and (attn.sum(-1) > 0.999).all()


# -- the linear association == the N x N map ------------------------------------------------


@pytest.mark.parametrize("grid, prefix", SHAPES)
def test_the_linear_association_equals_the_materialised_map_in_value_and_gradient(grid, prefix):
    m = make_flatten(prefix=prefix, grid=grid)
    x = tokens(prefix, grid=grid).requires_grad_()
    fast = m(x)
    (grad_fast,) = torch.autograd.grad(fast.square().sum(), x)
    ref = materialised(m, x)
    (grad_ref,) = torch.autograd.grad(ref.square().sum(), x)
    torch.testing.assert_close(fast, ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(grad_fast, grad_ref, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_variant_equals_its_materialised_map(variant):
    m = make_flatten(prefix=1, **VARIANTS[variant])
    x = tokens(1)
    with torch.no_grad():
        torch.testing.assert_close(m(x), materialised(m, x), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("variant", VARIANTS)
def test_gradients_reach_every_parameter(variant):
    m = make_flatten(**VARIANTS[variant]).train()
    m(tokens()).square().mean().backward()
    for name, p in m.named_parameters():
        assert p.grad is not None, f"{name} received no gradient"
        assert p.grad.abs().sum() > 0, f"{name} received an all-zero gradient"


# -- the focusing function ------------------------------------------------------------------


def test_focus_keeps_the_norm_sharpens_the_direction_and_is_homogeneous():
    torch.manual_seed(0)
    a = torch.rand(5, 12, dtype=torch.float64) + 1e-3
    f = focus(a, 3)
    torch.testing.assert_close(f.norm(dim=-1), a.norm(dim=-1))
    torch.testing.assert_close(f, focus_as_written(a, 3))
    torch.testing.assert_close(focus(7.0 * a, 3), 7.0 * f)
    torch.testing.assert_close(focus(a, 1), a)

    # a larger power concentrates the mass on the largest channels: the top channel's share grows
    def share(t):
        return t.max(-1).values / t.sum(-1)

    assert (share(f) > share(a)).all()


def test_focus_does_not_overflow_where_the_literal_power_does():
    a = torch.full((2, 8), 1e15)
    a[:, 0] = 2e15
    assert not torch.isfinite(focus_as_written(a, 3)).all()  # (1e15)^3 overflows float32
    f = focus(a, 3)
    assert torch.isfinite(f).all()
    torch.testing.assert_close(f, focus_as_written(a.double(), 3).float(), rtol=1e-5, atol=0)


# -- the class token and the positional encoding ------------------------------------------------


def test_prefix_tokens_get_no_convolution_term_and_their_values_do_not_enter_it():
    m = make_flatten(prefix=1)
    other = make_flatten(prefix=1)
    other.load_state_dict(m.state_dict())
    with torch.no_grad():
        other.dwc.weight.mul_(3.0)
        other.dwc.bias.add_(1.0)
        x = tokens(1)
        a, b = m(x), other(x)
    torch.testing.assert_close(a[:, :1], b[:, :1])  # the class token's output ignores the conv
    assert not torch.allclose(a[:, 1:], b[:, 1:])
    v = torch.randn(2, HEADS, 36, DIM // HEADS, dtype=torch.float64)
    v2 = v.clone()
    v2[:, :, 0] += 100.0  # the class token's value
    torch.testing.assert_close(m._local(v), m._local(v2))


def test_prefix_tokens_own_a_learned_key_row_by_default_and_none_when_switched_off():
    H, W = GRID
    assert make_flatten(prefix=2).pos_encoding.shape == (1, 2 + H * W, DIM)
    assert make_flatten(prefix=2, prefix_pos_encoding=False).pos_encoding.shape == (1, H * W, DIM)
    assert make_flatten(pos_encoding="none").pos_encoding is None
    m = make_flatten(prefix=1)
    x = tokens(1)
    with torch.no_grad():
        before = m(x)
        m.pos_encoding[0, 0] += 1.0  # the class token's row changes the output
        assert not torch.allclose(before, m(x))


def test_parameters_start_as_the_official_layer_and_decay_as_its_optimizer():
    """s = 0 (features divided by ln 2), E = 0; s and E are 3-D, so they are weight-decayed (as officially)."""
    from timm.optim._param_groups import param_groups_weight_decay

    m = FocusedLinearAttention(DIM, HEADS, grid_size=GRID, qkv_bias=True)
    assert torch.count_nonzero(m.scale) == 0 and torch.count_nonzero(m.pos_encoding) == 0
    assert m.scale.shape == (1, 1, DIM)
    torch.testing.assert_close(F.softplus(m.scale), torch.full_like(m.scale, math.log(2.0)))
    names = {id(p): n for n, p in m.named_parameters()}
    groups = param_groups_weight_decay(m, weight_decay=0.05)
    decayed = {names[id(p)] for g in groups if g["weight_decay"] > 0 for p in g["params"]}
    assert decayed == {"qkv.weight", "scale", "pos_encoding", "dwc.weight", "proj.weight"}


# -- parameter count --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dim, heads, grid, prefix, prefix_rows",
    [
        (192, 3, (14, 14), 1, True),  # DeiT-T
        (192, 3, (14, 14), 1, False),
        (384, 6, (16, 16), 0, True),  # DiT-S/2
    ],
)
def test_parameter_count_is_the_official_module_list(dim, heads, grid, prefix, prefix_rows):
    """Official (flatten_swin.py): qkv (C x 3C + 3C), proj (C x C + C), dwc (d x 1 x 5 x 5 + d),
    scale (1 x 1 x C), positional_encoding (1 x L x C); L = tokens with a row."""
    m = FocusedLinearAttention(
        dim, heads, grid_size=grid, num_prefix_tokens=prefix, qkv_bias=True, prefix_pos_encoding=prefix_rows
    )
    d = dim // heads
    rows = grid[0] * grid[1] + (prefix if prefix_rows else 0)
    expected = (dim * 3 * dim + 3 * dim) + (dim * dim + dim) + (d * 5 * 5 + d) + dim + rows * dim
    assert sum(p.numel() for p in m.parameters()) == expected
    if (dim, prefix, prefix_rows) == (192, 1, True):
        assert expected == 187_904  # 148,224 MHSA + 39,680 FLatten-specific


# -- bf16 ----------------------------------------------------------------------------------------


def _loss_and_grads(m, x):
    out = m(x)
    (out.float().square().mean()).backward()
    return out.float().detach(), {n: p.grad.float().clone() for n, p in m.named_parameters()}


def _rel(a, b):
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("mode", ["autocast", "cast"])
@pytest.mark.parametrize("amplitude", [1.0, 30.0])
def test_bf16_outputs_and_gradients_are_finite_and_close_to_fp32(mode, amplitude):
    """Relative (Frobenius) error below 2% for the output and every gradient (measured: 0.5% and <= 1.1%)."""
    ref = make_flatten(prefix=1, grid=(14, 14), dtype=torch.float32).train()
    x = amplitude * tokens(1, grid=(14, 14), dtype=torch.float32)
    out32, grads32 = _loss_and_grads(ref, x)
    m = make_flatten(prefix=1, grid=(14, 14), dtype=torch.float32).train()
    if mode == "autocast":
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out16, grads16 = _loss_and_grads(m, x)
    else:
        m = m.to(torch.bfloat16)
        out16, grads16 = _loss_and_grads(m, x.to(torch.bfloat16))
    assert torch.isfinite(out16).all()
    assert _rel(out16, out32) < 0.02
    for name, g in grads16.items():
        assert torch.isfinite(g).all(), name
        assert _rel(g, grads32[name]) < 0.02, name


def test_fp16_kernel_sums_do_not_overflow():
    """FLatten issues 15 / 18: in fp16, (ReLU(q) / ln 2)^3 and the key sums overflow 65504 at activations ~30
    (the output turns NaN without the float32 island); here output and gradients stay within 1% of fp32."""
    ref = make_flatten(prefix=1, grid=(14, 14), dtype=torch.float32).train()
    x = 30.0 * tokens(1, grid=(14, 14), dtype=torch.float32)
    out32, grads32 = _loss_and_grads(ref, x)
    m = make_flatten(prefix=1, grid=(14, 14), dtype=torch.float16).train()
    out16, grads16 = _loss_and_grads(m, x.half())
    assert torch.isfinite(out16).all() and _rel(out16, out32) < 0.01
    for name, g in grads16.items():
        assert torch.isfinite(g).all() and _rel(g, grads32[name]) < 0.01, name


# -- set_grid_size -----------------------------------------------------------------------------


def test_set_grid_size_interpolates_the_grid_rows_bicubically_and_keeps_prefix_rows():
    m = make_flatten(prefix=1, grid=(14, 14))
    old = m.pos_encoding.detach().clone()
    m.set_grid_size((16, 12))
    assert m.grid_size == (16, 12)
    assert m.pos_encoding.shape == (1, 1 + 16 * 12, DIM) and isinstance(m.pos_encoding, nn.Parameter)
    torch.testing.assert_close(m.pos_encoding[:, :1].detach(), old[:, :1])
    grid = old[0, 1:].reshape(14, 14, DIM).permute(2, 0, 1)[None]
    expected = F.interpolate(grid, size=(16, 12), mode="bicubic", align_corners=False)[0].permute(1, 2, 0)
    torch.testing.assert_close(m.pos_encoding[0, 1:].detach(), expected.reshape(-1, DIM))
    x = tokens(1, grid=(16, 12))
    assert m(x).shape == x.shape
    torch.testing.assert_close(m(x), materialised(m, x), rtol=1e-10, atol=1e-10)
    with pytest.raises(ValueError, match=r"expects 1 prefix \+ 16x12 grid = 193"):
        m(tokens(1, grid=(14, 14)))


def test_set_grid_size_to_the_same_grid_changes_nothing():
    m = make_flatten(prefix=0, grid=(16, 16))
    before = m.pos_encoding
    m.set_grid_size(16)
    assert m.pos_encoding is before


def test_set_grid_size_without_pos_encoding_only_revalidates():
    m = make_flatten(prefix=0, grid=(16, 16), pos_encoding="none")
    m.set_grid_size(8)
    assert m(tokens(0, grid=(8, 8))).shape == (2, 64, DIM)


# -- timm compatibility ---------------------------------------------------------------------------


def test_timm_block_and_call_convention():
    from timm.models.vision_transformer import Block

    m = make_flatten(prefix=1, dtype=torch.float32)
    x = tokens(1, dtype=torch.float32)
    assert m(x, attn_mask=None).shape == x.shape
    block = Block(DIM, HEADS, qkv_bias=True)
    block.attn = m
    assert block(x).shape == x.shape


def test_inside_a_timm_vision_transformer_with_its_init():
    from timm.models.vision_transformer import VisionTransformer

    vit = VisionTransformer(img_size=32, patch_size=8, embed_dim=DIM, depth=2, num_heads=HEADS, num_classes=5)
    for i, block in enumerate(vit.blocks):
        block.attn = FocusedLinearAttention(
            DIM,
            HEADS,
            grid_size=vit.patch_embed.grid_size,
            num_prefix_tokens=vit.num_prefix_tokens,
            layer_index=i,
            qkv_bias=True,
        )
        with torch.no_grad():
            block.attn.scale.fill_(1.0)
    vit.init_weights()  # timm's init calls our init_weights: s and E back to 0
    assert all(torch.count_nonzero(b.attn.scale) == 0 for b in vit.blocks)
    assert vit(torch.randn(2, 3, 32, 32)).shape == (2, 5)


# -- clear errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw, pattern",
    [
        (dict(focusing_factor=0), "focusing_factor=0 must be a positive number"),
        (dict(focusing_factor=float("nan")), "must be a positive number"),
        (dict(dwc_kernel=4), "dwc_kernel=4 must be a positive odd integer"),
        (dict(dwc_kernel=0), "dwc_kernel=0 must be a positive odd integer"),
        (dict(pos_encoding="sincos"), "unknown pos_encoding 'sincos'"),
        (dict(attn_drop=0.1), "attn_drop=0.1 has nothing to drop"),
        (dict(qk_norm=True), "qk_norm=True needs a norm_layer"),
        (dict(num_prefix_tokens=-1), "num_prefix_tokens=-1 must be >= 0"),
    ],
)
def test_bad_knobs_are_refused(kw, pattern):
    kw = {"num_prefix_tokens": 1, **kw}
    with pytest.raises(ValueError, match=pattern):
        FocusedLinearAttention(DIM, HEADS, grid_size=GRID, **kw)


def test_dim_not_divisible_by_heads_is_refused():
    with pytest.raises(ValueError, match="dim=50 is not divisible by num_heads=3"):
        FocusedLinearAttention(50, 3, grid_size=GRID)
