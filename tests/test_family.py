"""The attention family and VCA's depthwise-term controls (issue 15).

Published models against their published parameters / GMACs, what each published model changes
beyond the attention, the mhsa+dwc control against timm's Attention and a hand-built convolution,
every attention trained one step in DeiT and DiT (fp32 and bf16), the errors, and the pipeline's
``family=all`` switch.
"""

from __future__ import annotations

import pytest
import timm
import torch
import torch.nn as nn
import torch.nn.functional as F
import yaml
from timm.layers import Attention
from timm.models.vision_transformer import Block

from helpers import ROOT, attention_path
from vcarepro.attention import ATTENTIONS, build_attention
from vcarepro.attention.controls import MhsaLocalConv
from vcarepro.core.errors import BadInput
from vcarepro.metrics.complexity import count_parameters, model_flops
from vcarepro.models import classifier_name, create_classifier
from vcarepro.models import family as family_models
from vcarepro.models.dit import create_dit
from vcarepro.models.family import ConvPositionBlock

FAMILY_REF = yaml.safe_load((ROOT / "data" / "paper_reference.yaml").read_text())["family"]
# |ours - published| within one unit of the published precision (report.complexity_tolerance)
TOLERANCE = 0.1

PUBLISHED = [(r["published_model"], 224, r) for r in FAMILY_REF["rows"] if r["published_model"]] + [
    (r["published_model"], r["img_size"], r) for r in FAMILY_REF["small"]
]

# The runs family=all adds, by suffix (conf/family/all.yaml), and the attention (and options) each one is.
FAMILY_RUNS = {
    "agent": ("agent", {}),
    "flatten": ("flatten", {}),
    "inline": ("inline", {}),
    "circulant": ("circulant", {}),
    "diff": ("diff", {}),
    "mhsa_dwc": ("mhsa+dwc", {}),
    "vca-no_dwc": ("vca", {"local_conv": False}),
}
# Every attention by name, and VCA without its local term (the second control).
CASES = [(name, {}) for name in ATTENTIONS] + [("vca", {"local_conv": False})]
CASE_IDS = [name if not options else f"{name}-no_local" for name, options in CASES]
# The pooled-token count on the small test grids (4x4 patches -> 2x2 pooled tokens)
TOKENS = {"agent": {"agent_tokens": 4}, "vca": {"contrast_tokens": 4}}

TINY_DEIT = dict(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=2, num_classes=5)
TINY_DIT = dict(input_size=8, in_channels=4, hidden_size=48, depth=2, num_heads=2, num_classes=5)


def shapes(model: nn.Module) -> dict:
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


@pytest.fixture
def meta_device():
    """Full-size models built for their structure only: on the meta device (no memory, no init cost)."""
    with torch.device("meta"):
        yield


# ---------------------------------------------------------------------------------------------
# 1. Published models: parameters and GMACs as published
# ---------------------------------------------------------------------------------------------


def test_every_registered_published_model_has_a_published_row():
    """models/family.py registers exactly the models data/paper_reference.yaml holds numbers for."""
    registered = set(family_models.default_cfgs)
    assert {name for name, _, _ in PUBLISHED} == registered
    assert len(PUBLISHED) == len(registered)  # no model listed twice


@pytest.mark.parametrize("name,img_size,row", PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_published_model_matches_published_params_and_gmacs(name, img_size, row, one_torch_thread):
    model = timm.create_model(name).eval()
    assert model.patch_embed.img_size == (img_size, img_size)
    params_m = count_parameters(model) / 1e6
    gmacs = model_flops(model, (1, 3, img_size, img_size)).macs / 1e9
    published_params, published_gmacs = row["params_m"][0], row["gflops"][0]
    assert abs(params_m - published_params) <= TOLERANCE, f"{name}: {params_m:.3f}M vs {published_params}M"
    assert abs(gmacs - published_gmacs) <= TOLERANCE, f"{name}: {gmacs:.3f} GMACs vs {published_gmacs}G"


def test_published_deit_tiny_models_are_the_pipelines_published_archs():
    """The complexity stage's deit_tiny-<a>-published models resolve to the row's published model."""
    from vcarepro.params.config import compose

    models = compose()["models"]
    for row in FAMILY_REF["rows"]:
        if not row["published_model"]:
            continue
        spec = models[f"deit_tiny-{row['attention']}-published"]
        assert spec["attention"] == row["attention"]
        assert classifier_name(spec["arch"], spec["attention"]) == row["published_model"]


# ---------------------------------------------------------------------------------------------
# 2. What each published model changes beyond the attention
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("attention", ["agent", "flatten"])
def test_agent_and_flatten_published_models_are_the_drop_in(attention, meta_device):
    published = timm.create_model(f"{attention}_deit_tiny_patch16_224")
    dropin = create_classifier("deit_tiny", attention)
    assert shapes(published) == shapes(dropin)


def test_agent_published_models_use_49_agent_tokens(meta_device):
    for name in ("agent_deit_tiny_patch16_224", "agent_deit_small_patch16_224"):
        model = timm.create_model(name)
        assert all(block.attn.agent_grid == (7, 7) for block in model.blocks), name


def test_inline_tiny_is_deit_tiny_with_six_heads(meta_device):
    model = timm.create_model("inline_deit_tiny_patch16_224")
    assert model.embed_dim == 192 and len(model.blocks) == 12 and model.cls_token is not None
    assert [b.attn.num_heads for b in model.blocks] == [6] * 12
    assert all(b.attn.head_dim == 32 for b in model.blocks)
    # nothing but the head count differs from the drop-in (whose DeiT-T has 3 heads)
    assert [b.attn.num_heads for b in create_classifier("deit_tiny", "inline").blocks] == [3] * 12
    assert shapes(model) == shapes(create_classifier("deit_tiny", "inline", num_heads=6))


def test_inline_small_is_320_wide_with_ten_heads_at_288(meta_device):
    model = timm.create_model("inline_deit_small_patch16_288")
    assert model.embed_dim == 320 and len(model.blocks) == 12
    assert [b.attn.num_heads for b in model.blocks] == [10] * 12
    assert model.patch_embed.img_size == (288, 288) and model.pretrained_cfg["input_size"] == (3, 288, 288)
    assert shapes(model) == shapes(create_classifier("deit_small", "inline", embed_dim=320, num_heads=10, img_size=288))


@pytest.mark.parametrize("size", ["tiny", "small"])
def test_circulant_published_model_layout(size, meta_device):
    model = timm.create_model(f"circulant_deit_{size}_patch16_224")
    dim = model.embed_dim
    assert model.cls_token is None and model.pos_embed is None and model.num_prefix_tokens == 0
    assert model.global_pool == "avg"
    assert isinstance(model.norm, nn.LayerNorm) and isinstance(model.fc_norm, nn.Identity)
    for block in model.blocks:
        assert isinstance(block, ConvPositionBlock)
        conv = block.cpe
        assert conv.groups == dim and conv.kernel_size == (3, 3) and conv.padding == (1, 1)
        assert conv.bias is not None
        assert block.attn.qkv.bias is None
        assert block.attn.num_prefix_tokens == 0
    # exactly the drop-in's state minus class token, position embedding and qkv biases, plus the cpe convs
    published, dropin = shapes(model), shapes(create_classifier(f"deit_{size}", "circulant"))
    depth = len(model.blocks)
    removed = {"cls_token", "pos_embed"} | {f"blocks.{i}.attn.qkv.bias" for i in range(depth)}
    added = {f"blocks.{i}.cpe.{p}": s for i in range(depth) for p, s in (("weight", (dim, 1, 3, 3)), ("bias", (dim,)))}
    expected = {k: v for k, v in dropin.items() if k not in removed}
    expected.update(added)
    assert published == expected


def test_circulant_pools_the_mean_of_normed_tokens(one_torch_thread):
    torch.manual_seed(0)
    model = timm.create_model("circulant_deit_tiny_patch16_224", img_size=32, num_classes=5).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        features = model.forward_features(x)
        assert features.shape == (2, 4, model.embed_dim)  # 2x2 patches, no class token
        torch.testing.assert_close(model.forward_head(features, pre_logits=True), features.mean(1))
        torch.testing.assert_close(model(x), model.head(features.mean(1)))


def test_circulant_block_adds_a_depthwise_conv_before_the_block(one_torch_thread):
    """x -> Block(x + dwconv3x3(x on the grid)): the position encoding is applied before norm1."""
    torch.manual_seed(0)
    model = timm.create_model("circulant_deit_tiny_patch16_224", img_size=64, num_classes=5).eval()
    block = model.blocks[1]
    B, (H, W), C = 2, model.patch_embed.grid_size, model.embed_dim
    x = torch.randn(B, H * W, C)
    grid = x.transpose(1, 2).reshape(B, C, H, W)
    cpe = F.conv2d(grid, block.cpe.weight, block.cpe.bias, padding=1, groups=C).flatten(2).transpose(1, 2)
    with torch.no_grad():
        torch.testing.assert_close(block(x), Block.forward(block, x + cpe))
        assert not torch.allclose(block(x), Block.forward(block, x), atol=1e-4)


# ---------------------------------------------------------------------------------------------
# 3. The controls: MHSA + VCA's depthwise term, and VCA without it
# ---------------------------------------------------------------------------------------------

DIM, HEADS = 48, 3


def make_control(prefix: int, grid, seed: int = 0) -> MhsaLocalConv:
    torch.manual_seed(seed)
    layer = build_attention("mhsa+dwc", DIM, HEADS, grid_size=grid, num_prefix_tokens=prefix, qkv_bias=True)
    assert isinstance(layer, MhsaLocalConv)
    return layer.eval()


def timm_twin(control: MhsaLocalConv) -> Attention:
    attention = Attention(DIM, num_heads=HEADS, qkv_bias=True).eval()
    attention.qkv.load_state_dict(control.qkv.state_dict())
    attention.proj.load_state_dict(control.proj.state_dict())
    return attention


def token_batch(prefix: int, grid, seed: int = 1, batch: int = 2) -> torch.Tensor:
    torch.manual_seed(seed)
    return torch.randn(batch, prefix + grid[0] * grid[1], DIM)


@pytest.mark.parametrize("prefix,grid", [(1, (4, 3)), (0, (4, 4)), (2, (3, 5))])
def test_control_without_its_conv_is_timms_attention(prefix, grid):
    control = make_control(prefix, grid)
    with torch.no_grad():
        control.local_conv.weight.zero_()
        control.local_conv.bias.zero_()
        x = token_batch(prefix, grid)
        expected = timm_twin(control)(x)
        for fused in (True, False):
            torch.testing.assert_close(attention_path(control, fused)(x), expected, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("prefix,grid", [(1, (4, 3)), (0, (4, 4))])
def test_control_materialised_attention_equals_fused(prefix, grid):
    control = make_control(prefix, grid)
    x = token_batch(prefix, grid)
    with torch.no_grad():
        materialised, fused = attention_path(control, False)(x), attention_path(control, True)(x)
        torch.testing.assert_close(materialised, fused, atol=1e-5, rtol=1e-5)
        # and the conv term is really there (PyTorch's default init is not zero)
        assert not torch.allclose(control(x), timm_twin(control)(x), atol=1e-4)


def test_control_prefix_tokens_get_no_conv_term():
    prefix, grid = 1, (4, 3)
    control = make_control(prefix, grid)
    x = token_batch(prefix, grid)
    with torch.no_grad():
        before = control(x)
        control.local_conv.weight.add_(torch.randn_like(control.local_conv.weight))
        control.local_conv.bias.add_(torch.randn_like(control.local_conv.bias))
        after = control(x)
    torch.testing.assert_close(after[:, :prefix], before[:, :prefix], atol=0, rtol=0)
    assert (after[:, prefix:] - before[:, prefix:]).abs().amin(dim=-1).gt(0).all()  # every patch token moved


@pytest.mark.parametrize("grid", [(4, 4), (4, 3)])
def test_control_conv_term_is_a_depthwise_conv_of_v_on_the_grid(grid):
    """out(conv) - out(conv zeroed) = proj(conv3x3_dw(v on the row-major grid)) without proj's bias."""
    control = make_control(0, grid)
    with torch.no_grad():
        control.local_conv.weight.copy_(torch.randn_like(control.local_conv.weight))  # not symmetric
        x = token_batch(0, grid)
        B, (H, W) = x.shape[0], grid
        v = F.linear(x, control.qkv.weight[2 * DIM :], control.qkv.bias[2 * DIM :])  # (B, N, C)
        v_grid = v.transpose(1, 2).reshape(B, DIM, H, W)
        conv = F.conv2d(v_grid, control.local_conv.weight, control.local_conv.bias, padding=1, groups=DIM)
        term = conv.flatten(2).transpose(1, 2)  # (B, N, C)
        with_conv = control(x)
        control.local_conv.weight.zero_()
        control.local_conv.bias.zero_()
        without = control(x)
    torch.testing.assert_close(with_conv - without, term @ control.proj.weight.T, atol=1e-5, rtol=1e-5)


def test_control_conv_is_vcas_conv():
    control = make_control(1, (4, 3))
    vca = build_attention("vca", DIM, HEADS, grid_size=(4, 3), num_prefix_tokens=1, options={"contrast_tokens": 4})
    assert shapes(control.local_conv) == shapes(vca.local_conv)
    assert control.local_conv.groups == vca.local_conv.groups == DIM
    assert control.local_conv.padding == vca.local_conv.padding


def test_control_models_differ_from_their_pair_by_exactly_the_conv(meta_device):
    """DeiT-T: mhsa+dwc = MHSA plus one depthwise conv per block; vca without it = VCA less that conv."""
    dim, depth = 192, 12
    conv_keys = {f"blocks.{i}.attn.local_conv.{p}" for i in range(depth) for p in ("weight", "bias")}
    conv_params = dim * 9 + dim

    vca = create_classifier("deit_tiny", "vca")
    no_local = create_classifier("deit_tiny", "vca", local_conv=False)
    assert count_parameters(vca) - count_parameters(no_local) == depth * conv_params
    assert shapes(no_local) == {k: v for k, v in shapes(vca).items() if k not in conv_keys}

    mhsa = create_classifier("deit_tiny", "mhsa")
    control = create_classifier("deit_tiny", "mhsa+dwc")
    assert count_parameters(control) - count_parameters(mhsa) == depth * conv_params
    assert {k: v for k, v in shapes(control).items() if k not in conv_keys} == shapes(mhsa)


def test_vca_without_local_term_layer():
    kw = dict(grid_size=(4, 3), num_prefix_tokens=1, qkv_bias=True)
    vca = build_attention("vca", DIM, HEADS, **kw, options={"contrast_tokens": 4})
    no_local = build_attention("vca", DIM, HEADS, **kw, options={"contrast_tokens": 4, "local_conv": False})
    assert count_parameters(vca) - count_parameters(no_local) == DIM * 9 + DIM
    assert shapes(no_local) == {
        k: v for k, v in shapes(vca).items() if k not in ("local_conv.weight", "local_conv.bias")
    }


# ---------------------------------------------------------------------------------------------
# 4. Every attention trains in DeiT and DiT, in fp32 and under bf16 autocast
# ---------------------------------------------------------------------------------------------


def relative_error(approx: torch.Tensor, exact: torch.Tensor) -> float:
    return ((approx.float() - exact).norm() / exact.norm()).item()


def assert_grads(model: nn.Module, nonzero: bool) -> None:
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        assert p.grad is not None, f"{name} got no gradient"
        assert torch.isfinite(p.grad).all(), f"{name} has a non-finite gradient"
        if nonzero:
            assert p.grad.abs().max() > 0, f"{name} has an all-zero gradient"


@pytest.mark.parametrize("name,options", CASES, ids=CASE_IDS)
def test_deit_with_every_attention_trains_and_runs_in_bf16(name, options, one_torch_thread):
    torch.manual_seed(0)
    model = create_classifier("deit_tiny", name, **TINY_DEIT, **TOKENS.get(name, {}), **options)
    assert {type(b.attn) for b in model.blocks} == {
        type(
            build_attention(name, 48, 2, grid_size=4, num_prefix_tokens=1, options={**TOKENS.get(name, {}), **options})
        )
    }
    x = torch.randn(2, 3, 32, 32)
    features = model.forward_features(x)
    logits = model.forward_head(features)
    assert logits.shape == (2, 5) and torch.isfinite(logits).all()
    # The logits read the class token only, and the layers' patch-only terms (local convs, patch
    # biases) of the last block never reach it; the features' loss reaches every parameter.
    (logits.square().sum() + features.square().mean()).backward()
    assert_grads(model, nonzero=True)

    model.eval()
    with torch.no_grad():
        exact = model(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            approx = model(x)
    assert torch.isfinite(approx).all()
    assert relative_error(approx, exact) < 2e-2


def perturb_adaln_zero(model: nn.Module) -> None:
    """DiT starts as the identity with a zero output (adaLN-Zero); give its gates and final layer
    small weights so that the attention lies on the path from input to output."""
    with torch.no_grad():
        for module in [
            *(b.adaLN_modulation[-1] for b in model.blocks),
            model.final_layer.adaLN_modulation[-1],
            model.final_layer.linear,
        ]:
            module.weight.normal_(std=0.05)
            module.bias.normal_(std=0.05)


@pytest.mark.parametrize("name,options", CASES, ids=CASE_IDS)
def test_dit_with_every_attention_trains_and_runs_in_bf16(name, options, one_torch_thread):
    torch.manual_seed(0)
    model = create_dit("dit_s2", name, **TINY_DIT, **TOKENS.get(name, {}), **options)
    x, t, y = torch.randn(2, 4, 8, 8), torch.tensor([1, 500]), torch.tensor([0, 3])

    # as built (adaLN-Zero): finite output and gradients
    out = model(x, t, y)
    assert out.shape == (2, 8, 8, 8) and torch.isfinite(out).all()
    out.square().sum().backward()
    assert_grads(model, nonzero=False)

    # with the gates open every trainable parameter gets a non-zero gradient
    model.zero_grad(set_to_none=True)
    perturb_adaln_zero(model)
    out = model(x, t, y)
    (out.square().sum()).backward()
    assert torch.isfinite(out).all()
    assert_grads(model, nonzero=True)

    model.eval()
    with torch.no_grad():
        exact = model(x, t, y)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            approx = model(x, t, y)
    assert exact.abs().max() > 0 and torch.isfinite(approx).all()
    assert relative_error(approx, exact) < 2e-2


# ---------------------------------------------------------------------------------------------
# 5. Errors
# ---------------------------------------------------------------------------------------------


def one_sentence(message: str) -> bool:
    return "\n" not in message and message.rstrip().endswith(".") and ". " not in message.rstrip()


def test_unknown_attention_names_the_choices():
    builders = [
        lambda: build_attention("softmax", 48, 2, grid_size=4, num_prefix_tokens=1),
        lambda: create_classifier("deit_tiny", "softmax"),
        lambda: create_dit("dit_s2", "softmax"),
    ]
    for build in builders:
        with pytest.raises(BadInput) as err:
            build()
        message = str(err.value)
        assert "softmax" in message
        assert all(repr(name) in message for name in ATTENTIONS), message


@pytest.mark.parametrize(
    "name,option",
    [
        ("flatten", "agent_tokens"),
        ("agent", "contrast_tokens"),
        ("inline", "local_conv"),
        ("mhsa+dwc", "contrast_tokens"),
        ("mhsa", "agent_tokens"),
        ("diff", "contrast_tokens"),
    ],
)
def test_option_of_another_attention_is_refused(name, option):
    with pytest.raises(BadInput) as err:
        build_attention(name, 48, 2, grid_size=4, num_prefix_tokens=1, options={option: 4})
    message = str(err.value)
    assert option in message and repr(name) in message
    assert one_sentence(message), message


GRID_LAYERS = ["vca", "agent", "flatten", "inline", "circulant", "mhsa+dwc"]  # ours; mhsa and diff are timm's


@pytest.mark.parametrize("name", GRID_LAYERS)
def test_every_grid_layer_refuses_an_empty_grid_at_construction_and_on_resize(name):
    options = {"agent": dict(agent_tokens=4), "vca": dict(contrast_tokens=4)}.get(name, {})
    for grid in [(0, 4), 0]:
        with pytest.raises(BadInput, match=r"has an empty side") as err:
            build_attention(name, 48, 2, grid_size=grid, num_prefix_tokens=1, options=options)
        assert one_sentence(str(err.value)), str(err.value)
    layer = build_attention(name, 48, 2, grid_size=4, num_prefix_tokens=1, options=options)
    with pytest.raises(BadInput, match=r"has an empty side"):
        layer.set_grid_size((4, 0))
    assert layer.grid_size == (4, 4)


@pytest.mark.parametrize("name", [n for n in GRID_LAYERS if n != "circulant"])  # circulant splits no heads
@pytest.mark.parametrize(
    "dim, prefix, qk_norm, message",
    [
        (49, 1, False, "dim=49 is not divisible by num_heads=2"),
        (48, -1, False, "must be >= 0"),
        (48, 1, True, "needs a norm_layer"),
    ],
)
def test_every_head_split_layer_checks_the_shared_arguments(name, dim, prefix, qk_norm, message):
    options = {"agent": dict(agent_tokens=4), "vca": dict(contrast_tokens=4)}.get(name, {})
    with pytest.raises(BadInput, match=message):
        build_attention(name, dim, 2, grid_size=4, num_prefix_tokens=prefix, qk_norm=qk_norm, options=options)


def test_models_refuse_an_option_of_another_attention():
    for build, name in [
        (lambda: create_classifier("deit_tiny", "mhsa", agent_tokens=4), "mhsa"),
        (lambda: create_classifier("deit_tiny", "flatten", contrast_tokens=4), "flatten"),
        (lambda: create_dit("dit_s2", "flatten", agent_tokens=4), "flatten"),
    ]:
        with pytest.raises(BadInput) as err:
            build()
        message = str(err.value)
        assert repr(name) in message and ("agent_tokens" in message or "contrast_tokens" in message)
        assert one_sentence(message), message


# ---------------------------------------------------------------------------------------------
# 6. The pipeline's switch: family=all
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def configs():
    from vcarepro.params.config import compose

    return {"default": compose(), "embedded": compose(["family=all"]), "paper": compose(["family=all", "scale=paper"])}


@pytest.mark.parametrize("scale,seeds", [("embedded", 3), ("paper", 1)])
def test_family_all_adds_both_branches_with_the_vca_rows_recipe(configs, scale, seeds):
    cfg = configs[scale]
    vca_cls, vca_gen = cfg["cls_runs"]["deit_tiny-vca"], cfg["gen_runs"]["dit_s2-vca"]
    assert vca_gen["objective"] == "ddpm"
    for suffix, (attention, options) in FAMILY_RUNS.items():
        cls_run, gen_run = cfg["cls_runs"][f"deit_tiny-{suffix}"], cfg["gen_runs"][f"dit_s2-{suffix}"]
        assert cls_run["recipe"] == vca_cls["recipe"]
        assert gen_run["objective"] == vca_gen["objective"]
        for run in (cls_run, gen_run):
            assert len(run["seeds"]) == len(set(run["seeds"])) == seeds
        for run, arch in ((cls_run, "deit_tiny"), (gen_run, "dit_s2")):
            model = cfg["models"][run["model"]]
            assert model["arch"] == arch and model["attention"] == attention
            assert {k: v for k, v in (model.get("options") or {}).items() if k in options} == options


def test_family_is_off_by_default(configs):
    cfg = configs["default"]
    for suffix in FAMILY_RUNS:
        assert f"deit_tiny-{suffix}" not in cfg["cls_runs"]
        assert f"dit_s2-{suffix}" not in cfg["gen_runs"]
    assert "deit_tiny-vca" in cfg["cls_runs"] and "dit_s2-vca" in cfg["gen_runs"]


def test_every_run_names_a_model_and_the_reference_names_real_runs(configs):
    for cfg in configs.values():
        for runs in (cfg["cls_runs"], cfg["gen_runs"]):
            assert all(run["model"] in cfg["models"] for run in runs.values())
    # the family table's runs at both scales; its baseline (DeiT-T with the lab's recipe, the twin of
    # VCA's row) runs at paper scale only
    for scale, entries in [
        ("embedded", [*FAMILY_REF["rows"], FAMILY_REF["vca"]]),
        ("paper", [*FAMILY_REF["rows"], *FAMILY_REF["decomposition"], FAMILY_REF["baseline"], FAMILY_REF["vca"]]),
    ]:
        cfg = configs[scale]
        for entry in entries:
            assert entry["cls_run"] in cfg["cls_runs"] and entry["gen_run"] in cfg["gen_runs"], (scale, entry)
    for suffix in FAMILY_RUNS:  # every run family=all adds is in the table or the decomposition
        assert any(
            e["cls_run"] == f"deit_tiny-{suffix}" and e["gen_run"] == f"dit_s2-{suffix}"
            for e in [*FAMILY_REF["rows"], *FAMILY_REF["decomposition"]]
        ), suffix


def test_model_options_maps_pooled_tokens_per_attention(configs):
    from vcarepro.core.choices import model_options

    shape = configs["embedded"]["cls_shape"]
    tokens = shape["contrast_tokens"]
    rest = {k: v for k, v in shape.items() if k != "contrast_tokens"}
    assert model_options("agent", {"agent_tokens": 49}, shape) == (rest, {"agent_tokens": tokens})
    assert model_options("vca", {"local_conv": False}, shape) == (
        rest,
        {"local_conv": False, "contrast_tokens": tokens},
    )
    for attention in ("flatten", "inline", "circulant", "diff", "mhsa+dwc"):
        assert model_options(attention, {}, shape) == (rest, {})
    assert shape["contrast_tokens"] == tokens  # the scale's shape is not changed in place


def test_every_family_run_builds_at_the_embedded_shape(configs, one_torch_thread):
    """What the training stages do with a family run: model_options, then the factory, then a forward."""
    from vcarepro.core.choices import model_options

    cfg = configs["embedded"]
    for suffix in FAMILY_RUNS:
        spec = cfg["models"][cfg["cls_runs"][f"deit_tiny-{suffix}"]["model"]]
        shape, options = model_options(spec["attention"], spec.get("options") or {}, cfg["cls_shape"])
        model = create_classifier(spec["arch"], spec["attention"], num_classes=10, **shape, **options).eval()
        size = shape["img_size"]
        with torch.no_grad():
            assert torch.isfinite(model(torch.randn(1, 3, size, size))).all(), suffix

        spec = cfg["models"][cfg["gen_runs"][f"dit_s2-{suffix}"]["model"]]
        shape, options = model_options(spec["attention"], spec.get("options") or {}, cfg["gen_shape"])
        dit = create_dit(spec["arch"], spec["attention"], attention_options=options, **shape).eval()
        side, channels = shape["input_size"], shape["in_channels"]
        with torch.no_grad():
            out = dit(torch.randn(1, channels, side, side), torch.tensor([3]), torch.tensor([1]))
        assert torch.isfinite(out).all(), suffix
