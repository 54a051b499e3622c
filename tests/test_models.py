"""timm-creatable VCA backbones: shapes, the paper's parameter claim, save/load, factory errors."""

from __future__ import annotations

import pytest
import timm
import torch
from safetensors.torch import save_file
from timm.layers import Attention, DiffAttention
from timm.models import VisionTransformer

import vcarepro.models  # noqa: F401  (registers the models)
from vcarepro.attention import VisualContrastAttention, lambda_init_for_layer
from vcarepro.metrics.complexity import count_parameters
from vcarepro.models import VcaVisionTransformer, classifier_name, create_classifier

# Tiny shapes keep these tests fast; the paper-shape tests build DeiT-T at 224.
SMALL = dict(img_size=64, num_classes=10, depth=2, contrast_tokens=4)


def test_vca_deit_tiny_is_timm_deit_tiny_with_every_attention_replaced():
    vca = timm.create_model("vca_deit_tiny_patch16_224")
    base = timm.create_model("deit_tiny_patch16_224")
    assert isinstance(vca, VcaVisionTransformer) and isinstance(vca, VisionTransformer)
    assert len(vca.blocks) == 12
    for i, block in enumerate(vca.blocks):
        attn = block.attn
        assert isinstance(attn, VisualContrastAttention)
        assert attn.layer_index == i and attn.lambda_init == lambda_init_for_layer(i)
        assert attn.grid_size == (14, 14) and attn.contrast_grid == (7, 7) and attn.num_prefix_tokens == 1
        assert attn.qkv.bias is not None  # DeiT uses qkv_bias
    vca_rest = {k: v.shape for k, v in vca.state_dict().items() if not k.startswith("blocks.") or ".attn." not in k}
    base_rest = {k: v.shape for k, v in base.state_dict().items() if not k.startswith("blocks.") or ".attn." not in k}
    assert vca_rest == base_rest, "only the attention layers may differ from timm's DeiT"


def test_vca_adds_under_0_3m_parameters_to_deit_tiny():
    added = count_parameters(timm.create_model("vca_deit_tiny_patch16_224")) - count_parameters(
        timm.create_model("deit_tiny_patch16_224")
    )
    assert 0.2e6 < added < 0.3e6
    # per block: e+ and e- (2 x 49 x 192), 8 lambda vectors of head dim 64,
    # two RMSNorm weights of 64, depthwise 3x3 conv with bias on 192 channels
    assert added == 12 * (2 * 49 * 192 + 8 * 64 + 2 * 64 + 192 * 9 + 192)


def test_baselines_are_timm_layers():
    assert isinstance(create_classifier("deit_tiny", "mhsa", **SMALL_NO_VCA).blocks[0].attn, Attention)
    assert type(create_classifier("deit_tiny", "mhsa", **SMALL_NO_VCA)) is VisionTransformer
    assert isinstance(create_classifier("deit_tiny", "diff", **SMALL_NO_VCA).blocks[1].attn, DiffAttention)


SMALL_NO_VCA = {k: v for k, v in SMALL.items() if k != "contrast_tokens"}


@pytest.mark.parametrize("name", ["vca_deit_tiny_patch16_224", "vca_deit_small_patch16_224"])
def test_forward_shapes_and_knobs_pass_through_create_model(name):
    m = timm.create_model(name, stage1="diff", tokens_neg="pool", stage2_softmax="separate", **SMALL).eval()
    attn = m.blocks[1].attn
    assert (attn.stage1, attn.tokens_neg, attn.stage2_softmax) == ("diff", "pool", "separate")
    assert attn.grid_size == (4, 4) and attn.contrast_grid == (2, 2)
    with torch.no_grad():
        assert m(torch.randn(2, 3, 64, 64)).shape == (2, 10)


def test_patch_size_and_no_class_token_reach_the_attention():
    m = timm.create_model(
        "vca_deit_tiny_patch16_224",
        img_size=64,
        patch_size=8,
        num_classes=5,
        class_token=False,
        global_pool="avg",
        depth=1,
        contrast_tokens=16,
    ).eval()
    assert m.blocks[0].attn.grid_size == (8, 8) and m.blocks[0].attn.num_prefix_tokens == 0
    with torch.no_grad():
        assert m(torch.randn(1, 3, 64, 64)).shape == (1, 5)


def test_set_input_size_moves_the_attention_grid():
    m = timm.create_model("vca_deit_tiny_patch16_224", **SMALL).eval()
    m.set_input_size(img_size=(128, 128))
    assert all(b.attn.grid_size == (8, 8) for b in m.blocks)
    with torch.no_grad():
        assert m(torch.randn(1, 3, 128, 128)).shape == (1, 10)


def test_contrast_grid_that_does_not_fit_the_model_is_a_clear_error():
    # 3x3 tokens on the 4x4 grid pool overlapping windows; 5x5 would repeat queries
    assert timm.create_model("vca_deit_tiny_patch16_224", **{**SMALL, "contrast_tokens": 9})
    with pytest.raises(ValueError, match="5x5 contrast-token grid is larger than the 4x4 patch grid"):
        timm.create_model("vca_deit_tiny_patch16_224", **{**SMALL, "contrast_tokens": 25})


def test_wrong_input_resolution_is_a_clear_error():
    m = timm.create_model("vca_deit_tiny_patch16_224", **SMALL)
    with pytest.raises(Exception, match="(?i)input (height|image size|size)|doesn't match|grid"):
        m(torch.randn(1, 3, 96, 96))


def test_timm_init_reaches_the_vca_linears():
    torch.manual_seed(0)
    m = timm.create_model("vca_deit_tiny_patch16_224")
    qkv = m.blocks[0].attn.qkv
    # timm's ViT init: trunc_normal(std=0.02) weights and zero biases, not PyTorch's default
    assert 0.015 < qkv.weight.std().item() < 0.025
    assert torch.count_nonzero(qkv.bias) == 0


@pytest.mark.parametrize("init, low, high", [("normal", 0.95, 1.05), ("trunc_normal", 0.015, 0.025)])
def test_contrast_embeddings_start_as_the_released_code_or_as_timms_tokens(init, low, high):
    """Default: N(0, 1), as both ports of the released classifier (DACS_CNPM nn.init.normal_, VCA_object_detection
    torch.randn); trunc_normal: timm's token init, std 0.02 (timm cuts at +-2 absolute, so nothing is cut).
    timm's ViT init must not overwrite either."""
    torch.manual_seed(0)
    options = {} if init == "normal" else dict(contrast_embed_init=init)
    m = timm.create_model("vca_deit_tiny_patch16_224", **options)
    for block in m.blocks:
        for embed in (block.attn.embed_pos, block.attn.embed_neg):
            assert low < embed.std().item() < high
    assert m.blocks[0].attn.contrast_embed_init == init
    assert m.blocks[0].attn.embed_pos.abs().max().item() > (2.5 if init == "normal" else 0)


def test_state_dict_round_trip_through_timm_checkpoint_path_is_bit_exact(tmp_path):
    torch.manual_seed(0)
    m = timm.create_model("vca_deit_tiny_patch16_224", **SMALL).eval()
    path = tmp_path / "model.safetensors"
    save_file(m.state_dict(), str(path))
    torch.manual_seed(123)  # a different init, overwritten by the checkpoint
    loaded = timm.create_model("vca_deit_tiny_patch16_224", checkpoint_path=str(path), **SMALL).eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert torch.equal(m(x), loaded(x))


def test_state_dict_of_one_variant_does_not_load_silently_into_another(tmp_path):
    m = timm.create_model("vca_deit_tiny_patch16_224", **SMALL)
    other = timm.create_model("vca_deit_tiny_patch16_224", **{**SMALL, "stage1": "diff", "stage2": "diff"})
    with pytest.raises(RuntimeError, match="embed_neg"):
        other.load_state_dict(m.state_dict())


def test_pretrained_weights_do_not_exist_and_say_so():
    with pytest.raises(ValueError, match="no pretrained weights are published"):
        timm.create_model("vca_deit_tiny_patch16_224", pretrained=True)


def test_factory_names_and_errors():
    assert classifier_name("deit_tiny", "mhsa") == "deit_tiny_patch16_224"
    assert classifier_name("deit_small", "vca") == "vca_deit_small_patch16_224"
    assert classifier_name("deit_tiny", "diff") == "diff_deit_tiny_patch16_224"
    with pytest.raises(ValueError, match="unknown model 'deit_huge'"):
        create_classifier("deit_huge", "vca")
    assert classifier_name("pvt_tiny", "vca") == "vca_pvt_tiny"
    assert classifier_name("swin_tiny", "mhsa") == "swin_tiny_patch4_window7_224"
    assert classifier_name("cswin_tiny", "vca") == "vca_cswin_tiny_224"
    with pytest.raises(ValueError, match="unknown attention 'diff' for pvt_tiny"):
        create_classifier("pvt_tiny", "diff")
    with pytest.raises(ValueError, match="unknown attention 'linear'"):
        create_classifier("deit_tiny", "linear")
    with pytest.raises(ValueError, match="contrast_tokens does not apply to attention 'mhsa'"):
        create_classifier("deit_tiny", "mhsa", contrast_tokens=49)
    with pytest.raises(ValueError, match="fixed token grid"):
        create_classifier("deit_tiny", "vca", dynamic_img_size=True)
