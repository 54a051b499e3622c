"""The plain-ViT models (VCA / Diff / drop-in / family DeiTs) as first-class timm models (issue 16).

Each convention timm users rely on, checked on small configurations of every registered plain ViT:
data config and transforms, feature extraction (getter and torch.fx), TorchScript where it holds,
other input sizes, classifier reset / weight-decay sets / layer-wise lr decay, and weights loaded
back through ``pretrained=True`` with a file.
"""

from __future__ import annotations

import pytest
import timm
import torch
from safetensors.torch import save_file
from timm.data import create_transform, resolve_model_data_config
from timm.models import FeatureGraphNet, create_feature_extractor

import vcarepro.models  # noqa: F401  (registers the models)
from helpers import SMALL as HIERARCHICAL_SMALL
from vcarepro.attention import ATTENTIONS
from vcarepro.core.errors import BadInput
from vcarepro.core.recipes import ClsRecipe
from vcarepro.train.classification import build_optimizer

# A 4x4 patch grid: two blocks of width 48, pooled-token counts that fit the grid.
SMALL = dict(img_size=32, patch_size=8, depth=2, embed_dim=48, num_heads=3, num_classes=10)
POOLED = {"vca": dict(contrast_tokens=4), "agent": dict(agent_tokens=4)}

# (timm name, extra kwargs) for every plain-ViT model we register, drop-ins with every attention. At the
# small test shape a *_small model is its *_tiny twin, and the drop-ins with mhsa / diff / vca / agent /
# flatten are timm's DeiT, diff_deit, vca_deit, agent_deit, flatten_deit: those run with the slow tests only.
_MODELS = [
    ("vca_deit_tiny_patch16_224", POOLED["vca"]),
    ("vca_deit_small_patch16_224", POOLED["vca"]),
    ("diff_deit_tiny_patch16_224", {}),
    ("diff_deit_small_patch16_224", {}),
    *[
        (f"dropin_deit_{size}_patch16_224", dict(attention=a, **POOLED.get(a, {})))
        for size in ("tiny", "small")
        for a in ATTENTIONS
    ],
    ("agent_deit_tiny_patch16_224", POOLED["agent"]),
    ("agent_deit_small_patch16_224", POOLED["agent"]),
    ("flatten_deit_tiny_patch16_224", {}),
    ("inline_deit_tiny_patch16_224", dict(num_heads=6)),
    ("inline_deit_small_patch16_288", dict(num_heads=6)),
    ("circulant_deit_tiny_patch16_224", {}),
    ("circulant_deit_small_patch16_224", {}),
]
TWINS = ("mhsa", "diff", "vca", "agent", "flatten")
ONE_PER_NAME = {name: extra for name, extra in reversed(_MODELS)}  # the drop-ins with mhsa
MODELS = [
    pytest.param(
        name,
        extra,
        id=name + (f"[{extra['attention']}]" if "attention" in extra else ""),
        marks=[pytest.mark.slow] if "_small_" in name or extra.get("attention") in TWINS else [],
    )
    for name, extra in _MODELS
]


def small(name: str, extra: dict, **kwargs) -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model(name, **{**SMALL, **extra, **kwargs}).eval()


def image(size: int = 32, batch: int = 2) -> torch.Tensor:
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(1))


# -- 1. pretrained cfg --------------------------------------------------------------------


@pytest.mark.parametrize(("name", "extra"), ONE_PER_NAME.items(), ids=list(ONE_PER_NAME))
def test_pretrained_cfg_is_complete_and_builds_a_transform(name, extra):
    model = small(name, extra, pretrained=False)
    cfg = model.pretrained_cfg
    for field in (
        "input_size",
        "mean",
        "std",
        "crop_pct",
        "interpolation",
        "first_conv",
        "classifier",
        "license",
        "paper_ids",
        "paper_name",
        "notes",
    ):
        assert cfg.get(field), field
    assert "no pretrained weights are published" in " ".join(cfg["notes"])
    data = resolve_model_data_config(model)
    side = 288 if name.endswith("288") else 224
    assert data["input_size"] == (3, side, side) and data["interpolation"] == "bicubic"
    transform = create_transform(**data)
    from PIL import Image

    assert transform(Image.new("RGB", (300, 260))).shape == (3, side, side)
    assert dict(model.named_modules())[cfg["first_conv"]].in_channels == 3
    assert dict(model.named_modules())[cfg["classifier"]] is model.get_classifier()


# -- 2. features: getter and forward_intermediates -----------------------------------------


@pytest.mark.parametrize(("name", "extra"), MODELS)
def test_features_only_and_forward_intermediates_give_a_pyramid_of_grids(name, extra):
    features = small(name, extra, features_only=True, out_indices=(0, 1))
    assert features.feature_info.channels() == [48, 48]
    assert features.feature_info.reduction() == [8, 8]
    maps = features(image())
    assert [tuple(m.shape) for m in maps] == [(2, 48, 4, 4)] * 2

    model = small(name, extra)
    final, intermediates = model.forward_intermediates(image(), indices=[0, 1])
    assert [tuple(m.shape) for m in intermediates] == [(2, 48, 4, 4)] * 2
    assert final.shape == (2, model.num_prefix_tokens + 16, 48)
    with torch.no_grad():
        assert torch.allclose(model.forward_head(final), model(image()), atol=1e-5)
    assert [i["reduction"] for i in model.feature_info] == [8, 8]


def test_circulant_features_have_no_prefix_tokens():
    """ca_deit.py has no class token: its tokens are the grid alone, and so are its intermediates."""
    model = small("circulant_deit_tiny_patch16_224", {})
    assert model.num_prefix_tokens == 0 and model.cls_token is None
    final, intermediates = model.forward_intermediates(image(), indices=2)
    assert final.shape == (2, 16, 48) and [tuple(t.shape) for t in intermediates] == [(2, 48, 4, 4)] * 2


@pytest.mark.parametrize(("name", "extra"), [MODELS[0], MODELS[-5]])
def test_three_block_feature_pyramid(name, extra):
    features = small(name, extra, depth=3, features_only=True, out_indices=(0, 1, 2))
    assert features.feature_info.channels() == [48] * 3 and features.feature_info.reduction() == [8] * 3
    assert [tuple(m.shape) for m in features(image())] == [(2, 48, 4, 4)] * 3


@pytest.mark.slow
def test_three_block_feature_pyramid_at_deit_tiny_shape():
    features = timm.create_model(
        "vca_deit_tiny_patch16_224", features_only=True, out_indices=(3, 7, 11), img_size=64, contrast_tokens=4
    ).eval()
    assert features.feature_info.channels() == [192] * 3 and features.feature_info.reduction() == [16] * 3
    maps = features(image(64, 1))
    assert [tuple(m.shape) for m in maps] == [(1, 192, 4, 4)] * 3


# -- 3. torch.fx ------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "extra"), MODELS)
def test_fx_traced_model_matches_eager(name, extra):
    model = small(name, extra)
    x = image()
    traced = create_feature_extractor(model, return_nodes={"blocks.1": "last", "head": "logits"})
    with torch.no_grad():
        out = traced(x)
        assert torch.allclose(out["logits"], model(x), atol=1e-6)
        assert torch.allclose(
            out["last"], model.blocks(model.norm_pre(model._pos_embed(model.patch_embed(x)))), atol=1e-6
        )


@pytest.mark.parametrize(("name", "extra"), [MODELS[0], MODELS[-7], MODELS[-5], MODELS[-2]])
def test_feature_graph_net_returns_the_blocks_tokens(name, extra):
    model = small(name, extra)
    graph = FeatureGraphNet(model, out_indices=(0, 1))
    with torch.no_grad():
        assert [tuple(t.shape) for t in graph(image())] == [(2, model.num_prefix_tokens + 16, 48)] * 2


@pytest.mark.parametrize(("name", "extra"), [_MODELS[0], _MODELS[-7], _MODELS[-4]])
def test_token_check_still_raises_in_eager_mode(name, extra):
    model = small(name, extra)
    with pytest.raises(BadInput, match="got 10 tokens but expects 1 prefix \\+ 4x4 grid = 17"):
        model.blocks[0].attn(torch.randn(1, 10, 48))


# -- 4. TorchScript ----------------------------------------------------------------------------------

# timm's deit_tiny_patch16_224 scripts, and so do ours except FLatten: its float32 island runs under
# torch.autocast(device_type=x.device.type, enabled=False), a context TorchScript takes with constant
# arguments only, and it reads module-level float constants, which TorchScript does not.
NOT_SCRIPTABLE = ("flatten",)
# torch 2.10+ warns that torch.jit.script is deprecated; timm still supports it, and so do we where it holds
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")
SCRIPTED = [m for m in MODELS if not any(a in m.values[0] or m.values[1].get("attention") == a for a in NOT_SCRIPTABLE)]


@pytest.mark.parametrize(("name", "extra"), SCRIPTED)
def test_torchscript_model_matches_eager(name, extra):
    model = small(name, extra)
    scripted = torch.jit.script(model)
    with torch.no_grad():
        torch.testing.assert_close(scripted(image()), model(image()), rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    "options",
    [
        dict(stage1="diff"),
        dict(stage2="diff", local_conv=False),
        dict(tokens_pos="emb", tokens_neg="pool", stage2_softmax="separate"),
    ],
)
def test_torchscript_covers_the_vca_ablation_switches(options):
    model = small("vca_deit_tiny_patch16_224", POOLED["vca"], **options)
    with torch.no_grad():
        torch.testing.assert_close(torch.jit.script(model)(image()), model(image()), rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    "options",
    [
        dict(attention="inline", kernel="exp"),
        dict(attention="circulant", channels_per_kernel=2, gate=False, qkv_bias=True),
        dict(attention="circulant", prefix_attention="none", logit_divisor="n"),
        dict(attention="agent", agent_tokens=4, position_bias=False, class_token=False, global_pool="avg"),
    ],
)
def test_torchscript_covers_family_options(options):
    model = small("dropin_deit_tiny_patch16_224", {}, **options)
    with torch.no_grad():
        torch.testing.assert_close(torch.jit.script(model)(image()), model(image()), rtol=0, atol=1e-6)


@pytest.mark.parametrize("attention", NOT_SCRIPTABLE)
def test_flatten_does_not_script(attention):
    with pytest.raises(Exception):
        torch.jit.script(small("dropin_deit_tiny_patch16_224", {}, attention=attention))


# -- 5. other input sizes -----------------------------------------------------------------------


@pytest.mark.parametrize(("name", "extra"), MODELS)
def test_set_input_size_moves_every_grid_and_the_model_runs_there(name, extra):
    model = small(name, extra)
    model.set_input_size(img_size=48)
    assert all(tuple(b.attn.grid_size) == (6, 6) for b in model.blocks if hasattr(b.attn, "grid_size"))
    with torch.no_grad():
        assert model(image(48)).shape == (2, 10)


@pytest.mark.parametrize(("name", "extra"), [MODELS[0], MODELS[-7], MODELS[-5], MODELS[-2]])
def test_img_size_at_creation_sets_every_grid(name, extra):
    model = small(name, extra, img_size=48)
    assert all(tuple(b.attn.grid_size) == (6, 6) for b in model.blocks if hasattr(b.attn, "grid_size"))
    with torch.no_grad():
        assert model(image(48)).shape == (2, 10)


@pytest.mark.slow
def test_vca_deit_tiny_runs_at_384_px_built_there_or_moved_there():
    model = timm.create_model("vca_deit_tiny_patch16_224", img_size=384).eval()
    assert model.blocks[0].attn.grid_size == (24, 24) and model.blocks[0].attn.contrast_grid == (7, 7)
    moved = timm.create_model("vca_deit_tiny_patch16_224").eval()
    moved.set_input_size(img_size=384)
    assert moved.blocks[11].attn.grid_size == (24, 24) and moved.pos_embed.shape == model.pos_embed.shape
    with torch.no_grad():
        assert model(image(384, 1)).shape == moved(image(384, 1)).shape == (1, 1000)


def test_agent_and_flatten_grid_parameters_follow_the_input_size():
    agent = small("agent_deit_tiny_patch16_224", POOLED["agent"])
    agent.set_input_size(img_size=48)
    assert agent.blocks[0].attn.agent_row_bias.shape[3] == 6 and agent.blocks[0].attn.col_agent_bias.shape[3] == 6
    flatten = small("flatten_deit_tiny_patch16_224", {})
    flatten.set_input_size(img_size=48)
    assert flatten.blocks[0].attn.pos_encoding.shape == (1, 1 + 36, 48)


def test_a_resolution_whose_grid_is_smaller_than_the_contrast_grid_is_one_clear_error():
    with pytest.raises(BadInput, match="the 7x7 contrast-token grid is larger than the 4x4 patch grid"):
        timm.create_model("vca_deit_tiny_patch16_224", img_size=64)
    model = timm.create_model("vca_deit_tiny_patch16_224", depth=2)
    with pytest.raises(BadInput, match="the 7x7 contrast-token grid is larger than the 6x6 patch grid"):
        model.set_input_size(img_size=96)
    # refused before anything moved: the model still runs at 224
    assert model.patch_embed.grid_size == (14, 14) and model.blocks[1].attn.grid_size == (14, 14)
    with pytest.raises(BadInput, match="the 7x7 agent grid is larger than the 4x4 patch grid"):
        timm.create_model("agent_deit_tiny_patch16_224", img_size=64)


# -- 6. classifier, weight decay, layer-wise lr decay -----------------------------------------------

RECIPE = ClsRecipe.model_construct(
    opt="adamw", lr=1e-3, batch_size=512, warmup_lr=1e-6, min_lr=1e-5, scale_warmup_min_lr=False, weight_decay=0.05
)


@pytest.mark.parametrize(("name", "extra"), MODELS)
def test_reset_classifier_weight_decay_sets_and_layer_decay_groups(name, extra):
    model = small(name, extra)
    model.reset_classifier(5)
    with torch.no_grad():
        assert model(image()).shape == (2, 5)

    names = dict(model.named_parameters())
    exempt = model.no_weight_decay()
    assert exempt == {"pos_embed", "cls_token", "reg_token", "dist_token"}  # timm's ViT set
    by_id = {id(p): n for n, p in names.items()}
    no_decay = {
        by_id[id(p)] for g in build_optimizer(model, RECIPE).param_groups if g["weight_decay"] == 0 for p in g["params"]
    }
    assert no_decay == {n for n, p in names.items() if p.ndim <= 1 or n.endswith(".bias") or n in exempt}

    groups = timm.optim.create_optimizer_v2(model, "adamw", lr=1e-3, layer_decay=0.75).param_groups
    grouped = [id(p) for g in groups for p in g["params"]]
    assert sorted(grouped) == sorted(id(p) for p in names.values())  # every parameter exactly once
    scales = {by_id[id(p)]: g["lr_scale"] for g in groups for p in g["params"]}
    assert scales["blocks.0.attn.qkv.weight"] < scales["blocks.1.attn.qkv.weight"] < scales["head.weight"] == 1.0


# -- 7. weights through pretrained=True ------------------------------------------------------------


@pytest.mark.parametrize(("name", "extra"), MODELS)
def test_pretrained_true_loads_a_given_safetensors_file_to_identical_outputs(name, extra, tmp_path):
    trained = small(name, extra)
    path = tmp_path / "model.safetensors"
    save_file(trained.state_dict(), str(path))
    torch.manual_seed(99)
    loaded = timm.create_model(
        name, pretrained=True, pretrained_cfg_overlay=dict(file=str(path), num_classes=10), **{**SMALL, **extra}
    ).eval()
    with torch.no_grad():
        assert torch.equal(loaded(image()), trained(image()))


def test_pretrained_true_without_a_source_is_one_clear_error():
    with pytest.raises(
        BadInput,
        match="no pretrained weights are published for vca_deit_tiny_patch16_224; "
        "pass your own with pretrained_cfg_overlay=dict\\(file=",
    ):
        timm.create_model("vca_deit_tiny_patch16_224", pretrained=True)


# -- 8. the contract timm's own model tests hold every registered model to ----------------------------
# (timm's tests/test_models.py; our ViTs are of its deit* kind, whose features are tokens). Shapes at the registered
# size on the meta device, two blocks: nothing is computed.


def test_every_registered_model_is_checked_here_or_in_test_timm_hierarchical():
    from timm.models._registry import _model_entrypoints

    ours = {n for n, fn in _model_entrypoints.items() if fn.__module__.startswith("vcarepro.")}
    assert ours == set(ONE_PER_NAME) | set(HIERARCHICAL_SMALL)


def test_a_dropin_without_attention_is_deit_itself():
    """timm builds every registered model from its name alone."""
    model = timm.create_model("dropin_deit_tiny_patch16_224", **SMALL)
    assert model.attention == "mhsa"


def meta_vit(name: str, **kwargs) -> torch.nn.Module:
    return timm.create_model(name, device="meta", depth=2, **kwargs).eval()


@pytest.mark.parametrize(("name", "extra"), list(ONE_PER_NAME.items()), ids=list(ONE_PER_NAME))
def test_cfg_names_head_widths_device_dtype_and_frozen_weights_as_timm_expects(name, extra):
    with pytest.raises(TypeError):
        timm.create_model(name, device="meta", not_a_model_arg=1)
    model = meta_vit(name)
    cfg, params = model.pretrained_cfg, model.state_dict()
    assert f"{cfg['first_conv']}.weight" in params and f"{cfg['classifier']}.weight" in params
    assert cfg["input_size"][0] == model.in_chans and cfg["num_classes"] == model.num_classes
    assert {t.device.type for t in [*model.parameters(), *model.buffers()]} == {"meta"}
    x = torch.randn(1, *cfg["input_size"], device="meta")  # FLatten's float32 section included
    features = model.forward_features(x)
    assert features.shape[-1] == model.num_features
    pre_logits = model.forward_head(features, pre_logits=True)
    assert pre_logits.shape == (1, model.head_hidden_size)
    model.reset_classifier(0)
    assert model.num_classes == 0 and model(x).shape == pre_logits.shape
    assert meta_vit(name, num_classes=0)(x).shape == pre_logits.shape
    as_bf16 = meta_vit(name, dtype=torch.bfloat16).train()
    assert {p.dtype for p in as_bf16.parameters()} == {torch.bfloat16}
    as_bf16.reset_classifier(3)
    head = as_bf16.get_classifier()
    assert head.weight.device.type == "meta" and head.weight.dtype == torch.bfloat16 and head.training
    frozen = meta_vit(name).requires_grad_(False)
    frozen.reset_classifier(0)
    frozen.set_input_size(img_size=448)
    assert not [n for n, p in frozen.named_parameters() if p.requires_grad]


@pytest.mark.parametrize(
    ("name", "extra"),
    [(n, e) for n, e in ONE_PER_NAME.items() if "flatten" not in n],
    ids=[n for n in ONE_PER_NAME if "flatten" not in n],
)
def test_the_fx_traced_vit_scripts_as_timm_builds_it(name, extra):
    from torchvision.models.feature_extraction import create_feature_extractor as torchvision_feature_extractor

    model = small(name, extra)
    tracer = dict(
        leaf_modules=timm.models.get_notrace_modules(),
        autowrap_functions=timm.models.get_notrace_functions(),
        param_shapes_constant=True,
    )
    scripted = torch.jit.script(torchvision_feature_extractor(model, return_nodes=["head"], tracer_kwargs=tracer))
    with torch.no_grad():
        torch.testing.assert_close(scripted(image())["head"], model(image()), rtol=0, atol=1e-6)
