"""The LeapLabTHU lab's released DeiT-T checkpoints (Agent, InLine, Circulant; FLatten released none) against our
models.

The layouts in tests/data/released_layouts/<name>.json were dumped from the original model code
(``model.state_dict()`` of the released DeiT-T configuration); the key maps are
vcarepro.calibration.keymaps.lab. Numerical equivalence with the original layers was checked outside
the test suite (the original code needs the lab's repositories); here the maps are held to the layouts
exactly, to strict loading, to the round trip, and, for Agent Attention's biases (two of which share a
shape), to the official formulas of what each bias adds to which attention map.
"""

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from vcarepro.calibration.keymaps.lab import KEYMAPS
from vcarepro.models import create_classifier

LAYOUTS = Path(__file__).parent / "data" / "released_layouts"
ATTENTIONS = {
    "agent_deit_tiny": "agent",
    "inline_deit_tiny": "inline",
    "circulant_deit_tiny": "circulant",
}
NAMES = sorted(ATTENTIONS)


def layout(name):
    return json.loads((LAYOUTS / f"{name}.json").read_text())


def model(name):
    torch.manual_seed(0)
    return create_classifier(name, ATTENTIONS[name]).eval()


def released_random(name, seed=1):
    """Seeded random tensors in the recorded released layout (norm weights around 1)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for key, shape in layout(name)["keys"].items():
        t = torch.randn(shape, generator=g) * 0.05
        if key.endswith("norm1.weight") or key.endswith("norm2.weight") or key == "norm.weight":
            t = t + 1.0
        out[key] = t
    return out


def test_every_lab_layout_has_a_keymap():
    assert set(KEYMAPS) == set(NAMES)
    for name in NAMES:
        doc = layout(name)
        assert doc["container"] == "model"
        assert KEYMAPS[name].containers == ("model",)
        assert doc["keys"], name


@pytest.mark.parametrize("name", NAMES)
def test_to_released_of_our_model_is_the_recorded_layout(name, one_torch_thread):
    ours = model(name).state_dict()
    released = KEYMAPS[name].to_released(ours)
    expected = layout(name)["keys"]
    assert list(released) == list(expected)  # names and state-dict order
    assert {k: list(v.shape) for k, v in released.items()} == expected
    # nothing is copied or altered on the way: every tensor is one of ours
    ours_ids = {id(v) for v in ours.values()}
    assert all(id(v) in ours_ids for v in released.values())


@pytest.mark.parametrize("name", NAMES)
def test_released_layout_loads_strictly_and_round_trips(name, one_torch_thread):
    km = KEYMAPS[name]
    released = released_random(name)
    saved = {"model": released, "optimizer": {}, "lr_scheduler": {}, "max_accuracy": 0.0, "epoch": 300}
    assert km.unwrap(saved) is released
    assert km.unwrap(released) is released  # a bare state dict is used as it is

    ours_sd = km.to_ours(released)
    net = model(name)
    target = net.state_dict()
    assert list(ours_sd) == list(target)
    assert {k: v.shape for k, v in ours_sd.items()} == {k: v.shape for k, v in target.items()}
    net.load_state_dict(ours_sd, strict=True)

    loaded = net.state_dict()
    for key, value in ours_sd.items():
        assert torch.equal(loaded[key], value), key
    back = km.to_released(loaded)
    assert list(back) == list(released)
    for key, value in released.items():
        assert torch.equal(back[key], value), key

    with torch.no_grad():
        logits = net(torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(2)))
    assert logits.shape == (1, 1000)
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("name", NAMES)
def test_a_wrong_layout_is_refused(name, one_torch_thread):
    """Strict loading catches a missing or misnamed tensor: the map must be complete."""
    released = released_random(name)
    key = next(k for k in released if ".attn." in k)
    broken = dict(released)
    broken[key.replace(".attn.", ".attn.not_")] = broken.pop(key)
    with pytest.raises(RuntimeError):
        model(name).load_state_dict(KEYMAPS[name].to_ours(broken), strict=True)


def test_agent_biases_add_to_the_maps_the_official_layer_adds_them_to(one_torch_thread):
    """agent_deit.py AgentAttention.forward, as recorded: with a 14 x 14 window and one class token,
        agent -> token logits  = [ac_bias | up(an_bias) + ah_bias + aw_bias]            (heads, 49, 1 + 196)
        token -> agent logits  = [ca_bias ; up(na_bias)^T + ha_bias + wa_bias]           (heads, 1 + 196, 49)
    up = bilinear resize of the 7 x 7 grid to 14 x 14 (align_corners=False), the grid row-major.
    an_bias and na_bias have the same shape, so only this tells them apart."""
    released = released_random("agent_deit_tiny", seed=3)
    net = model("agent_deit_tiny")
    net.load_state_dict(KEYMAPS["agent_deit_tiny"].to_ours(released), strict=True)
    heads, n, side = 3, 49, 14
    for block in (0, 11):
        p = lambda short: released[f"blocks.{block}.attn.{short}"]  # noqa: E731
        up_an = F.interpolate(p("an_bias"), size=(side, side), mode="bilinear", align_corners=False)
        up_na = F.interpolate(p("na_bias"), size=(side, side), mode="bilinear", align_corners=False)
        a_to_patch = up_an.reshape(1, heads, n, -1) + (p("ah_bias") + p("aw_bias")).reshape(1, heads, n, -1)
        expected_an = torch.cat([p("ac_bias"), a_to_patch], dim=-1)
        patch_to_a = up_na.reshape(1, heads, n, -1).permute(0, 1, 3, 2) + (p("ha_bias") + p("wa_bias")).reshape(
            1, heads, -1, n
        )
        expected_na = torch.cat([p("ca_bias"), patch_to_a], dim=-2)
        got_an, got_na = net.blocks[block].attn.position_biases()
        torch.testing.assert_close(got_an, expected_an, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(got_na, expected_na, rtol=1e-6, atol=1e-6)


def test_released_local_convolutions_land_on_ours(one_torch_thread):
    """The depthwise convolutions keep their official tensors: Agent's dwc (3x3, one kernel per channel),
    InLine's residual convolution, Circulant's per-block cpe."""
    cases = [
        ("agent_deit_tiny", "blocks.4.attn.dwc.weight", lambda m: m.blocks[4].attn.local_conv.weight),
        ("circulant_deit_tiny", "blocks.4.cpe.weight", lambda m: m.blocks[4].cpe.weight),
        ("inline_deit_tiny", "blocks.4.attn.residual.2.weight", lambda m: m.blocks[4].attn.residual[2].weight),
    ]
    for name, key, ours in cases:
        released = released_random(name, seed=4)
        net = model(name)
        net.load_state_dict(KEYMAPS[name].to_ours(released), strict=True)
        assert torch.equal(ours(net).detach(), released[key]), (name, key)
