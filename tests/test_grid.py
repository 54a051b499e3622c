"""The token-grid helpers and the shared attention preamble (attention/grid.py, issue 27).

The layers' own tests specify what each layer computes; these specify what grid.py promises
every layer: one place for the helpers, and a preamble that is timm's ``Attention``'s.
"""

from __future__ import annotations

import ast

import pytest
import torch
import torch.nn as nn

from helpers import ROOT
from vcarepro.attention import build_attention
from vcarepro.attention.grid import GridAttention, token_grid, value_grid
from vcarepro.core.errors import BadInput

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SRC = ROOT / "src" / "vcarepro"
DIM, HEADS, GRID = 24, 2, (3, 4)
# the head-split layers: every grid-aware one but circulant, which splits no heads (one kernel per channel)
HEAD_SPLIT = {"vca": {"contrast_tokens": 4}, "agent": {"agent_tokens": 4}, "flatten": {}, "inline": {}, "mhsa+dwc": {}}


def make(name: str, prefix: int = 1, qk_norm: bool = False) -> nn.Module:
    torch.manual_seed(0)
    return (
        build_attention(
            name,
            DIM,
            HEADS,
            grid_size=GRID,
            num_prefix_tokens=prefix,
            qkv_bias=True,
            qk_norm=qk_norm,
            norm_layer=nn.LayerNorm if qk_norm else None,
            options=HEAD_SPLIT[name],
        )
        .double()
        .eval()
    )


@pytest.mark.parametrize("option", ["contrast_tokens", "agent_tokens"])
def test_token_grid_takes_a_square_count_or_an_explicit_grid_and_names_the_option_it_refuses(option):
    assert token_grid(49, option) == (7, 7)
    assert token_grid((2, 3), option) == (2, 3)
    for count in (50, 0, -4):
        with pytest.raises(BadInput, match=rf"{option}={count} is not a square number"):
            token_grid(count, option)
    with pytest.raises(BadInput, match=rf"{option}=\(0, 3\) has an empty side"):
        token_grid((0, 3), option)


def test_value_grid_lays_the_patch_values_out_as_an_image_with_qkv_channel_order():
    B, heads, d, (H, W), P = 2, 3, 4, GRID, 1
    v = torch.randn(B, heads, P + H * W, d)
    image = value_grid(v, GRID, P)
    assert image.shape == (B, heads * d, H, W)
    for head in range(heads):
        for j in range(d):
            assert torch.equal(image[:, head * d + j].flatten(1), v[:, head, P:, j])


@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize("name", sorted(HEAD_SPLIT))
def test_each_head_split_layer_opens_with_timms_attention_preamble(name, qk_norm):
    m = make(name, qk_norm=qk_norm)
    assert isinstance(m, GridAttention)
    x = torch.randn(2, 1 + GRID[0] * GRID[1], DIM, dtype=torch.float64)
    q, k, v = m._qkv_heads(x)
    # timm's Attention: one Linear to 3C, channels ordered (q|k|v, head, d), then the per-head norms
    qkv = x @ m.qkv.weight.T + m.qkv.bias
    parts = qkv.reshape(2, -1, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
    norm_q, norm_k = (m.q_norm, m.k_norm) if qk_norm else (nn.Identity(), nn.Identity())
    torch.testing.assert_close(q, norm_q(parts[0]))
    torch.testing.assert_close(k, norm_k(parts[1]))
    torch.testing.assert_close(v, parts[2])
    # the shared constructor keeps timm's parameter names
    keys = set(m.state_dict())
    assert {"qkv.weight", "qkv.bias"} <= keys
    assert ({"q_norm.weight", "k_norm.weight"} <= keys) == qk_norm


@pytest.mark.parametrize("prefix", [0, 1, 2])
def test_the_local_term_reaches_the_patch_tokens_only(prefix):
    m = make("mhsa+dwc", prefix)
    out = torch.randn(2, prefix + GRID[0] * GRID[1], DIM, dtype=torch.float64)
    local = torch.randn(2, GRID[0] * GRID[1], DIM, dtype=torch.float64)
    added = m._add_local(out, local)
    assert torch.equal(added[:, :prefix], out[:, :prefix])
    assert torch.equal(added[:, prefix:], out[:, prefix:] + local)


def test_the_depthwise_local_term_is_the_convolution_of_the_value_grid():
    m = make("vca")
    v = torch.randn(2, HEADS, 1 + GRID[0] * GRID[1], DIM // HEADS, dtype=torch.float64)
    expected = m.local_conv(value_grid(v, GRID, 1)).flatten(2).transpose(1, 2)
    assert torch.equal(m._local(v), expected)


def test_the_grid_helpers_are_imported_from_grid_not_from_a_layer():
    """One place for each helper: no module of the package takes a grid helper from vca.py (or redefines one)."""
    grid_names = {
        node.name
        for node in ast.parse((SRC / "attention" / "grid.py").read_text()).body
        if isinstance(node, (ast.FunctionDef, ast.ClassDef))
    }
    for path in SRC.rglob("*.py"):
        if path.name == "grid.py" and path.parent.name == "attention":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("vca"):
                stray = {a.name for a in node.names} & grid_names
                assert not stray, (
                    f"{path.relative_to(SRC)} imports {sorted(stray)} from {node.module}; use attention.grid"
                )
        defined = {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
        assert not defined & grid_names, f"{path.relative_to(SRC)} redefines {sorted(defined & grid_names)}"
