"""Hierarchical backbones (PVT v1, Swin, CSWin): baselines, the lab's layouts with VCA or any other attention of the
family, and their controls, as timm models.

Full-size models are built only to count parameters and check placement; forwards run at
small inputs with per-stage contrast grids no larger than each stage grid.
"""

from __future__ import annotations

import hashlib
import re

import pytest
import timm
import torch
from timm.models.swin_transformer import WindowAttention

from vcarepro.attention import POOLED_TOKEN_OPTION, VisualContrastAttention, attention_class
from vcarepro.models import LAB_MODELS, classifier_name, create_classifier, cswin, pvt, swin
from vcarepro.models.placement import LAB_MODEL_ATTENTIONS

ALL_NAMES = {**pvt.MODEL_NAMES, **swin.MODEL_NAMES, **cswin.MODEL_NAMES}
BASELINES = [names["mhsa"] for names in ALL_NAMES.values()]  # the originals and the controls
VCA_MODELS = [names["vca"] for names in ALL_NAMES.values() if "vca" in names]

# Small configurations: 64x64 input -> stage grids 16/8/4/2; 3x3 tokens on 16x16 pool overlapping windows.
SMALL_CONTRAST = (9, 16, 4, 1)
SMALL_DEPTHS = {
    "pvt_tiny": dict(depths=(1, 1, 1, 1)),
    "pvt_tiny_gap": dict(depths=(1, 1, 1, 1)),
    "vca_pvt_tiny": dict(depths=(1, 1, 1, 1)),
    "swin_tiny_patch4_window7_224": dict(depths=(1, 1, 2, 1), window_size=2),
    "vca_swin_tiny_patch4_window7_224": dict(depths=(1, 1, 2, 1), window_size=2),
    "cswin_tiny_224": dict(depths=(1, 1, 1, 1)),
    "cswin_tiny_2418_224": dict(depths=(1, 1, 1, 1)),
    "vca_cswin_tiny_224": dict(depths=(1, 1, 1, 1)),
}


def small(name: str, **kwargs) -> torch.nn.Module:
    extra = dict(contrast_tokens=SMALL_CONTRAST) if name in VCA_MODELS else {}
    return timm.create_model(name, img_size=64, num_classes=5, **SMALL_DEPTHS[name], **{**extra, **kwargs})


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def vca_layers(model: torch.nn.Module):
    return [m for m in model.modules() if isinstance(m, VisualContrastAttention)]


def test_model_names_map_pipeline_archs_to_registered_timm_models():
    assert set(ALL_NAMES) == {"pvt_tiny", "pvt_tiny_gap", "swin_tiny", "cswin_tiny", "cswin_tiny_2418"}
    for names in ALL_NAMES.values():
        assert all(timm.is_model(name) for name in names.values())
        assert names.get("vca", "vca_").startswith("vca_")
    assert set(VCA_MODELS) == {"vca_pvt_tiny", "vca_swin_tiny_patch4_window7_224", "vca_cswin_tiny_224"}
    assert set(LAB_MODEL_ATTENTIONS) == {"agent", "flatten", "inline", "circulant", "mhsa+dwc"}
    for arch, lab_model in zip(("pvt_tiny", "swin_tiny", "cswin_tiny"), LAB_MODELS):
        assert {classifier_name(arch, a) for a in LAB_MODEL_ATTENTIONS} == {lab_model}


@pytest.mark.parametrize(
    "name, expected, rel",
    [
        ("pvt_tiny", 13.2e6, 0.005),  # PVT v1 paper: 13.2M
        ("swin_tiny_patch4_window7_224", 28.3e6, 0.005),  # Swin paper: 28M (timm: 28.29M)
        # CSWin paper: 23M; the official code's modules (reproduced here one for one) hold 22.32M.
        ("cswin_tiny_224", 22.32e6, 0.005),
        # the lab's backbones with their own attention: 2-4-18-1 CSWin holds 20.39M (microsoft/CSWin-Transformer
        # models/cswin.py at depths 2-4-18-1; docs/evidence.md)
        ("cswin_tiny_2418_224", 20.39e6, 0.001),
        # PVT-T's 13,229,288 less the class token, its position-embedding row and the final norm (weight, bias)
        ("pvt_tiny_gap", 13_229_288 - 4 * 512, 1e-9),
    ],
)
def test_baseline_parameter_counts_match_the_published_models(name, expected, rel):
    assert n_params(timm.create_model(name)) == pytest.approx(expected, rel=rel)


def test_vca_pvt_tiny_is_the_labs_layout():
    """agent_pvt.py + cfgs/agent_pvt_t.yaml: AAAA, no spatial reduction, 9-16-49-49 adaptive tokens, no class token,
    no final norm, mean-pooled head."""
    model = timm.create_model("vca_pvt_tiny")
    attns = vca_layers(model)
    assert [a.layer_index for a in attns] == list(range(8))
    assert [a.grid_size for a in attns] == [(56, 56)] * 2 + [(28, 28)] * 2 + [(14, 14)] * 2 + [(7, 7)] * 2
    assert [a.contrast_grid for a in attns] == [(3, 3)] * 2 + [(4, 4)] * 2 + [(7, 7)] * 4
    assert all(a.num_prefix_tokens == 0 for a in attns)
    assert not any(".sr." in n for n, _ in model.named_parameters())
    assert all(s.cls_token is None for s in model.stages) and isinstance(model.norm, torch.nn.Identity)
    assert model.global_pool == "avg"
    control = timm.create_model("pvt_tiny_gap")  # the same backbone and head with PVT's own attention
    assert [s.blocks[0].attn.sr_ratio for s in control.stages] == [8, 4, 2, 1]
    assert all(s.cls_token is None for s in control.stages) and isinstance(control.norm, torch.nn.Identity)
    x = torch.randn(1, 3, 64, 64)
    small_model = small("vca_pvt_tiny").eval()
    features = small_model.forward_features(x)  # the last stage's (B, H, W, C) map: timm's Swin convention
    torch.testing.assert_close(small_model.forward_head(features), small_model.head(features.flatten(1, 2).mean(dim=1)))


def test_vca_swin_tiny_is_the_labs_layout():
    """agent_swin.py + cfgs/agent_swin_t.yaml: window 56 (global) VCA in stages 1-3 with 9-16-49 tokens, Swin's own
    7x7 window attention in stage 4 (AAAB)."""
    model = timm.create_model("vca_swin_tiny_patch4_window7_224")
    stages = [[b.attn for b in stage.blocks] for stage in model.layers]
    for attns, grid, tokens in zip(stages[:3], (56, 28, 14), ((3, 3), (4, 4), (7, 7))):
        assert all(
            isinstance(a, VisualContrastAttention) and a.grid_size == (grid, grid) and a.contrast_grid == tokens
            for a in attns
        )
    assert all(isinstance(a, WindowAttention) and tuple(a.window_size) == (7, 7) for a in stages[3])
    assert [a.layer_index for a in vca_layers(model)] == list(range(10))
    assert any("layers.3.blocks.0.attn.relative_position_bias_table" == n for n, _ in model.named_parameters())


def test_vca_cswin_tiny_is_the_labs_layout():
    """agent_cswin.py + cfgs/agent_cswin_t.yaml: depths 2-4-18-1, VCA in stages 1-2 (9 and 16 tokens), CSWin's
    cross-shaped attention with LePE in stages 3-4 (AABB)."""
    model = timm.create_model("vca_cswin_tiny_224")
    assert [len(s.blocks) for s in model.stages] == [2, 4, 18, 1]
    attns = [[b.attn for b in s.blocks] for s in model.stages]
    assert [a.contrast_grid for a in attns[0] + attns[1]] == [(3, 3)] * 2 + [(4, 4)] * 4
    assert [a.grid_size for a in attns[0] + attns[1]] == [(56, 56)] * 2 + [(28, 28)] * 4
    assert all(isinstance(a, cswin.CrossShapedWindowAttention) for a in attns[2] + attns[3])
    assert [a.layer_index for a in vca_layers(model)] == list(range(6))
    control = timm.create_model("cswin_tiny_2418_224")
    assert [len(s.blocks) for s in control.stages] == [2, 4, 18, 1] and not vca_layers(control)


@pytest.mark.parametrize(
    "name, layout, stages_with_vca",
    [
        ("vca_pvt_tiny", "AAAA", [0, 1, 2, 3]),
        ("vca_pvt_tiny", "BBAA", [2, 3]),
        ("vca_swin_tiny_patch4_window7_224", "AAAA", [0, 1, 2, 3]),
        ("vca_swin_tiny_patch4_window7_224", "ABBB", [0]),
        ("vca_cswin_tiny_224", "AAAA", [0, 1, 2, 3]),
        ("vca_cswin_tiny_224", "BBBA", [3]),
    ],
)
def test_placement_is_a_parameter(name, layout, stages_with_vca):
    model = small(name, attn_layout=layout)
    stages = model.layers if name.startswith("vca_swin") else model.stages
    assert [i for i, s in enumerate(stages) if vca_layers(s)] == stages_with_vca
    assert model(torch.randn(1, 3, 64, 64)).shape == (1, 5)


def test_global_everywhere_is_one_line_of_parameters():
    model = timm.create_model("vca_swin_tiny_patch4_window7_224", attn_layout="AAAA", contrast_tokens=49)
    assert {a.contrast_grid for a in vca_layers(model)} == {(7, 7)} and len(vca_layers(model)) == 12


@pytest.mark.parametrize("name", VCA_MODELS)
def test_a_bad_layout_is_one_clear_error(name):
    with pytest.raises(ValueError, match="attn_layout='AAA' must be 4 letters, one per stage"):
        timm.create_model(name, attn_layout="AAA")
    with pytest.raises(ValueError, match="attn_layout='AAAC'"):
        timm.create_model(name, attn_layout="AAAC")


@pytest.mark.parametrize("name", BASELINES + VCA_MODELS)
def test_forward_gives_logits_and_every_parameter_gets_a_gradient(name):
    torch.manual_seed(0)
    model = small(name)
    features = model.forward_features(torch.randn(2, 3, 64, 64))
    out = model.forward_head(features)
    assert out.shape == (2, 5)
    # the features term reaches what the logits cannot: with class-token pooling (PVT) the last
    # block's VCA local conv only changes patch tokens, which the head never reads
    (out.square().sum() + features.mean()).backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing


@pytest.mark.parametrize("name", BASELINES + VCA_MODELS)
def test_state_dict_round_trip(name):
    torch.manual_seed(0)
    source, target = small(name).eval(), small(name).eval()
    target.load_state_dict(source.state_dict())
    x = torch.randn(1, 3, 64, 64)
    torch.testing.assert_close(target(x), source(x))


@pytest.mark.parametrize("name", VCA_MODELS)
def test_contrast_grid_larger_than_a_stage_grid_is_a_clear_error(name):
    # the lab's 9-16-49-49 tokens on a 64x64 input: stage grids 16/8/4/2, and a 7x7 grid does not fit 4x4
    layout = "AAAA"
    with pytest.raises(ValueError, match="contrast-token grid is larger than the"):
        timm.create_model(name, img_size=64, attn_layout=layout, **SMALL_DEPTHS[name])


@pytest.mark.parametrize("arch", ALL_NAMES)
def test_baselines_reject_vca_options(arch):
    for option in (dict(contrast_tokens=49), dict(attn_layout="AAAA"), dict(agent_tokens=49)):
        with pytest.raises(ValueError, match="not apply to attention"):
            create_classifier(arch, "mhsa", **option)
        if arch != "swin_tiny":  # our own registrations refuse them too (timm's Swin is timm's)
            with pytest.raises(ValueError, match="appl(y|ies) to a VCA variant or another compared attention"):
                timm.create_model(ALL_NAMES[arch]["mhsa"], **option)


def test_pvt_class_token_is_the_only_prefix_and_lives_in_the_last_stage():
    model = timm.create_model("vca_pvt_tiny", class_token=True, global_pool="token", head_norm=True)
    prefixes = [[b.attn.num_prefix_tokens for b in s.blocks] for s in model.stages]
    assert prefixes == [[0, 0], [0, 0], [0, 0], [1, 1]]
    assert [s.cls_token is not None for s in model.stages] == [False, False, False, True]
    baseline = timm.create_model("pvt_tiny")
    assert [s.blocks[0].attn.sr_ratio for s in baseline.stages] == [8, 4, 2, 1]
    assert baseline.global_pool == "token" and isinstance(baseline.norm, torch.nn.LayerNorm)
    with pytest.raises(ValueError, match="global_pool='token' reads the class token"):
        timm.create_model("pvt_tiny_gap", global_pool="token")


def test_pvt_decays_its_position_embeddings_and_not_its_class_token():
    """whai362/PVT classification/pvt.py: no_weight_decay() is {'cls_token'}; the position embeddings are decayed."""
    model = timm.create_model("pvt_tiny")
    assert model.no_weight_decay() == {"stages.3.cls_token"}
    assert timm.create_model("vca_pvt_tiny").no_weight_decay() == set()


def test_swin_vca_is_global_per_stage_and_follows_a_resize():
    model = small("vca_swin_tiny_patch4_window7_224", attn_layout="AAAA")
    for stage in model.layers:
        for block in stage.blocks:
            assert block.attn.grid_size == tuple(stage.output_resolution)
            assert block.attn_mask is None and not any(block.shift_size)
    model.set_input_size(img_size=128)
    assert [s.blocks[0].attn.grid_size for s in model.layers] == [(32, 32), (16, 16), (8, 8), (4, 4)]
    assert model(torch.randn(1, 3, 128, 128)).shape == (1, 5)


def test_swin_own_stages_keep_their_windows_through_a_resize():
    model = small("vca_swin_tiny_patch4_window7_224")  # AAAB, window 2 in stage 4's 2x2 grid
    model.set_input_size(img_size=128)
    last = model.layers[3].blocks[0]
    assert isinstance(last.attn, WindowAttention) and tuple(last.window_size) == (4, 4)  # timm's rule: scaled
    assert [s.blocks[0].attn.grid_size for s in model.layers[:3]] == [(32, 32), (16, 16), (8, 8)]
    assert model(torch.randn(1, 3, 128, 128)).shape == (1, 5)


def test_cswin_stripes_keep_attention_inside_a_column_or_a_row():
    torch.manual_seed(0)
    grid = (6, 6)
    attn = cswin.CrossShapedWindowAttention(8, 2, grid_size=grid, stripe_width=1).eval()
    x = torch.randn(1, 36, 8)
    changed = x.clone()
    changed[0, 2 * 6 + 3] += 1.0  # token at row 2, column 3
    moved = (attn(changed) - attn(x)).abs().sum(-1).view(*grid) > 1e-6
    # the vertical half mixes column 3 (LePE reaches the neighbours only within the stripe), the horizontal row 2
    expected = torch.zeros(grid, dtype=torch.bool)
    expected[:, 3] = True
    expected[2, :] = True
    assert torch.equal(moved, expected)


def test_cswin_full_branch_is_multi_head_attention_plus_lepe():
    torch.manual_seed(0)
    attn = cswin.CrossShapedWindowAttention(8, 2, grid_size=(4, 4), stripe_width=4).eval()
    assert len(attn.branches) == 1
    x = torch.randn(2, 16, 8)
    q, k, v = attn.qkv(x).chunk(3, dim=-1)
    heads = lambda t: t.view(2, 16, 2, 4).transpose(1, 2)  # noqa: E731
    ref = torch.softmax(heads(q) @ heads(k).transpose(-1, -2) * 0.5, dim=-1) @ heads(v)
    lepe = attn.branches[0].get_v(v.transpose(1, 2).reshape(2, 8, 4, 4)).flatten(2).transpose(1, 2)
    ref = ref.transpose(1, 2).reshape(2, 16, 8) + lepe
    torch.testing.assert_close(attn(x), attn.proj(ref))


# -- the lab's layouts with any attention of the family (issue 15) -------------------------------------------------

# arch -> (its stages, the backbone's own attention, the lab's layout)
LAB_BACKBONES = {
    "pvt_tiny": (lambda m: m.stages, pvt.SpatialReductionAttention, pvt.LAB_PVT_TINY_LAYOUT),
    "swin_tiny": (lambda m: m.layers, WindowAttention, swin.LAB_SWIN_TINY_LAYOUT),
    "cswin_tiny": (lambda m: m.stages, cswin.CrossShapedWindowAttention, cswin.LAB_CSWIN_TINY_LAYOUT),
}
# 64x64 inputs, stage grids 16/8/4/2; PVT's lab layout has no B stage, so the small one keeps PVT's in the last
SMALL_LAB = {
    "pvt_tiny": dict(depths=(1, 1, 1, 1), attn_layout="AAAB"),
    "swin_tiny": dict(depths=(1, 1, 2, 1), window_size=2),
    "cswin_tiny": dict(depths=(1, 1, 1, 1)),
}
# pooled tokens per stage at 64 px: at least 2x2 in the last stage (one agent makes the broadcast softmax constant)
SMALL_POOLED = (9, 16, 4, 4)


def small_lab(arch: str, attention: str, **kwargs) -> torch.nn.Module:
    pooled = {POOLED_TOKEN_OPTION[attention]: SMALL_POOLED} if attention in POOLED_TOKEN_OPTION else {}
    return create_classifier(arch, attention, img_size=64, num_classes=5, **SMALL_LAB[arch], **{**pooled, **kwargs})


def stage_layers(arch: str, model: torch.nn.Module):
    stages, _, _ = LAB_BACKBONES[arch]
    return [[block.attn for block in stage.blocks] for stage in stages(model)]


@pytest.mark.parametrize("attention", LAB_MODEL_ATTENTIONS)
@pytest.mark.parametrize("arch", LAB_BACKBONES)
def test_a_stages_hold_the_named_attention_and_b_stages_the_backbones_own(arch, attention):
    torch.manual_seed(0)
    model = small_lab(arch, attention)
    _, own, _ = LAB_BACKBONES[arch]
    layout = SMALL_LAB[arch].get("attn_layout", LAB_BACKBONES[arch][2])
    for letter, layers in zip(layout, stage_layers(arch, model)):
        assert all(isinstance(a, attention_class(attention) if letter == "A" else own) for a in layers), letter
    if attention == "agent":  # the per-stage count reaches each A stage
        compared = [layers[0] for letter, layers in zip(layout, stage_layers(arch, model)) if letter == "A"]
        assert [a.agent_grid for a in compared] == [(3, 3), (4, 4), (2, 2), (2, 2)][: len(compared)]
    features = model.forward_features(torch.randn(2, 3, 64, 64))
    out = model.forward_head(features)
    assert out.shape == (2, 5) and torch.isfinite(out).all()
    (out.square().sum() + features.mean()).backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize("arch", LAB_BACKBONES)
def test_agent_in_the_lab_layouts_is_the_labs_agent_model(arch):
    """agent_{pvt,swin,cswin}.py + cfgs: 9-16-49-49 agent tokens in the A stages; Agent-Swin-T holds 28.90M and
    Agent-CSwin-T 20.46M (LeapLabTHU/Agent-Attention agent_transformer/models/agent_cswin.py,
    cfgs/agent_cswin_t.yaml), Agent-PVT-T 11.6M (Agent Attention, Table 2)."""
    model = create_classifier(arch, "agent")
    _, _, layout = LAB_BACKBONES[arch]
    for letter, grid, layers in zip(layout, [(3, 3), (4, 4), (7, 7), (7, 7)], stage_layers(arch, model)):
        assert (
            all(a.agent_grid == grid for a in layers)
            if letter == "A"
            else not any(isinstance(a, attention_class("agent")) for a in layers)
        )
    expected, rel = {"pvt_tiny": (11.6e6, 0.005), "swin_tiny": (28.90e6, 0.0005), "cswin_tiny": (20.46e6, 0.0005)}[arch]
    assert n_params(model) == pytest.approx(expected, rel=rel)


@pytest.mark.parametrize("arch", LAB_BACKBONES)
def test_contrast_tokens_for_an_attention_without_them_is_a_clear_error(arch):
    lab_model = classifier_name(arch, "agent")
    for attention in LAB_MODEL_ATTENTIONS:
        instead = "its per-stage count is agent_tokens" if attention == "agent" else "it has no pooled tokens"
        with pytest.raises(
            ValueError, match=re.escape(f"contrast_tokens does not apply to attention {attention!r}: {instead}")
        ):
            timm.create_model(lab_model, compared_attention=attention, contrast_tokens=49)
        with pytest.raises(ValueError, match=re.escape(f"contrast_tokens does not apply to attention {attention!r}")):
            create_classifier(arch, attention, contrast_tokens=49)
    with pytest.raises(ValueError, match="agent_tokens needs one value per stage"):
        timm.create_model(lab_model, compared_attention="agent", agent_tokens=(9, 16, 49))
    with pytest.raises((ValueError, TypeError), match="focusing_factr"):  # Swin: timm's own TypeError
        timm.create_model(lab_model, compared_attention="flatten", focusing_factr=3)
    with pytest.raises(ValueError, match="for compared_attention='agent' use the lab_"):
        timm.create_model(ALL_NAMES[arch]["vca"], compared_attention="agent")


def test_an_attentions_own_options_reach_every_a_stage():
    model = small_lab("cswin_tiny", "flatten", focusing_factor=2.0, dwc_kernel=3)
    compared = [a for layers in stage_layers("cswin_tiny", model)[:2] for a in layers]
    assert all(a.focusing_factor == 2.0 and a.dwc.kernel_size == (3, 3) for a in compared)


def fingerprint(model: torch.nn.Module):
    """(hash of the parameter names and shapes, position-weighted sum of every value, the same sum of magnitudes).

    Equal state dicts give equal sums. Initialisers that go through vectorised float32 math (trunc_normal_'s
    erfinv) may round their last bit differently on another CPU: AMD against Intel moved the totals by at most
    2e-12 of the magnitude (independent roundings of about 2**-24 cancel), while one extra random draw before
    construction moves them by about 5e-4 of it."""
    layout, total, magnitude = hashlib.sha256(), 0.0, 0.0
    for k, (name, t) in enumerate(model.state_dict().items()):
        layout.update(f"{name}:{tuple(t.shape)}:{t.dtype};".encode())
        flat = t.detach().double().flatten()
        weighted = (k + 1) * flat * torch.cos(torch.arange(flat.numel(), dtype=torch.float64))
        total += float(weighted.sum())
        magnitude += float(weighted.abs().sum())
    return layout.hexdigest()[:16], total, magnitude


# Taken with the seeded models below before the A stages took any attention (issue 15); at that commit the
# state dicts were also byte-identical (sha256) to today's, as were the logits and the generator's state after
# construction (the next two draws of torch.randn, below).
VCA_FINGERPRINTS = {
    "vca_pvt_tiny": ("886f69ad66a4db27", 3984.815326106875, (-0.9343059062957764, 0.32944491505622864)),
    "small vca_pvt_tiny": ("5465f09eed4ebccb", 2131.339728805844, (0.21119685471057892, 0.6265062093734741)),
    "small vca_swin_tiny_patch4_window7_224": (
        "31d71cbdee934e66",
        3741.9092266695952,
        (-0.7129661440849304, 0.0404818169772625),
    ),
    "small vca_cswin_tiny_224": ("45bc5a07bea66cf7", 1661.584689074993, (1.3120273351669312, -1.7292418479919434)),
}


@pytest.mark.parametrize("key", VCA_FINGERPRINTS)
def test_vca_models_are_unchanged_by_the_selectable_attention(key):
    """Same parameters, same init order and random draws: a seeded VCA model is the one trained before.

    The fingerprints predate the contrast_embed_init option (issue 22), so they hold under the init they were
    taken with, trunc_normal."""
    torch.manual_seed(0)
    name = key.split()[-1]
    init = dict(contrast_embed_init="trunc_normal")
    model = small(name, **init) if key.startswith("small") else timm.create_model(name, **init)
    after = tuple(torch.randn(2).tolist())
    layout, total, draws = VCA_FINGERPRINTS[key]
    got_layout, got_total, magnitude = fingerprint(model)
    assert got_layout == layout
    assert abs(got_total - total) <= 1e-9 * magnitude
    assert after == pytest.approx(draws, rel=1e-6)


@pytest.mark.parametrize("vca_model, lab_model", zip(VCA_MODELS, LAB_MODELS))
def test_the_generic_lab_model_with_vca_is_the_vca_model(vca_model, lab_model):
    small_args = dict(img_size=64, num_classes=5, contrast_tokens=SMALL_CONTRAST, **SMALL_DEPTHS[vca_model])
    torch.manual_seed(0)
    expected = timm.create_model(vca_model, **small_args).state_dict()
    torch.manual_seed(0)
    got = timm.create_model(lab_model, compared_attention="vca", **small_args).state_dict()
    assert list(got) == list(expected) and all(torch.equal(got[k], expected[k]) for k in got)
