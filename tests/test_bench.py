"""Benchmarks print figures; these tests check that what they measure is measured right."""
from __future__ import annotations

import torch
import torch.nn as nn

from vcarepro.attention import VisualContrastAttention
from vcarepro.bench.suite import bench_attention_memory, saved_activation_bytes


def test_activation_memory_counts_what_autograd_keeps_and_not_the_weights():
    layer = nn.Linear(16, 32)
    x = torch.randn(4, 10, 16)
    assert saved_activation_bytes(layer, x) == 4 * 10 * 16 * 4  # a linear layer keeps its input only
    act = nn.Sequential(nn.Linear(16, 32), nn.GELU())
    assert saved_activation_bytes(act, x) == (4 * 10 * 16 + 4 * 10 * 32) * 4  # and GELU its own input


def test_vca_keeps_activation_memory_linear_in_the_token_count(one_torch_thread):
    rows = bench_attention_memory((7, 14, 28), batch=2, dim=48, heads=3, contrast_tokens=49)
    vca = {r["tokens"]: r["saved_mib"] for r in rows if r["layer"] == "vca"}
    assert vca[784] / vca[49] < 16 * 1.1  # 16x the tokens, at most ~16x the memory: no N x N map is kept
    assert vca[784] / vca[196] < 4 * 1.1


def test_vca_compiles_as_one_graph_and_matches_eager(one_torch_thread):
    torch.manual_seed(0)
    layer = VisualContrastAttention(48, 3, grid_size=14, num_prefix_tokens=1, contrast_tokens=49, qkv_bias=True)
    x = torch.randn(2, 1 + 14 * 14, 48, requires_grad=True)
    compiled = torch.compile(layer, fullgraph=True, backend="eager")  # fullgraph: a graph break is an error
    torch.testing.assert_close(compiled(x), layer(x))
    compiled(x).sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
