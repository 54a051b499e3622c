"""The DiT backbone: the original's architecture and init, with a selectable attention layer."""

from __future__ import annotations

import pytest
import torch
from timm.layers import Attention, DiffAttention

from vcarepro.attention import VisualContrastAttention, lambda_init_for_layer
from vcarepro.models.dit import DIT_CONFIGS, DiT, LabelEmbedder, create_dit, get_2d_sincos_pos_embed

# A tiny DiT: 8x8x4 latents, 2x2 patches -> a 4x4 token grid; VCA pools it to 2x2 contrast tokens.
TINY = dict(input_size=8, in_channels=4, hidden_size=32, depth=2, num_heads=2, num_classes=5)
TINY_VCA = dict(TINY, contrast_tokens=4)
ATTENTIONS = {"mhsa": TINY, "vca": TINY_VCA, "diff": TINY}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def tiny(attention: str = "mhsa", seed: int = 0, **overrides) -> DiT:
    torch.manual_seed(seed)
    return create_dit("dit_s2", attention, **{**ATTENTIONS[attention], **overrides})


def perturbed(model: DiT, seed: int = 1) -> DiT:
    """adaLN-Zero starts every block at the identity and the output at zero; shake it out of that."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return model


def batch(B: int = 3, seed: int = 2):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(B, 4, 8, 8, generator=gen)
    t = torch.randint(0, 1000, (B,), generator=gen)
    y = torch.randint(0, 5, (B,), generator=gen)
    return x, t, y


def count(model: torch.nn.Module, trainable_only: bool = False) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


# -- the original's size ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "arch, trainable_millions, all_params",
    [
        ("dit_s2", 32.87, 32_963_360),
        ("dit_b2", 130.3, 130_512_416),
        ("dit_xl2", 674.8, 675_129_632),
    ],
)
def test_parameter_counts_match_the_original_at_latent_32x32x4_and_1000_classes(arch, trainable_millions, all_params):
    with torch.device("meta"):  # shapes only: no memory, no init cost
        model = create_dit(arch)
    # DiT's train.py prints sum(p.numel() for p in model.parameters()), which includes
    # the frozen sin-cos pos_embed; the commonly quoted 32.87M / 130.3M exclude it.
    assert count(model) == all_params
    assert count(model, trainable_only=True) == pytest.approx(trainable_millions * 1e6, rel=1e-3)
    assert count(model) - count(model, trainable_only=True) == model.pos_embed.numel()


def test_config_table_has_the_twelve_original_models():
    assert set(DIT_CONFIGS) == {f"dit_{size}{p}" for size in ("s", "b", "l", "xl") for p in (2, 4, 8)}
    assert DIT_CONFIGS["dit_xl2"] == dict(depth=28, hidden_size=1152, num_heads=16, patch_size=2)
    assert DIT_CONFIGS["dit_b4"] == dict(depth=12, hidden_size=768, num_heads=12, patch_size=4)


# -- shapes and init ----------------------------------------------------------------------------


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_output_is_eps_and_variance_per_input_channel(attention):
    x, t, y = batch()
    assert tiny(attention)(x, t, y).shape == (3, 8, 8, 8)
    assert tiny(attention, learn_sigma=False)(x, t, y).shape == (3, 4, 8, 8)


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_adaln_zero_makes_a_fresh_model_output_exactly_zero(attention):
    model = tiny(attention)
    x, t, y = batch()
    assert torch.equal(model(x, t, y), torch.zeros(3, 8, 8, 8))
    for block in model.blocks:
        assert not block.adaLN_modulation[-1].weight.any() and not block.adaLN_modulation[-1].bias.any()


def test_init_follows_the_original():
    model = tiny("mhsa")
    assert model.y_embedder.embedding_table.weight.std().item() == pytest.approx(0.02, rel=0.2)
    assert model.t_embedder.mlp[0].weight.std().item() == pytest.approx(0.02, rel=0.1)
    qkv = model.blocks[0].attn.qkv
    bound = (6 / (qkv.in_features + qkv.out_features)) ** 0.5  # xavier-uniform
    assert qkv.weight.abs().max() <= bound and qkv.weight.abs().max() > 0.9 * bound
    assert not qkv.bias.any()
    proj = model.x_embedder.proj.weight  # initialised as a Linear on flattened patches
    fan_in, fan_out = proj[0].numel(), proj.shape[0]
    assert proj.abs().max() <= (6 / (fan_in + fan_out)) ** 0.5
    for norm in (model.blocks[0].norm1, model.blocks[0].norm2, model.final_layer.norm_final):
        assert norm.eps == 1e-6 and not norm.elementwise_affine


def test_positions_are_a_frozen_2d_sincos_table_with_columns_in_the_first_half():
    model = tiny("mhsa")
    assert not model.pos_embed.requires_grad
    table = model.pos_embed[0]
    assert torch.equal(table, get_2d_sincos_pos_embed(32, 4))
    D = 32
    # token 1 is (row 0, col 1): only the column half changes; token 4 is (row 1, col 0)
    assert torch.equal(table[1, D // 2 :], table[0, D // 2 :]) and not torch.equal(
        table[1, : D // 2], table[0, : D // 2]
    )
    assert torch.equal(table[4, : D // 2], table[0, : D // 2]) and not torch.equal(
        table[4, D // 2 :], table[0, D // 2 :]
    )
    # each half is [sin(pos * omega) | cos(pos * omega)] with omega_0 = 1
    assert table[1, 0].item() == pytest.approx(torch.sin(torch.tensor(1.0)).item())
    assert table[1, D // 4].item() == pytest.approx(torch.cos(torch.tensor(1.0)).item())


# -- attention selection ------------------------------------------------------------------------


def test_each_block_gets_the_selected_attention_with_its_depth():
    mhsa, vca, diff = tiny("mhsa"), tiny("vca"), tiny("diff")
    assert all(type(b.attn) is Attention and b.attn.qkv.bias is not None for b in mhsa.blocks)
    for i, block in enumerate(vca.blocks):
        attn = block.attn
        assert isinstance(attn, VisualContrastAttention)
        assert attn.layer_index == i and attn.lambda_init == lambda_init_for_layer(i)
        assert attn.grid_size == (4, 4) and attn.contrast_grid == (2, 2) and attn.num_prefix_tokens == 0
        assert attn.qkv.bias is not None
    for i, block in enumerate(diff.blocks):
        assert isinstance(block.attn, DiffAttention) and block.attn.qkv.bias is not None
        assert block.attn.lambda_init == pytest.approx(lambda_init_for_layer(i))


def test_attention_options_reach_the_layer_flat_or_as_a_dict():
    flat = tiny("vca", stage2="diff", local_conv=False)
    nested = create_dit(
        "dit_s2", "vca", **TINY, attention_options=dict(contrast_tokens=4, stage2="diff", local_conv=False)
    )
    for model in (flat, nested):
        attn = model.blocks[1].attn
        assert attn.stage2 == "diff" and attn.local_conv is None


def test_vca_needs_a_contrast_grid_no_larger_than_the_patch_grid():
    # 16x16 latents, patch 2 -> 8x8 patch grid: 4x4 and 3x3 contrast grids pool it (3x3 in overlapping
    # adaptive windows), 9x9 would repeat queries
    for tokens, side in ((16, 4), (9, 3)):
        model = create_dit("dit_s2", "vca", **dict(TINY, input_size=16), contrast_tokens=tokens)
        assert model.blocks[0].attn.contrast_grid == (side, side)
    with pytest.raises(ValueError, match="9x9 contrast-token grid is larger than the 8x8 patch grid"):
        create_dit("dit_s2", "vca", **dict(TINY, input_size=16), contrast_tokens=81)


@pytest.mark.parametrize("attention", ["mhsa", "vca", "diff"])
def test_gradients_reach_every_trainable_parameter(attention):
    model = perturbed(tiny(attention)).train()
    x, t, y = batch(B=4)
    model(x, t, y).square().mean().backward()
    missing = [n for n, p in model.named_parameters() if p.requires_grad and (p.grad is None or not p.grad.any())]
    assert not missing
    assert model.pos_embed.grad is None


# -- conditioning ---------------------------------------------------------------------------------


def test_label_dropout_uses_the_null_class_in_training_only():
    embed = LabelEmbedder(num_classes=5, hidden_size=8, dropout_prob=0.5)
    assert embed.embedding_table.num_embeddings == 6  # the null class is row 5
    labels = torch.arange(5).repeat(40)
    torch.manual_seed(0)
    dropped = embed.token_drop(labels)
    kept = dropped == labels
    assert ((dropped == 5) | kept).all() and 0.3 < (~kept).float().mean() < 0.7
    null = embed.embedding_table.weight[5]
    assert torch.equal(embed(labels, train=False), embed.embedding_table(labels))
    assert (embed(labels, train=True) == null).all(-1).any()
    no_cfg = LabelEmbedder(5, 8, dropout_prob=0.0)  # as in the original: no null row, nothing dropped
    assert no_cfg.embedding_table.num_embeddings == 5
    assert torch.equal(no_cfg(labels, train=True), no_cfg(labels, train=False))


def test_training_mode_drops_labels_and_eval_mode_does_not():
    model = perturbed(tiny("mhsa", class_dropout_prob=1.0))
    x, t, y = batch()
    with torch.no_grad():
        model.train()
        dropped = model(x, t, y)
        model.eval()
        conditional, unconditional = model(x, t, y), model(x, t, torch.full_like(y, 5))
    assert torch.allclose(dropped, unconditional) and not torch.allclose(conditional, unconditional)


def test_forward_with_cfg_guides_the_first_three_channels_as_the_originals_and_scale_one_is_conditional():
    """DiT's and SiT's forward_with_cfg: `eps, rest = model_out[:, :3], model_out[:, 3:]` ("exact reproducibility")."""
    model = perturbed(tiny("vca")).eval()
    x, t, y = batch(B=2)
    null = torch.full_like(y, 5)
    x2, t2, y2 = torch.cat([x, x]), torch.cat([t, t]), torch.cat([y, null])
    with torch.no_grad():
        cond, uncond = model(x, t, y), model(x, t, null)
        same = model.forward_with_cfg(x2, t2, y2, cfg_scale=1.0)
        guided = model.forward_with_cfg(x2, t2, y2, cfg_scale=4.0)
    assert torch.allclose(same[:2], cond, atol=1e-6) and torch.allclose(same[2:, :3], cond[:, :3], atol=1e-6)
    expected_eps = uncond[:, :3] + 4.0 * (cond[:, :3] - uncond[:, :3])
    assert torch.allclose(guided[:2, :3], expected_eps, atol=1e-5)  # channels 0-2 guided
    assert torch.allclose(guided[:2, 3:], cond[:, 3:], atol=1e-6)  # the 4th latent channel and the variance not
    assert not torch.allclose(guided[:2, 3], (uncond + 4.0 * (cond - uncond))[:, 3], atol=1e-5)


def test_every_tensor_dit_initialises_to_zero_is_zero_and_no_other():
    """facebookresearch/DiT models.py initialize_weights: every Linear bias, the patch embedding's bias,
    each block's and the final layer's adaLN modulation, and the final linear layer."""
    torch.manual_seed(0)
    model = tiny("mhsa")
    zero = {name for name, p in model.named_parameters() if not p.detach().any()}
    linear_biases = {
        f"{name}.bias" for name, m in model.named_modules() if isinstance(m, torch.nn.Linear) and m.bias is not None
    }
    expected = linear_biases | {
        "x_embedder.proj.bias",
        "final_layer.linear.weight",
        "final_layer.adaLN_modulation.1.weight",
    }
    expected |= {f"blocks.{i}.adaLN_modulation.1.weight" for i in range(len(model.blocks))}
    assert "x_embedder.proj.bias" in zero
    assert zero == expected


# -- errors ---------------------------------------------------------------------------------------


def test_unknown_names_and_misplaced_options_fail_clearly():
    with pytest.raises(ValueError, match="unknown DiT arch 'dit_m2'; choose one of 'dit_xl2'"):
        create_dit("dit_m2")
    with pytest.raises(ValueError, match="unknown attention 'linear'; choose one of 'mhsa', 'diff', 'vca', 'agent'"):
        create_dit("dit_s2", "linear")
    with pytest.raises(ValueError, match="unknown attention"):
        DiT(**TINY, attention="linear")
    with pytest.raises(ValueError, match="contrast_tokens does not apply to attention 'mhsa'"):
        create_dit("dit_s2", "mhsa", **TINY, contrast_tokens=4)
    with pytest.raises(ValueError, match="do not apply to attention 'diff'"):
        create_dit("dit_s2", "diff", **TINY, attention_options=dict(stage1="diff"))
    with pytest.raises(ValueError, match="unknown vca option"):
        create_dit("dit_s2", "vca", **TINY_VCA, attention_options=dict(grid_size=4))
    with pytest.raises(ValueError, match="unknown DiT argument"):
        create_dit("dit_s2", **TINY, dropout=0.1)
