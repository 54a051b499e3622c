"""Visual-Contrast Attention, specified by its equations (issue 2)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from helpers import attention_path, pooled_queries
from vcarepro.attention import VisualContrastAttention, lambda_init_for_layer

DIM, HEADS = 48, 3  # head_dim 16: small, even (the diff ablation halves it)
GRID, CONTRAST = (8, 6), (4, 3)
# contrast grids that do not divide the patch grid: overlapping adaptive windows (PVT's 9 tokens on 56x56)
UNEVEN = [((8, 6), (3, 4)), ((7, 7), (3, 3)), ((5, 9), (2, 4))]

VARIANTS = {
    "default": {},
    "stage1_only": dict(stage2="diff"),
    "stage2_only": dict(stage1="diff"),
    "diff_both": dict(stage1="diff", stage2="diff"),
    "emb_tokens": dict(tokens_pos="emb", tokens_neg="emb"),
    "pos_pool_only": dict(tokens_pos="pool"),
    "separate_softmax": dict(stage2_softmax="separate"),
    "no_local": dict(local_conv=False),
}


def make_vca(
    prefix: int = 1, layer_index: int = 2, seed: int = 0, grid=GRID, contrast=CONTRAST, **kw
) -> VisualContrastAttention:
    torch.manual_seed(seed)
    attn = VisualContrastAttention(
        DIM,
        HEADS,
        grid_size=grid,
        num_prefix_tokens=prefix,
        contrast_tokens=contrast,
        layer_index=layer_index,
        qkv_bias=True,
        **kw,
    )
    # RMSNorm weights and the conv start at constants; perturb them so a swapped
    # or dropped weight shows up in the comparisons below.
    with torch.no_grad():
        for p in attn.parameters():
            if p.dim() == 1 or p.shape[0] == DIM and p.dim() == 4:
                p.add_(0.1 * torch.randn_like(p))
    return attn.eval()


def tokens(prefix: int = 1, batch: int = 2, seed: int = 1, grid=GRID) -> torch.Tensor:
    torch.manual_seed(seed)
    return torch.randn(batch, prefix + grid[0] * grid[1], DIM)


def rms(x, weight, eps=1e-5):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def vca_from_equations(m: VisualContrastAttention, x: torch.Tensor) -> torch.Tensor:
    """The default VCA written head by head straight from the paper's equations."""
    B, N, C = x.shape
    d, P = C // m.num_heads, m.num_prefix_tokens
    (H, W), (h, w) = m.grid_size, m.contrast_grid
    n = h * w
    q, k, v = F.linear(x, m.qkv.weight, m.qkv.bias).split(C, dim=-1)
    lam_init = 0.8 - 0.6 * math.exp(-0.3 * m.layer_index)
    lam = [math.exp(s.q1 @ s.k1) - math.exp(s.q2 @ s.k2) + lam_init for s in (m.lambda1, m.lambda2)]
    heads = []
    for head in range(m.num_heads):
        c = slice(head * d, (head + 1) * d)
        qh, kh, vh = q[..., c], k[..., c], v[..., c]
        t = pooled_queries(qh[:, P:], (H, W), (h, w))
        t_pos, t_neg = t + m.embed_pos[:, c], t + m.embed_neg[:, c]
        v_pos = torch.softmax(t_pos @ kh.transpose(1, 2) / math.sqrt(d), -1) @ vh
        v_neg = torch.softmax(t_neg @ kh.transpose(1, 2) / math.sqrt(d), -1) @ vh
        v_hat = (1 - lam_init) * rms(v_pos - lam[0] * v_neg, m.stage1_norm.weight)
        A = torch.softmax(qh @ torch.cat([t_pos, t_neg], 1).transpose(1, 2) / math.sqrt(d), -1)
        heads.append((1 - lam_init) * rms((A[..., :n] - lam[1] * A[..., n:]) @ v_hat, m.stage2_norm.weight))
    out = torch.cat(heads, -1)
    v_grid = v[:, P:].reshape(B, H, W, C).permute(0, 3, 1, 2)
    local = F.conv2d(v_grid, m.local_conv.weight, m.local_conv.bias, padding=1, groups=C)
    out = torch.cat([out[:, :P], out[:, P:] + local.flatten(2).transpose(1, 2)], 1)
    return F.linear(out, m.proj.weight, m.proj.bias)


@pytest.mark.parametrize("prefix", [0, 1, 2])
@pytest.mark.parametrize("fused", [True, False])
def test_matches_the_equations_head_by_head(prefix, fused):
    m = attention_path(make_vca(prefix=prefix), fused)
    x = tokens(prefix)
    with torch.no_grad():
        expected = vca_from_equations(m, x)
        got = m(x)
    assert got.shape == x.shape
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("grid, contrast", UNEVEN)
@pytest.mark.parametrize("fused", [True, False])
def test_contrast_grids_that_do_not_divide_the_patch_grid_pool_overlapping_windows(grid, contrast, fused):
    m = attention_path(make_vca(grid=grid, contrast=contrast), fused)
    x = tokens(grid=grid)
    with torch.no_grad():
        got = m(x)
        expected = vca_from_equations(m, x)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


def test_pooling_is_pytorchs_adaptive_average_pooling_and_each_token_the_mean_of_its_window():
    # 9 tokens on a 56x56 grid, as in PVT-T's first stage: windows of 19 cells overlapping by one
    m = VisualContrastAttention(DIM, HEADS, grid_size=56, num_prefix_tokens=0, contrast_tokens=9)
    q = torch.randn(2, HEADS, 56 * 56, DIM // HEADS)
    t_pos, _ = m.contrast_tokens(q)
    embed = m._split_heads(m.embed_pos[None])
    expected = F.adaptive_avg_pool2d(q.transpose(-1, -2).reshape(2 * HEADS, -1, 56, 56), 3)
    torch.testing.assert_close(t_pos, expected.reshape(2, HEADS, -1, 9).transpose(-1, -2) + embed)
    means = pooled_queries(q.reshape(2 * HEADS, 56 * 56, -1), (56, 56), (3, 3)).reshape(2, HEADS, 9, -1)
    torch.testing.assert_close(t_pos, means + embed, rtol=1e-5, atol=1e-5)
    window = pooled_queries(q[0, 0:1], (56, 56), (3, 3))[0, 4]  # the centre token: rows and columns 18..37
    torch.testing.assert_close(window, q[0, 0].reshape(56, 56, -1)[18:38, 18:38].mean(dim=(0, 1)))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("prefix", [0, 1])
def test_fused_and_materialised_attention_agree_in_value_and_gradient(variant, prefix):
    m = make_vca(prefix=prefix, **VARIANTS[variant])
    x = tokens(prefix).requires_grad_()
    fused = attention_path(m, True)(x)
    (grad_fused,) = torch.autograd.grad(fused.square().sum(), x)
    ref = attention_path(m, False)(x)
    (grad_ref,) = torch.autograd.grad(ref.square().sum(), x)
    torch.testing.assert_close(fused, ref, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(grad_fused, grad_ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("fused", [True, False])
def test_gradients_reach_every_parameter(variant, fused):
    m = attention_path(make_vca(**VARIANTS[variant]).train(), fused)
    m(tokens()).square().mean().backward()
    for name, p in m.named_parameters():
        assert p.grad is not None, f"{name} received no gradient"
        assert p.grad.abs().sum() > 0, f"{name} received an all-zero gradient"


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v != "default"])
def test_each_ablation_switch_changes_the_output(variant):
    base = make_vca()
    other = make_vca(**VARIANTS[variant])
    # same weights wherever the two share a parameter, so only the switch differs
    missing, _ = other.load_state_dict(base.state_dict(), strict=False)
    assert not missing
    x = tokens()
    with torch.no_grad():
        assert not torch.allclose(base(x), other(x), atol=1e-4), f"{variant} did not change the output"


def test_parameters_each_variant_owns():
    assert make_vca().embed_neg is not None
    diff_both = make_vca(stage1="diff", stage2="diff")
    assert diff_both.embed_neg is None, "no stage contrasts t- so e- must not exist"
    assert make_vca(tokens_pos="pool").embed_pos is None
    assert make_vca(local_conv=False).local_conv is None


def test_pooled_streams_without_embeddings_collapse_stage_one_to_a_scaled_attention():
    """With t+ = t- (both streams pooled only), v+ - lambda1 v- = (1 - lambda1) v+."""
    m = make_vca(tokens_pos="pool", tokens_neg="pool")
    x = tokens()
    with torch.no_grad():
        q, k, v = m.qkv(x).reshape(2, -1, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
        t_pos, t_neg = m.contrast_tokens(q)
        torch.testing.assert_close(t_pos, t_neg)
        lam1 = m.lambdas()[0]
        got = m._global_contrast(t_pos, t_neg, k, v, lam1)
        plain = F.scaled_dot_product_attention(t_pos, k, v)
        expected = (1 - m.lambda_init) * rms((1 - lam1) * plain, m.stage1_norm.weight)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


def test_separate_softmax_is_two_softmaxes_and_joint_is_one():
    m_joint, m_sep = make_vca(), make_vca(stage2_softmax="separate")
    m_sep.load_state_dict(m_joint.state_dict())
    x = tokens()
    with torch.no_grad():
        q, k, v = m_joint.qkv(x).reshape(2, -1, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
        t_pos, t_neg = m_joint.contrast_tokens(q)
        v_hat = torch.randn(2, HEADS, t_pos.shape[2], DIM // HEADS)
        lam2 = torch.tensor(0.5)
        scale = m_joint.scale
        sep = m_sep._patch_contrast(q, t_pos, t_neg, v_hat, lam2)
        joint = m_joint._patch_contrast(q, t_pos, t_neg, v_hat, lam2)
        a_pos = torch.softmax(q @ t_pos.transpose(-1, -2) * scale, -1)
        a_neg = torch.softmax(q @ t_neg.transpose(-1, -2) * scale, -1)
        expected_sep = (1 - m_sep.lambda_init) * rms((a_pos - lam2 * a_neg) @ v_hat, m_sep.stage2_norm.weight)
        a = torch.softmax(q @ torch.cat([t_pos, t_neg], 2).transpose(-1, -2) * scale, -1)
        n = t_pos.shape[2]
        expected_joint = (1 - m_joint.lambda_init) * rms(
            (a[..., :n] - lam2 * a[..., n:]) @ v_hat, m_joint.stage2_norm.weight
        )
    torch.testing.assert_close(sep, expected_sep, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(joint, expected_joint, rtol=1e-4, atol=1e-5)


def test_diff_stage_splits_each_head_into_halves_with_half_dim_scale():
    m = make_vca(stage1="diff")
    x = tokens()
    with torch.no_grad():
        q, k, v = m.qkv(x).reshape(2, -1, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
        t_pos, _ = m.contrast_tokens(q)
        lam1 = torch.tensor(0.3)
        got = m._global_contrast(t_pos, None, k, v, lam1)
        half = DIM // HEADS // 2
        a1 = torch.softmax(t_pos[..., :half] @ k[..., :half].transpose(-1, -2) / math.sqrt(half), -1)
        a2 = torch.softmax(t_pos[..., half:] @ k[..., half:].transpose(-1, -2) / math.sqrt(half), -1)
        expected = (1 - m.lambda_init) * rms((a1 - lam1 * a2) @ v, m.stage1_norm.weight)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


def test_emb_tokens_ignore_the_input_and_pool_tokens_follow_it():
    m = make_vca(tokens_pos="emb", tokens_neg="pool")
    q1 = torch.randn(2, HEADS, 1 + GRID[0] * GRID[1], DIM // HEADS)
    q2 = torch.randn_like(q1)
    t_pos1, t_neg1 = m.contrast_tokens(q1)
    t_pos2, t_neg2 = m.contrast_tokens(q2)
    torch.testing.assert_close(t_pos1, t_pos2)
    assert not torch.allclose(t_neg1, t_neg2)
    # the class token (prefix) is never pooled
    q3 = q1.clone()
    q3[:, :, 0] += 100.0
    torch.testing.assert_close(m.contrast_tokens(q3)[1], t_neg1)


@pytest.mark.parametrize("layer_index", [0, 1, 5, 11])
def test_lambda_init_follows_depth_and_lambdas_start_near_it(layer_index):
    assert lambda_init_for_layer(layer_index) == pytest.approx(0.8 - 0.6 * math.exp(-0.3 * layer_index))
    m = make_vca(layer_index=layer_index)
    assert m.lambda_init == lambda_init_for_layer(layer_index)
    lam = m.lambdas()
    assert lam.dtype == torch.float32 and lam.shape == (2,)
    # exp(a.b) - exp(c.d) with N(0, 0.1) vectors of length 16 is within a few tenths of 0
    assert torch.all((lam - m.lambda_init).abs() < 0.5)


def test_prefix_tokens_get_no_local_term():
    with_conv = make_vca()
    without = make_vca(local_conv=False)
    without.load_state_dict(with_conv.state_dict(), strict=False)
    x = tokens()
    with torch.no_grad():
        a, b = with_conv(x), without(x)
    torch.testing.assert_close(a[:, :1], b[:, :1])
    assert not torch.allclose(a[:, 1:], b[:, 1:])


# -- clear errors for bad configuration ------------------------------------------------------


def test_contrast_grid_larger_than_the_patch_grid_is_refused():
    with pytest.raises(
        ValueError,
        match=r"7x7 contrast-token grid is larger than the 4x4 patch grid.*"
        r"contrast_tokens=16",
    ):
        VisualContrastAttention(DIM, HEADS, grid_size=4, contrast_tokens=49)
    # a resize that shrinks the grid below the contrast grid is refused the same way
    m = VisualContrastAttention(DIM, HEADS, grid_size=14, contrast_tokens=49)
    with pytest.raises(ValueError, match="larger than the 6x6 patch grid"):
        m.set_grid_size(6)


def test_emb_only_tokens_need_no_pooling_and_no_grid_bound():
    m = VisualContrastAttention(DIM, HEADS, grid_size=4, contrast_tokens=49, tokens_pos="emb", tokens_neg="emb")
    assert m(torch.randn(1, 17, DIM)).shape == (1, 17, DIM)


def test_lambda_vectors_are_one_dimensional_and_escape_weight_decay_while_embeddings_do_not():
    """The optimizers here (timm's, as DeiT's, PVT's, Swin's and the lab's code) exempt every 1-D parameter."""
    from timm.optim._param_groups import param_groups_weight_decay

    m = make_vca()
    groups = param_groups_weight_decay(m, weight_decay=0.05)
    names = {id(p): n for n, p in m.named_parameters()}
    decayed = {names[id(p)] for g in groups if g["weight_decay"] > 0 for p in g["params"]}
    exempt = {names[id(p)] for g in groups if g["weight_decay"] == 0 for p in g["params"]}
    assert decayed == {"qkv.weight", "embed_pos", "embed_neg", "local_conv.weight", "proj.weight"}
    assert exempt == {
        "qkv.bias",
        "local_conv.bias",
        "proj.bias",
        "stage1_norm.weight",
        "stage2_norm.weight",
        *(f"lambda{s}.{v}" for s in (1, 2) for v in ("q1", "k1", "q2", "k2")),
    }


def test_non_square_contrast_count_is_refused():
    with pytest.raises(ValueError, match="not a square number"):
        VisualContrastAttention(DIM, HEADS, grid_size=14, contrast_tokens=50)


def test_token_count_that_is_not_prefix_plus_grid_is_refused():
    m = make_vca()
    with pytest.raises(ValueError, match=r"got 50 tokens but expects 1 prefix \+ 8x6 grid = 49"):
        m(torch.randn(1, 50, DIM))


@pytest.mark.parametrize(
    "kw, pattern",
    [
        (dict(stage1="vac"), "unknown stage1 'vac'"),
        (dict(tokens_neg="pooled"), "unknown tokens_neg 'pooled'"),
        (dict(stage2_softmax="both"), "unknown stage2_softmax 'both'"),
    ],
)
def test_unknown_switch_values_are_refused(kw, pattern):
    with pytest.raises(ValueError, match=pattern):
        VisualContrastAttention(DIM, HEADS, grid_size=GRID, contrast_tokens=CONTRAST, **kw)


def test_diff_stage_needs_an_even_head_dim():
    with pytest.raises(ValueError, match="head_dim=15 is odd"):
        VisualContrastAttention(45, 3, grid_size=GRID, contrast_tokens=CONTRAST, stage1="diff")


def test_masks_are_refused():
    with pytest.raises(ValueError, match="does not support attention masks"):
        make_vca()(tokens(), attn_mask=torch.zeros(1))


@pytest.mark.parametrize("fused", [True, False])
def test_attention_dropout_is_declared_but_not_applied_unless_asked(fused):
    """The released classifier declares attn_drop and applies the maps directly (DACS_CNPM's port); True applies it."""
    x = torch.randn(2, 1 + GRID[0] * GRID[1], DIM)
    released = attention_path(make_vca(attn_drop=0.5).train(), fused)
    assert released.attn_drop.p == 0.5 and not released.apply_attn_drop
    with torch.no_grad():
        trained = released(x)
        evaluated = released.eval()(x)
    torch.testing.assert_close(trained, evaluated)
    applied = attention_path(make_vca(attn_drop=0.5, apply_attn_drop=True).train(), fused)
    with torch.no_grad():
        torch.manual_seed(3)
        dropped = applied(x)
        assert not torch.allclose(dropped, applied.eval()(x))


def test_contrast_embed_init_is_checked():
    with pytest.raises(ValueError, match="contrast_embed_init"):
        make_vca(contrast_embed_init="xavier")
