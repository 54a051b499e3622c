"""Circulant Attention, specified by its equations and by the official algorithm (issue 15)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from vcarepro.attention.circulant import CirculantAttention, flop_counter_mapping

DIM = 24
GRIDS = [(4, 6), (5, 5), (3, 7)]  # non-square, odd square, odd last side (rfft2 keeps 7 // 2 + 1 bins)
VARIANTS = {
    "default": {},
    "qkv_bias": dict(qkv_bias=True),
    "head_dim_4": dict(channels_per_kernel=4),
    "divisor_n": dict(logit_divisor="n"),
    "prefix_none": dict(prefix_attention="none"),
    "no_gate": dict(gate=False),
}


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    yield


def shift_table(grid):
    """(M, M) long tensor: entry [i, j] is the shift s = j - i (row-major index) on the cyclic H x W grid."""
    H, W = grid
    r = torch.arange(H).repeat_interleave(W)
    c = torch.arange(W).repeat(H)
    return ((r[None, :] - r[:, None]) % H) * W + (c[None, :] - c[:, None]) % W


def attention_matrix(m: CirculantAttention, x: torch.Tensor):
    """The full (B, kernels, N, N) attention matrix from the equations, no FFT, and v (B, kernels, N, d).

    Rows and columns are the input's tokens (prefix first). The patch-patch block is the row softmax of the BCCB
    projection of q k^T / sqrt(d) (times rho M); patch rows give 0 to prefix columns; prefix rows follow
    ``prefix_attention``. Attention dropout drops kernel shifts, drawn as the layer draws them."""
    B, N, C = x.shape
    H, W = m.grid_size
    M, P, G = H * W, m.num_prefix_tokens, m.num_heads
    work = torch.promote_types(x.dtype, torch.float32)
    q, k, v = (m._split_heads(t) for t in m.qkv(x).to(work).chunk(3, dim=-1))  # (B, G, N, d)
    scores = q @ k.transpose(-2, -1) * m.scale
    shifts = shift_table((H, W))
    # mean along each cyclic diagonal j - i = s: the nearest BCCB matrix (Frobenius), kernel form
    diagonal_sum = torch.zeros(B, G, M, dtype=work)
    diagonal_sum.scatter_add_(-1, shifts.reshape(1, 1, M * M).expand(B, G, -1), scores[..., P:, P:].reshape(B, G, -1))
    rho_m = M**0.5 if m.logit_divisor == "sqrt_n" else 1.0  # rho * M
    circulant = ((diagonal_sum / M)[:, :, shifts] * rho_m).softmax(dim=-1)
    if m.training and m.attn_drop_p > 0:
        keep = m.attn_drop(torch.ones(B, M, G, dtype=work)).transpose(1, 2)
        circulant = circulant * keep[:, :, shifts]
    attn = scores.new_zeros(B, G, N, N)
    attn[..., P:, P:] = circulant
    if P and m.prefix_attention == "global":
        attn[..., :P, :] = scores[..., :P, :].softmax(dim=-1)
    return attn, v


def materialised(m: CirculantAttention, x: torch.Tensor) -> torch.Tensor:
    """The layer's output through :func:`attention_matrix` instead of its FFTs."""
    B, N, C = x.shape
    attn, v = attention_matrix(m, x)
    return m._finish(x, (attn @ v).transpose(1, 2).reshape(B, N, C))


def make_ca(prefix: int = 1, grid=(4, 6), seed: int = 0, dim: int = DIM, dtype=torch.float64, **kw):
    torch.manual_seed(seed)
    m = CirculantAttention(dim, 3, grid_size=grid, num_prefix_tokens=prefix, **kw)
    with torch.no_grad():  # biases start at zero under timm's init; make them count here
        for name, p in m.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.5)
    return m.to(dtype).eval()


def tokens(prefix: int = 1, grid=(4, 6), batch: int = 2, seed: int = 1, dim: int = DIM, dtype=torch.float64):
    torch.manual_seed(seed)
    return torch.randn(batch, prefix + grid[0] * grid[1], dim, dtype=dtype)


def gate_and_project(m: CirculantAttention, x: torch.Tensor, mixed: torch.Tensor) -> torch.Tensor:
    if m.gate is not None:
        mixed = mixed * F.silu(F.linear(x, m.gate[0].weight, m.gate[0].bias))
    return F.linear(mixed, m.proj.weight, m.proj.bias)


def ca_from_equations(m: CirculantAttention, x: torch.Tensor) -> torch.Tensor:
    """Group by group (d channels) and shift by shift, with cyclic rolls of the H x W grid:
    l[s] = rho / sqrt(d) sum_{c, n} q_c[n] k_c[n + s],  a = softmax_s(l),  o_c[i] = sum_s a[s] v_c[i + s];
    prefix tokens ("global"): softmax over all N tokens of q_p . k_j / sqrt(d)."""
    B, N, C = x.shape
    (H, W), P, d = m.grid_size, m.num_prefix_tokens, m.head_dim
    M = H * W
    rho = M**-0.5 if m.logit_divisor == "sqrt_n" else 1.0 / M
    q, k, v = F.linear(x, m.qkv.weight, m.qkv.bias).split(C, dim=-1)
    out = torch.zeros_like(x)
    for b in range(B):
        for g in range(C // d):
            c = slice(g * d, (g + 1) * d)
            qg, kg, vg = (t[b, P:, c].reshape(H, W, d) for t in (q, k, v))
            logits = torch.empty(H, W, dtype=x.dtype)
            for sr in range(H):
                for sc in range(W):
                    k_shifted = torch.roll(kg, shifts=(-sr, -sc), dims=(0, 1))  # [n] -> k[n + s]
                    logits[sr, sc] = rho / math.sqrt(d) * (qg * k_shifted).sum()
            a = logits.flatten().softmax(0).reshape(H, W)
            o = torch.zeros(H, W, d, dtype=x.dtype)
            for sr in range(H):
                for sc in range(W):
                    o += a[sr, sc] * torch.roll(vg, shifts=(-sr, -sc), dims=(0, 1))
            out[b, P:, c] = o.reshape(M, d)
            if P and m.prefix_attention == "global":
                weights = (q[b, :P, c] @ k[b, :, c].T / math.sqrt(d)).softmax(-1)
                out[b, :P, c] = weights @ v[b, :, c]
    return gate_and_project(m, x, out)


def ca_official_algorithm(m: CirculantAttention, x: torch.Tensor) -> torch.Tensor:
    """ca_deit.py's CirculantAttention.forward restated (no prefix tokens, H x W grid): orthonormal FFT of x,
    the bias-free qkv weights on the spectrum's real and imaginary parts, conj(Q) K, orthonormal inverse FFT,
    softmax over the shifts, FFT of the kernel (unnormalised), conj times V, orthonormal inverse FFT, gate."""
    B, N, C = x.shape
    H, W = m.grid_size
    spectrum = torch.fft.rfft2(x.reshape(B, H, W, C), dim=(1, 2), norm="ortho")
    parts = torch.view_as_real(spectrum).transpose(-2, -1)
    qkv = torch.view_as_complex(F.linear(parts, m.qkv.weight).transpose(-2, -1).contiguous())
    q, k, v = qkv.chunk(3, dim=-1)
    logits = torch.fft.irfft2(torch.conj(q) * k, s=(H, W), dim=(1, 2), norm="ortho")
    kernel = torch.fft.rfft2(logits.reshape(B, N, C).softmax(dim=1).reshape(B, H, W, C), dim=(1, 2))
    out = torch.fft.irfft2(torch.conj(kernel) * v, s=(H, W), dim=(1, 2), norm="ortho")
    return gate_and_project(m, x, out.reshape(B, N, C))


def ca_readme_equation(m: CirculantAttention, x: torch.Tensor) -> torch.Tensor:
    """The README's a = 1/(N sqrt(d)) F^-1(conj(F Q) . F K) 1_d,  O = F^-1(conj(F softmax(a)) . F V), d = 1,
    with the plain DFT pair (F^-1 carries 1/N), no prefix tokens."""
    B, N, C = x.shape
    H, W = m.grid_size
    q, k, v = (t.reshape(B, H, W, C) for t in F.linear(x, m.qkv.weight).split(C, dim=-1))
    fft, ifft = (lambda t: torch.fft.fft2(t, dim=(1, 2))), (lambda t: torch.fft.ifft2(t, dim=(1, 2)))
    a = ifft(torch.conj(fft(q)) * fft(k)).real / N
    s = a.reshape(B, N, C).softmax(1).reshape(B, H, W, C)
    out = ifft(torch.conj(fft(s)) * fft(v)).real
    return gate_and_project(m, x, out.reshape(B, N, C))


# -- the two paths and the equations ---------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("prefix", [0, 1, 2])
@pytest.mark.parametrize("grid", GRIDS)
def test_fft_path_equals_the_materialised_matrix_in_value_and_gradient(variant, prefix, grid):
    m = make_ca(prefix, grid, **VARIANTS[variant])
    x = tokens(prefix, grid).requires_grad_()
    fast = m(x)
    (grad_fast,) = torch.autograd.grad(fast.square().sum(), x)
    ref = materialised(m, x)
    (grad_ref,) = torch.autograd.grad(ref.square().sum(), x)
    assert fast.shape == x.shape
    torch.testing.assert_close(fast, ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(grad_fast, grad_ref, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("prefix", [0, 1])
def test_paths_agree_on_the_deit_grid(prefix):
    m = make_ca(prefix, (14, 14))
    x = tokens(prefix, (14, 14), batch=1)
    with torch.no_grad():
        torch.testing.assert_close(m(x), materialised(m, x), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize(
    "kw",
    [
        {},
        dict(channels_per_kernel=2),
        dict(logit_divisor="n"),
        dict(prefix_attention="none"),
        dict(gate=False, qkv_bias=True),
    ],
)
@pytest.mark.parametrize("prefix", [0, 1, 2])
def test_matches_the_equations_group_by_group_and_shift_by_shift(kw, prefix):
    m = make_ca(prefix, (3, 4), dim=8, **kw)
    x = tokens(prefix, (3, 4), dim=8)
    with torch.no_grad():
        torch.testing.assert_close(m(x), ca_from_equations(m, x), rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(materialised(m, x), ca_from_equations(m, x), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("grid", [(5, 5), (14, 14), (4, 6)])
def test_default_layer_is_the_official_algorithm_and_divisor_n_is_the_readme_equation(grid):
    official = make_ca(0, grid)
    readme = make_ca(0, grid, logit_divisor="n")
    readme.load_state_dict(official.state_dict())
    x = tokens(0, grid, batch=1)
    with torch.no_grad():
        torch.testing.assert_close(official(x), ca_official_algorithm(official, x), rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(readme(x), ca_readme_equation(readme, x), rtol=1e-10, atol=1e-10)
        # the two scalings differ by sqrt(M) in the logits, so the outputs differ
        assert not torch.allclose(official(x), readme(x), atol=1e-3)


# -- structure of the attention matrix ---------------------------------------------------------


@pytest.mark.parametrize("prefix_attention", ["global", "none"])
@pytest.mark.parametrize("grid", GRIDS)
def test_attention_matrix_is_bccb_on_the_grid_and_rows_are_distributions(prefix_attention, grid):
    P = 1
    m = make_ca(P, grid, prefix_attention=prefix_attention, channels_per_kernel=2)
    with torch.no_grad():
        A = attention_matrix(m, tokens(P, grid))[0]
    H, W = grid
    M = H * W
    assert A.shape == (2, DIM // 2, P + M, P + M)
    block = A[..., P:, P:]
    # A[i, j] depends only on (j - i) mod the grid: every row is row 0 read at the shifts j - i
    shifts = shift_table(grid)
    torch.testing.assert_close(block, block[..., 0, :][..., shifts], rtol=0, atol=1e-15)
    # and explicitly: moving both tokens by the same 2-D offset leaves the weight unchanged
    r, c = torch.arange(M) // W, torch.arange(M) % W
    moved = ((r + 1) % H) * W + (c + 2) % W
    torch.testing.assert_close(block[..., moved[:, None], moved[None, :]], block, rtol=0, atol=1e-15)
    assert not torch.allclose(block[..., 0, :], block[..., 0, :].mean(-1, keepdim=True))  # not uniform
    torch.testing.assert_close(block.sum(-1), torch.ones_like(block.sum(-1)))
    assert torch.all(A[..., P:, :P] == 0), "patches must not attend to prefix tokens"
    if prefix_attention == "global":
        torch.testing.assert_close(A[..., :P, :].sum(-1), torch.ones(2, DIM // 2, P, dtype=A.dtype))
    else:
        assert torch.all(A[..., :P, :] == 0)


def test_shift_table_is_the_cyclic_difference():
    H, W = 3, 4
    table = shift_table((H, W))
    for i in range(H * W):
        for j in range(H * W):
            (ri, ci), (rj, cj) = divmod(i, W), divmod(j, W)
            assert table[i, j] == ((rj - ri) % H) * W + (cj - ci) % W


def test_cyclic_translation_of_the_grid_commutes_with_the_layer():
    """BCCB attention and token-wise projections make the layer equivariant to cyclic grid shifts."""
    m = make_ca(0, (4, 6))
    x = tokens(0, (4, 6))

    def shift(t):
        return torch.roll(t.reshape(2, 4, 6, DIM), shifts=(1, -2), dims=(1, 2)).reshape(2, 24, DIM)

    with torch.no_grad():
        torch.testing.assert_close(m(shift(x)), shift(m(x)), rtol=1e-10, atol=1e-10)


# -- prefix tokens ------------------------------------------------------------------------------


def test_patches_ignore_prefix_tokens_and_global_prefix_tokens_read_the_patches():
    glob, none = make_ca(1), make_ca(1, prefix_attention="none")
    none.load_state_dict(glob.state_dict())
    x = tokens(1)
    x_cls = x.clone()
    x_cls[:, 0] += 3.0
    x_patch = x.clone()
    x_patch[:, 5] += 3.0
    with torch.no_grad():
        base, other_cls, other_patch = (glob(t) for t in (x, x_cls, x_patch))
        # changing the class token changes no patch output
        torch.testing.assert_close(other_cls[:, 1:], base[:, 1:], rtol=1e-12, atol=1e-12)
        # changing a patch changes the class token's output under "global"
        assert not torch.allclose(other_patch[:, 0], base[:, 0], atol=1e-4)
        # "none": same patch outputs, and the prefix output is the projection of nothing
        out_none = none(x)
        torch.testing.assert_close(out_none[:, 1:], base[:, 1:], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(out_none[:, 0], none.proj.bias.expand(2, DIM), rtol=1e-12, atol=1e-12)


def test_without_prefix_tokens_the_qkv_bias_only_moves_the_zero_frequency():
    """The fast path adds the bias as M * b at frequency (0, 0); a bias is a constant over the grid."""
    m = make_ca(0, (4, 6), qkv_bias=True)
    x = tokens(0, (4, 6))
    with torch.no_grad():
        spectra = m._qkv_spectrum(x.reshape(2, 4, 6, DIM), torch.float64)
        direct = torch.fft.rfft2(m.qkv(x).reshape(2, 4, 6, 3 * DIM), dim=(1, 2))
    torch.testing.assert_close(spectra, direct, rtol=1e-10, atol=1e-10)


# -- parameters, gradients, dropout ------------------------------------------------------------


@pytest.mark.parametrize("dim", [192, 384])
def test_parameter_count_is_the_official_modules(dim):
    """ca_deit.py: qkv = Linear(dim, 3 dim) without bias, gate = Sequential(Linear(dim, dim), SiLU),
    proj = Linear(dim, dim): 3 C^2 + (C^2 + C) + (C^2 + C)."""
    m = CirculantAttention(dim, 3, grid_size=14, num_prefix_tokens=0)
    assert sum(p.numel() for p in m.parameters()) == 5 * dim * dim + 2 * dim
    assert {n: tuple(p.shape) for n, p in m.named_parameters()} == {
        "qkv.weight": (3 * dim, dim),
        "gate.0.weight": (dim, dim),
        "gate.0.bias": (dim,),
        "proj.weight": (dim, dim),
        "proj.bias": (dim,),
    }
    assert (
        sum(p.numel() for p in CirculantAttention(dim, 3, grid_size=14, gate=False).parameters()) == 4 * dim * dim + dim
    )
    assert (
        sum(p.numel() for p in CirculantAttention(dim, 3, grid_size=14, qkv_bias=True).parameters())
        == 5 * dim * dim + 5 * dim
    )
    # neither the head count nor the grid changes anything
    assert (
        sum(p.numel() for p in CirculantAttention(dim, 6, grid_size=(7, 9), channels_per_kernel=4).parameters())
        == 5 * dim * dim + 2 * dim
    )


def test_num_heads_is_ignored_and_head_dim_sets_the_kernels():
    a, b = CirculantAttention(DIM, 3, grid_size=4), CirculantAttention(DIM, 8, grid_size=4)
    assert (a.num_heads, a.head_dim) == (b.num_heads, b.head_dim) == (DIM, 1)
    assert CirculantAttention(DIM, 3, grid_size=4, channels_per_kernel=4).num_heads == DIM // 4


@pytest.mark.parametrize("kw", [{}, dict(qkv_bias=True, prefix_attention="none")])
@pytest.mark.parametrize("prefix", [0, 1])
def test_gradients_reach_every_parameter(kw, prefix):
    m = make_ca(prefix, dtype=torch.float32, **kw).train()
    m(tokens(prefix, dtype=torch.float32)).square().mean().backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, f"{name} received no gradient"


def test_attention_dropout_drops_kernel_shifts_so_the_matrix_stays_circulant():
    m = make_ca(0, (4, 6), attn_drop=0.5).train()
    x = tokens(0, (4, 6))
    with torch.no_grad():
        torch.manual_seed(3)
        A = attention_matrix(m, x)[0]
        torch.testing.assert_close(A, A[..., 0, :][..., shift_table((4, 6))], rtol=0, atol=1e-15)
        assert (A == 0).any() and (A.sum(-1) != 1).any()
        # the layer's FFTs drop the same shifts: its output is that matrix's
        torch.manual_seed(3)
        expected = materialised(m, x)
        torch.manual_seed(3)
        torch.testing.assert_close(m(x), expected, rtol=1e-10, atol=1e-10)


# -- precision -----------------------------------------------------------------------------------


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("prefix", [0, 1])
@pytest.mark.parametrize("mode", ["autocast", "cast"])
def test_bf16_is_finite_and_close_to_fp32(prefix, mode):
    """bf16 keeps 8 bits of mantissa; the FFTs and softmax run in float32 inside. Stated tolerance:
    2% relative (Frobenius) error on the output, the input gradient and every parameter gradient (measured:
    0.3% on the output, under 0.9% on the gradients)."""
    grid, dim = (14, 14), 48
    m32 = make_ca(prefix, grid, dim=dim, dtype=torch.float32)
    x32 = tokens(prefix, grid, dim=dim, dtype=torch.float32).requires_grad_()
    out32 = m32(x32)
    out32.square().mean().backward()

    m16 = make_ca(prefix, grid, dim=dim, dtype=torch.float32)
    x16 = x32.detach().clone()
    if mode == "cast":
        m16, x16 = m16.to(torch.bfloat16), x16.to(torch.bfloat16)
    x16.requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=(mode == "autocast")):
        out16 = m16(x16)
    assert out16.dtype == torch.bfloat16
    out16.float().square().mean().backward()

    assert torch.isfinite(out16).all() and torch.isfinite(x16.grad).all()
    assert _relative(out16, out32) < 0.02
    assert _relative(x16.grad, x32.grad) < 0.02
    grads32 = dict((n, p.grad) for n, p in m32.named_parameters())
    for name, p in m16.named_parameters():
        assert torch.isfinite(p.grad).all(), name
        assert _relative(p.grad, grads32[name]) < 0.02, name


def test_large_activations_do_not_overflow_the_softmax():
    m = make_ca(1, (14, 14), dtype=torch.float32)
    x = 50.0 * tokens(1, (14, 14), dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.isfinite(m(x)).all()


# -- errors, grid changes, timm -------------------------------------------------------------------


def test_wrong_channel_count_is_refused():
    with pytest.raises(ValueError, match=r"expects tokens \(B, N, 24\)"):
        make_ca(1)(torch.randn(1, 25, 12, dtype=torch.float64))


@pytest.mark.parametrize(
    "kw, pattern",
    [
        (dict(channels_per_kernel=5), "channels_per_kernel=5 must be a positive divisor of dim=24"),
        (dict(channels_per_kernel=0), "channels_per_kernel=0 must be a positive divisor"),
        (dict(logit_divisor="sqrt"), "unknown logit_divisor 'sqrt'"),
        (dict(prefix_attention="cls"), "unknown prefix_attention 'cls'"),
        (dict(num_prefix_tokens=-1), "num_prefix_tokens=-1 must be >= 0"),
        (dict(qk_norm=True, norm_layer=nn.LayerNorm), "does not support qk_norm"),
        (dict(grid_size=(0, 4)), "must have positive sides"),
    ],
)
def test_bad_knobs_are_refused(kw, pattern):
    args = dict(grid_size=(4, 6))
    args.update(kw)
    with pytest.raises(ValueError, match=pattern):
        CirculantAttention(DIM, 3, **args)


def test_set_grid_size_follows_a_new_grid():
    m = make_ca(1, (4, 6))
    m.set_grid_size((5, 3))
    x = tokens(1, (5, 3))
    with torch.no_grad():
        out = m(x)
        torch.testing.assert_close(out, materialised(m, x), rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(out, ca_from_equations(m, x), rtol=1e-10, atol=1e-10)
    assert out.shape == x.shape
    with pytest.raises(ValueError, match="expects 1 prefix"):
        m(tokens(1, (4, 6)))


def test_timm_call_convention_and_block():
    from timm.layers import Mlp  # noqa: F401  (timm's Block imports it; just check timm is there)
    from timm.models.vision_transformer import Block

    m = make_ca(1, dtype=torch.float32)
    x = tokens(1, dtype=torch.float32)
    assert m(x, attn_mask=None).shape == x.shape
    block = Block(DIM, num_heads=3)
    block.attn = m
    assert block(x).shape == x.shape


def test_timm_vision_transformer_with_the_layer_swapped_in_runs_forward_and_backward():
    from timm.models import VisionTransformer

    for class_token in (True, False):
        vit = VisionTransformer(
            img_size=32,
            patch_size=8,
            embed_dim=DIM,
            depth=2,
            num_heads=3,
            num_classes=5,
            class_token=class_token,
            global_pool="token" if class_token else "avg",
        )
        for i, block in enumerate(vit.blocks):
            block.attn = CirculantAttention(
                DIM, 3, grid_size=vit.patch_embed.grid_size, num_prefix_tokens=vit.num_prefix_tokens, layer_index=i
            )
        out = vit(torch.randn(2, 3, 32, 32))
        assert out.shape == (2, 5)
        out.sum().backward()


# -- FLOP counting -----------------------------------------------------------------------------------


def test_flop_mapping_counts_ffts_by_the_stated_convention():
    x = torch.randn(2, 8, 4, 3)
    counter = FlopCounterMode(display=False, custom_mapping=flop_counter_mapping())
    with counter:
        spectrum = torch.fft.rfft2(x, dim=(1, 2))
        torch.fft.irfft2(spectrum, s=(8, 4), dim=(1, 2))
        torch.fft.fft2(x.to(torch.complex64), dim=(1, 2))
    n, transforms = 32, 6
    real = 2.5 * transforms * n * math.log2(n)
    assert counter.get_total_flops() == int(2 * real + 2 * real)  # r2c + c2r + one complex (5 n log2 n)


@pytest.mark.parametrize("prefix, prefix_attention", [(0, "global"), (1, "global"), (1, "none")])
def test_flop_mapping_adds_exactly_the_layers_ffts(prefix, prefix_attention):
    grid, B = (14, 14), 2
    m = make_ca(prefix, grid, dtype=torch.float32, prefix_attention=prefix_attention)
    x = tokens(prefix, grid, batch=B, dtype=torch.float32)

    def flops(mapping):
        counter = FlopCounterMode(display=False, custom_mapping=mapping)
        with torch.no_grad(), counter:
            m(x)
        return counter.get_total_flops()

    M, C = 196, DIM
    per_transform = 2.5 * M * math.log2(M)
    # forward transforms: x (C) or q, k, v (3C); logits c2r (C); kernel r2c (C); output c2r (C)
    first = 3 * C if prefix and prefix_attention == "global" else C
    expected = B * (first + 3 * C) * per_transform
    assert flops(flop_counter_mapping()) - flops({}) == pytest.approx(expected, rel=1e-6)
