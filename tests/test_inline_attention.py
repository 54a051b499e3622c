"""InLine attention (injective linear attention, Han et al. NeurIPS 2024), specified by its equations (issue 15)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
from timm.models import VisionTransformer
from timm.models.vision_transformer import Block

from vcarepro.attention.grid import value_grid
from vcarepro.attention.inline import KERNELS, InLineAttention
from vcarepro.metrics.complexity import count_flops, count_parameters

DIM, HEADS = 48, 3  # head_dim 16
GRID = (6, 5)  # non-square on purpose
# (prefix, grid): DeiT-like with a class token, DiT's class-token-free 16x16, a 14x14 and a tiny grid
pytestmark = pytest.mark.usefixtures("one_torch_thread")

SHAPES = [(1, GRID), (0, GRID), (2, GRID), (1, (14, 14)), (0, (16, 16)), (1, (1, 1))]


def make_inline(prefix: int = 1, grid=GRID, seed: int = 0, dim: int = DIM, heads: int = HEADS, **kw) -> InLineAttention:
    torch.manual_seed(seed)
    return InLineAttention(dim, heads, grid_size=grid, num_prefix_tokens=prefix, qkv_bias=True, **kw).eval()


def tokens(prefix: int = 1, grid=GRID, batch: int = 2, seed: int = 1, dim: int = DIM, dtype=torch.float32):
    torch.manual_seed(seed)
    return torch.randn(batch, prefix + grid[0] * grid[1], dim, dtype=dtype)


# -- the paper's equations, written token by token -----------------------------------------------

PHI = {
    "identity": lambda t: t,
    "relu": lambda t: t.clamp(min=0),
    "leakyrelu": lambda t: torch.where(t > 0, t, 0.01 * t),
    "exp": lambda t: torch.exp(0.2 * t),
}


def gelu(t):
    return 0.5 * t * (1 + torch.erf(t / math.sqrt(2)))


def grouped_pointwise(conv: nn.Conv1d, x: torch.Tensor, groups: int) -> torch.Tensor:
    """A kernel-size-1 grouped Conv1d on one vector x (C_in,), written as per-group matrix products."""
    c_in, c_out = x.shape[0], conv.weight.shape[0]
    i, o = c_in // groups, c_out // groups
    w = conv.weight[:, :, 0]
    return torch.cat([w[g * o : (g + 1) * o] @ x[g * i : (g + 1) * i] for g in range(groups)]) + conv.bias


def inline_from_equations(m: InLineAttention, x: torch.Tensor) -> torch.Tensor:
    """InLine, head by head and token by token:
    A_ij = s q_i.k_j - (1/N) sum_l s q_i.k_l + 1/N with s = d^-1/2 / N, o_i = sum_j A_ij v_j,
    plus, for patch tokens, sum over the 3x3 neighbours of r[c, offset] v_j[c], r predicted from mean(x)."""
    B, N, C = x.shape
    h, P = m.num_heads, m.num_prefix_tokens
    d = C // h
    H, W = m.grid_size
    phi = PHI[m.kernel]
    qkv = x @ m.qkv.weight.T + m.qkv.bias
    q, k, v = phi(qkv[..., :C]), phi(qkv[..., C : 2 * C]), qkv[..., 2 * C :]
    s = d**-0.5 / N
    out = torch.zeros_like(v)
    for b in range(B):
        for head in range(h):
            c = slice(head * d, (head + 1) * d)
            for i in range(N):
                scores = [s * torch.dot(q[b, i, c], k[b, j, c]) for j in range(N)]
                mean = sum(scores) / N
                for j in range(N):
                    out[b, i, c] += (scores[j] - mean + 1.0 / N) * v[b, j, c]
        if m.residual is not None:
            hidden = gelu(grouped_pointwise(m.residual[0], x[b].mean(0), h))
            r = grouped_pointwise(m.residual[2], hidden, h).reshape(C, 3, 3)
            for y in range(H):
                for xx in range(W):
                    for dy in (-1, 0, 1):
                        for dx in (-1, 0, 1):
                            if 0 <= y + dy < H and 0 <= xx + dx < W:
                                out[b, P + y * W + xx] += r[:, dy + 1, dx + 1] * v[b, P + (y + dy) * W + xx + dx]
    return out @ m.proj.weight.T + m.proj.bias


def attention_scores(m: InLineAttention, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """The injective linear attention map A (B, heads, N, N) from phi(q), phi(k); rows sum to 1."""
    N = k.shape[2]
    scores = (q @ k.transpose(-2, -1)) * (m.scale / N)
    return scores - scores.mean(dim=-1, keepdim=True) + 1.0 / N


def attention_map(m: InLineAttention, x: torch.Tensor) -> torch.Tensor:
    """The map A that the layer applies to the values of tokens ``x``."""
    q, k, _ = m._qkv(x)
    return attention_scores(m, q, k)


def local_shifts(m: InLineAttention, v: torch.Tensor, kernels: torch.Tensor) -> torch.Tensor:
    """The local term as nine weighted shifted copies of the zero-padded grid -> (B, H*W, C)."""
    B, C = kernels.shape[:2]
    H, W = m.grid_size
    pad = m.local_kernel_size // 2
    padded = nn.functional.pad(value_grid(v, m.grid_size, m.num_prefix_tokens), (pad, pad, pad, pad))
    out = torch.zeros_like(padded[..., :H, :W])
    for dy in range(m.local_kernel_size):
        for dx in range(m.local_kernel_size):
            out = out + kernels[:, :, dy, dx, None, None] * padded[:, :, dy : dy + H, dx : dx + W]
    return out.reshape(B, C, H * W).transpose(1, 2)


def materialised(m: InLineAttention, x: torch.Tensor) -> torch.Tensor:
    """The layer's output with A formed and the local term summed shift by shift."""
    B, N, C = x.shape
    q, k, v = m._qkv(x)
    out = (attention_scores(m, q, k) @ v).transpose(1, 2).reshape(B, N, C)
    if m.residual is not None:
        out = m._add_local(out, local_shifts(m, v, m.local_kernels(x)))
    return m.proj(out)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("prefix", [0, 1])
def test_matches_the_equations_token_by_token(kernel, prefix):
    grid = (3, 4)
    m = make_inline(prefix, grid, dim=12, heads=2, kernel=kernel).double()
    x = tokens(prefix, grid, dim=12, dtype=torch.float64)
    with torch.no_grad():
        got = m(x)
        expected = inline_from_equations(m, x)
        torch.testing.assert_close(materialised(m, x), expected, rtol=1e-10, atol=1e-12)
    assert got.shape == x.shape
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)


def test_equations_without_the_local_residual():
    m = make_inline(1, (3, 4), dim=12, heads=2, local_residual=False).double()
    x = tokens(1, (3, 4), dim=12, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(m(x), inline_from_equations(m, x), rtol=1e-10, atol=1e-12)


# -- the linear path == the materialised map -------------------------------------------------------


@pytest.mark.parametrize("prefix, grid", SHAPES)
@pytest.mark.parametrize("kernel", ["identity", "relu"])
def test_the_linear_path_equals_the_materialised_map_in_value_and_gradient(prefix, grid, kernel):
    m = make_inline(prefix, grid, kernel=kernel).double()
    x = tokens(prefix, grid, dtype=torch.float64).requires_grad_()
    fast = m(x)
    (grad_fast,) = torch.autograd.grad(fast.square().sum(), x)
    ref = materialised(m, x)
    (grad_ref,) = torch.autograd.grad(ref.square().sum(), x)
    torch.testing.assert_close(fast, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad_fast, grad_ref, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("prefix", [0, 1])
def test_the_map_rows_sum_to_one(kernel, prefix):
    """The InLine property: A 1 = 1 whatever the queries and keys, for every kernel."""
    m = make_inline(prefix, kernel=kernel).double()
    x = 5.0 * tokens(prefix, dtype=torch.float64)
    A = attention_map(m, x)
    N = x.shape[1]
    assert A.shape == (2, HEADS, N, N)
    torch.testing.assert_close(A.sum(-1), torch.ones(2, HEADS, N, dtype=torch.float64), rtol=0, atol=1e-12)


def test_the_map_is_injective_in_the_query_scale_where_linear_attention_is_not():
    """Scaling a query by c changes InLine's map; plain normalised linear attention gives the same map (the
    paper's non-injectivity), and InLine's entries, unlike softmax's, can be negative."""
    m = make_inline(0, (2, 2), dim=4, heads=1)
    q = torch.tensor([[[[1.0, 2.0, 0.5, 1.0]]]])
    k = torch.rand(1, 1, 4, 4) + 0.1
    A1, A3 = attention_scores(m, q, k), attention_scores(m, 3.0 * q, k)
    assert not torch.allclose(A1, A3)
    torch.testing.assert_close(A3 - 0.25, 3.0 * (A1 - 0.25))  # linear in the query around the uniform map

    def linear(qq):
        return (qq @ k.transpose(-1, -2)) / (qq @ k.transpose(-1, -2)).sum(-1, keepdim=True)

    torch.testing.assert_close(linear(q), linear(3.0 * q))
    assert (attention_scores(m, 100.0 * q, -k) < 0).any()


def test_the_layers_products_grow_linearly_in_tokens_where_the_maps_grow_quadratically():
    def products(grid, forward):
        m = make_inline(0, grid)
        x = tokens(0, grid, batch=1)
        with torch.no_grad():
            return count_flops(lambda: forward(m, x)).by_operator.get("aten.bmm", 0)

    layer = lambda m, x: m(x)  # noqa: E731
    assert products((16, 16), layer) == 4 * products((8, 8), layer)
    assert products((16, 16), materialised) > 12 * products((8, 8), materialised)


# -- class token, local residual, parameters -----------------------------------------------------------


def test_prefix_tokens_get_no_local_term_but_feed_the_local_kernel():
    with_local = make_inline(1)
    without = make_inline(1, local_residual=False)
    missing, unexpected = without.load_state_dict(with_local.state_dict(), strict=False)
    assert not missing and unexpected
    x = tokens(1)
    with torch.no_grad():
        a, b = with_local(x), without(x)
        torch.testing.assert_close(a[:, :1], b[:, :1])
        assert not torch.allclose(a[:, 1:], b[:, 1:])
        # the class token is part of the mean token that predicts the 3x3 kernels (official DeiT)
        x2 = x.clone()
        x2[:, 0] += 3.0
        assert not torch.allclose(with_local.local_kernels(x), with_local.local_kernels(x2))


def test_local_term_is_a_per_sample_depthwise_conv_of_the_patch_values():
    m = make_inline(1)
    x = tokens(1)
    with torch.no_grad():
        q, k, v = m._qkv(x)
        kernels = m.local_kernels(x)
        for b in range(2):
            grid = value_grid(v, m.grid_size, m.num_prefix_tokens)[b : b + 1]
            conv = nn.functional.conv2d(grid, kernels[b][:, None], padding=1, groups=DIM)
            expected = conv.flatten(2).transpose(1, 2)[0]
            torch.testing.assert_close(m._local_conv(v, kernels)[b], expected)
            torch.testing.assert_close(local_shifts(m, v, kernels)[b], expected)


def inline_layer_parameters(C: int, h: int, qkv_bias: bool = True) -> int:
    """Official InLineAttention: qkv Linear, proj Linear, residual = Conv1d(C, C, 1, groups=h) ->
    GELU -> Conv1d(C, 9C, 1, groups=h), both with bias."""
    return (3 * C * C + (3 * C if qkv_bias else 0)) + (C * C + C) + (C * C // h + C) + (9 * C * C // h + 9 * C)


@pytest.mark.parametrize("dim, heads", [(192, 6), (320, 10), (384, 12), (48, 3)])
def test_parameter_count_matches_the_official_module(dim, heads):
    m = InLineAttention(dim, heads, grid_size=14, qkv_bias=True)
    assert count_parameters(m) == inline_layer_parameters(dim, heads)
    assert count_parameters(InLineAttention(192, 6, grid_size=14, qkv_bias=True)) == 211_584


def test_state_dict_has_the_official_names_and_shapes():
    m = InLineAttention(192, 6, grid_size=14, qkv_bias=True)
    shapes = {k: tuple(v.shape) for k, v in m.state_dict().items()}
    assert shapes == {
        "qkv.weight": (576, 192),
        "qkv.bias": (576,),
        "proj.weight": (192, 192),
        "proj.bias": (192,),
        "residual.0.weight": (192, 32, 1),
        "residual.0.bias": (192,),
        "residual.2.weight": (1728, 32, 1),
        "residual.2.bias": (1728,),
    }


def inline_deit(dim: int, heads: int, img: int) -> VisionTransformer:
    model = VisionTransformer(img_size=img, patch_size=16, embed_dim=dim, depth=12, num_heads=heads, qkv_bias=True)
    for index, block in enumerate(model.blocks):
        block.attn = InLineAttention(
            dim,
            heads,
            grid_size=model.patch_embed.grid_size,
            num_prefix_tokens=model.num_prefix_tokens,
            layer_index=index,
            qkv_bias=True,
        )
    return model


def test_inline_deit_tiny_has_the_published_parameter_count():
    """README of LeapLabTHU/InLine: InLine-DeiT-T 6.5M (models/inline_deit.py: 192 wide, 12 deep, 6 heads)."""
    assert count_parameters(inline_deit(192, 6, 224)) / 1e6 == pytest.approx(6.478, abs=0.001)


@pytest.mark.slow
def test_inline_deit_tiny_has_the_published_macs():
    from vcarepro.metrics.complexity import model_flops

    assert model_flops(inline_deit(192, 6, 224), (1, 3, 224, 224)).macs / 1e9 == pytest.approx(1.1, abs=0.05)


def test_qk_norm_normalises_each_head_before_the_kernel():
    m = make_inline(1, qk_norm=True, norm_layer=nn.LayerNorm).double()
    with torch.no_grad():
        m.q_norm.weight.uniform_(0.5, 1.5)
        m.k_norm.bias.uniform_(-0.5, 0.5)
    x = tokens(1, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(m(x), materialised(m, x), rtol=1e-12, atol=1e-12)
        q, k, _ = m._qkv(x)
        raw = m.qkv(x)[..., DIM : 2 * DIM].reshape(2, -1, HEADS, DIM // HEADS).transpose(1, 2)
        torch.testing.assert_close(k, m.k_norm(raw))


# -- half precision ---------------------------------------------------------------------------------


def _fp32_output_and_grads(m, x):
    x = x.clone().requires_grad_()
    out = m(x)
    out.square().mean().backward()
    return out.detach(), x.grad, {n: p.grad.clone() for n, p in m.named_parameters()}


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("mode", ["autocast", "cast"])
@pytest.mark.parametrize("prefix, grid", [(1, (14, 14)), (0, (16, 16))])
def test_bfloat16_is_finite_and_close_to_float32(mode, prefix, grid):
    m = make_inline(prefix, grid).train()
    x = tokens(prefix, grid)
    out32, gx32, gp32 = _fp32_output_and_grads(m, x)
    m.zero_grad()
    if mode == "autocast":
        xb = x.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = m(xb)
        out.float().square().mean().backward()
        grads = {n: p.grad for n, p in m.named_parameters()}
    else:
        mb = make_inline(prefix, grid).train().to(torch.bfloat16)
        xb = x.to(torch.bfloat16).requires_grad_()
        out = mb(xb)
        out.float().square().mean().backward()
        grads = {n: p.grad for n, p in mb.named_parameters()}
    assert torch.isfinite(out).all() and torch.isfinite(xb.grad).all()
    # bf16 rounds to 2^-9 = 0.2% relative; measured 0.4-0.5% on output, input and parameter gradients
    assert _rel(out, out32) < 0.02
    assert _rel(xb.grad, gx32) < 0.02
    for name, g in grads.items():
        assert torch.isfinite(g).all(), name
        assert _rel(g, gp32[name]) < 0.02, name


def official_global_form(m, q, k, v):
    """The official file's expression: s q (k^T v) + (1 - d^-1/2 q . k_mean) v_mean (models/inline_deit.py)."""
    N = k.shape[2]
    root = (m.scale / N) ** 0.5
    kv = (k * root).transpose(-2, -1) @ (v * root)
    return q @ kv + (1 - m.scale * (q @ k.mean(2, keepdim=True).transpose(-2, -1))) * v.mean(2, keepdim=True)


@pytest.mark.parametrize("dtype, centred_tol, official_err", [(torch.float16, 2e-3, 0.05), (torch.bfloat16, 1e-2, 0.5)])
def test_kernel_sums_stay_finite_and_accurate_in_half_precision(dtype, centred_tol, official_err):
    """4096 tokens of same-sign keys and values (entries in [9, 11]): the plain sum k^T v overflows float16
    (max 65504); the layer's sum is a mean, and centring keeps the result accurate (measured 0.03% fp16,
    0.2% bf16) where the official form's two large terms cancel (16% fp16, 140% bf16)."""
    m = make_inline(0, (64, 64))
    torch.manual_seed(0)
    q, k, v = (torch.rand(1, HEADS, 4096, DIM // HEADS, dtype=torch.float64) * 2 + 9 for _ in range(3))
    exact = m._global_linear(q, k, v)
    torch.testing.assert_close(official_global_form(m, q, k, v), exact)  # the same function in float64
    half = [t.to(dtype) for t in (q, k, v)]
    if dtype == torch.float16:
        assert not torch.isfinite(half[1].transpose(-2, -1) @ half[2]).all()
    out = m._global_linear(*half)
    assert torch.isfinite(out).all()
    assert _rel(out, exact) < centred_tol
    assert _rel(official_global_form(m, *half), exact) > official_err


# -- grid changes, timm, errors -----------------------------------------------------------------------


def test_set_grid_size_follows_a_new_resolution():
    m = make_inline(1, (14, 14))
    m.set_grid_size((18, 12))
    assert m.grid_size == (18, 12)
    assert m(tokens(1, (18, 12))).shape == (2, 1 + 18 * 12, DIM)
    with pytest.raises(ValueError, match=r"got 197 tokens but expects 1 prefix \+ 18x12 grid = 217"):
        m(tokens(1, (14, 14)))
    with pytest.raises(ValueError, match="empty side"):
        m.set_grid_size((0, 4))


def test_works_as_the_attention_of_a_timm_block():
    block = Block(DIM, HEADS, qkv_bias=True)
    block.attn = make_inline(1)
    x = tokens(1)
    assert block(x).shape == x.shape
    assert block.attn(x, attn_mask=None).shape == x.shape


def test_timm_vit_init_leaves_the_kernel_predictor_at_pytorch_default():
    model = inline_deit(48, 3, 64)
    model.init_weights()
    conv = model.blocks[0].attn.residual[2]
    bound = 1 / math.sqrt(conv.weight.shape[1])  # kaiming-uniform(a=sqrt(5)) bound for fan_in = C / heads
    assert conv.weight.abs().max() <= bound and conv.weight.std() > 0.3 * bound
    assert model(torch.randn(1, 3, 64, 64)).shape == (1, 1000)


@pytest.mark.parametrize(
    "kw, pattern",
    [
        (dict(kernel="softmax"), "unknown kernel 'softmax'"),
        (dict(attn_drop=0.1), "attn_drop=0.1: InLine never forms the attention map"),
        (dict(qk_norm=True), "qk_norm=True needs a norm_layer"),
        (dict(num_prefix_tokens=-1), "num_prefix_tokens=-1 must be >= 0"),
        (dict(num_heads=5), "dim=48 is not divisible by num_heads=5"),
        (dict(grid_size=(0, 3)), "empty side"),
    ],
)
def test_bad_knob_values_are_refused(kw, pattern):
    args = {"num_heads": HEADS, "grid_size": GRID, **kw}
    with pytest.raises(ValueError, match=pattern):
        InLineAttention(DIM, **args)
