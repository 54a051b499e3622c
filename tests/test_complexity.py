"""FLOP counts: VCA is linear in the number of tokens, MHSA quadratic; VCA adds no FLOPs to DeiT-T."""

from __future__ import annotations

import pytest
import timm
import torch
from timm.layers import Attention

import vcarepro.models  # noqa: F401  (registers the models)
from helpers import ROOT
from vcarepro.attention import VisualContrastAttention
from vcarepro.metrics.complexity import count_flops, model_flops

DIM, HEADS = 192, 3  # DeiT-T width
SIDES = (14, 28, 56)  # N = 196, 784, 3136


def attention_flops(layer, n_tokens: int) -> int:
    x = torch.zeros(1, n_tokens, DIM)
    with torch.no_grad():
        return count_flops(lambda: layer(x)).flops


def vca(side: int) -> VisualContrastAttention:
    return VisualContrastAttention(DIM, HEADS, grid_size=side, num_prefix_tokens=0, contrast_tokens=49, qkv_bias=True)


def test_vca_flops_are_linear_in_the_token_count():
    flops = {side * side: attention_flops(vca(side), side * side) for side in SIDES}
    per_token = [f / n for n, f in flops.items()]
    # with a fixed 7x7 contrast grid every term is proportional to N
    assert max(per_token) / min(per_token) == pytest.approx(1.0, abs=1e-9)


def test_mhsa_flops_are_quadratic_in_the_token_count():
    mhsa = Attention(DIM, HEADS, qkv_bias=True)
    linear_part = {}
    flops = {}
    for side in SIDES:
        n = side * side
        flops[n] = attention_flops(mhsa, n)
        linear_part[n] = 2 * n * DIM * (3 * DIM) + 2 * n * DIM * DIM  # qkv + proj
    quadratic = {n: flops[n] - linear_part[n] for n in flops}
    assert quadratic[196] == 2 * 2 * 196 * 196 * DIM  # q k^T and A v
    assert quadratic[3136] / quadratic[196] == pytest.approx(16**2)


def test_vca_is_cheaper_than_mhsa_from_a_few_hundred_tokens_on():
    mhsa = Attention(DIM, HEADS, qkv_bias=True)
    assert attention_flops(vca(56), 3136) < 0.5 * attention_flops(mhsa, 3136)


def test_counter_sees_the_attention_products_under_the_math_backend():
    # the fused CPU kernel is invisible to FlopCounterMode; count_flops must not be
    mhsa = Attention(DIM, HEADS, qkv_bias=True)
    n = 196
    assert attention_flops(mhsa, n) > 2 * n * DIM * 4 * DIM


@pytest.mark.slow
def test_vca_adds_no_flops_to_deit_tiny_at_224():
    base = model_flops(timm.create_model("deit_tiny_patch16_224"), (1, 3, 224, 224))
    with_vca = model_flops(timm.create_model("vca_deit_tiny_patch16_224"), (1, 3, 224, 224))
    assert base.macs == pytest.approx(1.254e9, rel=1e-3)  # DeiT paper: 1.3G "FLOPs" (MACs)
    # the only extra work is the 3x3 depthwise conv; the attention products shrink
    assert with_vca.macs / base.macs == pytest.approx(1.0, abs=0.005)
    assert round(with_vca.macs / 1e9, 1) == round(base.macs / 1e9, 1) == 1.3


@pytest.mark.slow
def test_every_table1_complexity_cell_of_the_lab_layouts_matches_the_paper():
    """The +VCA rows at paper shape (what `dvc repro complexity` writes), within the report's tolerance."""

    import yaml

    from vcarepro.metrics.complexity import model_complexity
    from vcarepro.params.config import compose
    from vcarepro.report.reference import paper_value
    from vcarepro.report.verdicts import MATCHES, exact_verdict

    paper = compose(["scale=paper"])
    reference = yaml.safe_load((ROOT / "data" / "paper_reference.yaml").read_text())
    settings = dict(paper["complexity"], throughput_batch=0)
    tolerance = paper["report"]["complexity_tolerance"]
    checked = {}
    for row in reference["table1"]["rows"]:
        if row["role"] != "vca":
            continue
        figures = model_complexity(paper["models"][paper["cls_runs"][row["run"]]["model"]], settings)
        for key, cell in (("params_m", "params_m"), ("gmacs", "gflops")):
            value = paper_value(row[cell], reference["sources"])
            assert exact_verdict(value, figures[key], tolerance) == MATCHES, (row["model"], key, figures[key])
            checked[(row["model"], key)] = round(figures[key], 2)
    assert checked == {
        ("DeiT-T", "params_m"): 5.97,
        ("DeiT-T", "gmacs"): 1.26,
        ("DeiT-S", "params_m"): 22.56,
        ("DeiT-S", "gmacs"): 4.61,
        ("PVT-T", "params_m"): 11.56,
        ("PVT-T", "gmacs"): 2.05,
        ("Swin-T", "params_m"): 28.55,
        ("Swin-T", "gmacs"): 4.63,
        ("CSwin-T", "params_m"): 20.41,
        ("CSwin-T", "gmacs"): 4.33,
    }
