"""The contract every grid attention of the family keeps, whatever its equations: VCA, Agent, FLatten, InLine,
Circulant and the two depthwise-term controls, each built as a run builds it (``build_attention``). The layers' own
files hold each to its paper's equations; timm's MHSA and differential attention keep timm's contract."""

from __future__ import annotations

import pytest
import torch

from helpers import attention_path
from vcarepro.attention import build_attention
from vcarepro.core.choices import BENCH_LAYERS, POOLED_TOKEN_OPTION
from vcarepro.core.errors import BadInput
from vcarepro.tools.bench.attention_cost import _VARIANTS

GRID_LAYERS = [name for name in BENCH_LAYERS if name not in ("mhsa", "diff")]
DIM, HEADS, SIDE = 24, 2, 4


def layer(name: str, prefix: int, dtype=torch.float64) -> torch.nn.Module:
    attention, options = _VARIANTS.get(name, (name, {}))
    options = dict(options)
    if attention in POOLED_TOKEN_OPTION:
        options[POOLED_TOKEN_OPTION[attention]] = 4
    torch.manual_seed(0)
    built = build_attention(attention, DIM, HEADS, grid_size=SIDE, num_prefix_tokens=prefix, qkv_bias=True,
                            options=options)  # fmt: skip
    return built.to(dtype)


def tokens(prefix: int, extra: int = 0, dtype=torch.float64) -> torch.Tensor:
    return torch.randn(2, prefix + SIDE * SIDE + extra, DIM, generator=torch.Generator().manual_seed(1), dtype=dtype)


def test_the_family_is_every_grid_layer_the_bench_can_time():
    assert GRID_LAYERS == ["vca", "agent", "flatten", "inline", "circulant", "mhsa+dwc", "vca-dwc"]


@pytest.mark.parametrize("prefix", [0, 1])
@pytest.mark.parametrize("name", GRID_LAYERS)
def test_tokens_in_tokens_out(name, prefix):
    m, x = layer(name, prefix), tokens(prefix)
    with torch.no_grad():
        out = m(x)
    assert out.shape == x.shape and out.dtype == x.dtype


# timm's fused-attention switch (SDPA, or each softmax map materialised) where a layer has softmax maps; the linear
# layers (FLatten, InLine, Circulant) have one path, held to their equations in their own files
SWITCHED = ["vca", "agent", "mhsa+dwc", "vca-dwc"]


def test_the_layers_with_softmax_maps_have_timms_fused_attention_switch():
    assert [name for name in GRID_LAYERS if hasattr(layer(name, 0), "fused_attn")] == SWITCHED


@pytest.mark.parametrize("prefix", [0, 1])
@pytest.mark.parametrize("name", SWITCHED)
def test_fused_and_materialised_attention_agree(name, prefix):
    m, x = layer(name, prefix), tokens(prefix)
    with torch.no_grad():
        torch.testing.assert_close(attention_path(m, True)(x), attention_path(m, False)(x), rtol=1e-8, atol=1e-8)


@pytest.mark.parametrize("name, fused", [(n, True) for n in GRID_LAYERS] + [(n, False) for n in SWITCHED])
def test_gradients_reach_every_parameter(name, fused):
    m = layer(name, 1, torch.float32).train()
    attention_path(m, fused)(tokens(1, dtype=torch.float32)).square().mean().backward()
    for param, p in m.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, f"{name}: {param} received no gradient"


@pytest.mark.parametrize("kw", [dict(attn_mask=torch.zeros(1)), dict(is_causal=True)], ids=["mask", "causal"])
@pytest.mark.parametrize("name", GRID_LAYERS)
def test_masks_are_refused(name, kw):
    with pytest.raises(BadInput, match="does not support attention masks"):
        layer(name, 1)(tokens(1), **kw)


@pytest.mark.parametrize("name", GRID_LAYERS)
def test_a_token_count_that_is_not_prefix_plus_grid_is_refused(name):
    with pytest.raises(BadInput, match=r"got 18 tokens but expects 1 prefix \+ 4x4 grid = 17"):
        layer(name, 1)(tokens(1, extra=1))
