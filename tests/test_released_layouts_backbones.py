"""The backbones' released checkpoints (DeiT, Swin, PVT, CSWin, DiT, SiT) against our models, strictly.

The layouts in tests/data/released_layouts were read from the original repositories' model code
(every key of ``model.state_dict()`` in order, with the persistent buffers); the key maps in
``vcarepro.calibration.keymaps.backbones`` must turn our state dict into exactly that layout, and
that layout (filled with distinct random values) into exactly ours, each value on the right key.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from vcarepro.calibration.keymaps.backbones import KEYMAPS
from vcarepro.models import create_classifier
from vcarepro.models.dit import create_dit

LAYOUTS = Path(__file__).parent / "data" / "released_layouts"

CLASSIFIERS = {
    "deit_tiny": "deit_tiny",
    "deit_small": "deit_small",
    "swin_tiny": "swin_tiny",
    "pvt_tiny": "pvt_tiny",
    "cswin_tiny": "cswin_tiny",
}
# released name -> (our DiT arch, learn_sigma); SiT-XL/2's released 256 px file has learn_sigma=True
# (willisma/SiT sample.py: learn_sigma = args.image_size == 256 for the auto-downloaded checkpoint)
DITS = {"dit_s2": ("dit_s2", True), "dit_xl2": ("dit_xl2", True), "sit_xl2": ("dit_xl2", True)}
LARGE = {"dit_xl2", "sit_xl2"}
# buffers the released files carry and our layers recompute: dropped by to_ours, rewritten by to_released
RECOMPUTED = ("relative_position_index", "attn_mask")


def layout(name):
    return json.loads((LAYOUTS / f"{name}.json").read_text())


def build(name, meta=False):
    if meta:
        with torch.device("meta"):
            return build(name)
    if name in CLASSIFIERS:
        return create_classifier(CLASSIFIERS[name], "mhsa")
    arch, learn_sigma = DITS[name]
    return create_dit(arch, "mhsa", learn_sigma=learn_sigma, input_size=32)


def shapes(state):
    return [(k, list(v.shape)) for k, v in state.items()]


def released_random(name, seed=0):
    """The released layout filled with distinct seeded random values (so a swapped key shows)."""
    g = torch.Generator().manual_seed(seed)
    state = {k: torch.randn(shape, generator=g) * 0.02 for k, shape in layout(name)["keys"].items()}
    if name == "swin_tiny":  # the saved index and masks hold Swin-T's values in a released file (the map checks them)
        buffers = KEYMAPS[name].to_released(build(name, meta=False).state_dict())
        state.update({k: buffers[k] for k in state if k.endswith(RECOMPUTED)})
    return state


def params(names):
    return [pytest.param(n, marks=pytest.mark.slow) if n in LARGE else n for n in names]


ALL = list(CLASSIFIERS) + list(DITS)


def test_every_layout_has_a_keymap():
    recorded = sorted(p.stem for p in LAYOUTS.glob("*.json"))
    assert set(ALL) <= set(recorded)
    assert set(ALL) <= set(KEYMAPS)


@pytest.mark.parametrize("name", ALL)
def test_layout_record(name):
    data = layout(name)
    assert set(data) == {"source", "container", "keys"}
    assert len(data["source"].split()) == 3
    assert data["keys"] and all(isinstance(s, list) for s in data["keys"].values())
    km = KEYMAPS[name]
    sd = {"w": torch.zeros(1)}
    if data["container"] is None:
        assert km.unwrap(sd) is sd  # a bare state dict is used as it is
    else:
        assert data["container"] in km.containers
        assert km.unwrap({data["container"]: sd, "optimizer": {}}) is sd


@pytest.mark.parametrize("name", params(ALL))
def test_to_released_gives_the_released_layout(name):
    model = build(name, meta=name in LARGE)
    released = KEYMAPS[name].to_released(model.state_dict())
    assert shapes(released) == list((k, s) for k, s in layout(name)["keys"].items())


@pytest.mark.parametrize("name", list(CLASSIFIERS) + ["dit_s2"])
def test_released_loads_strictly_and_round_trips(name):
    km = KEYMAPS[name]
    released = released_random(name)
    ours = km.to_ours(released)
    model = build(name)
    expected = {k: list(v.shape) for k, v in model.state_dict().items()}
    assert {k: list(v.shape) for k, v in ours.items()} == expected
    model.load_state_dict(ours, strict=True)
    state = model.state_dict()
    for key in state:
        assert torch.equal(state[key], ours[key]), key
    back = km.to_released(state)
    assert list(back) == list(released)
    for key, value in released.items():
        if key.rsplit(".", 1)[-1] in RECOMPUTED:
            continue
        assert torch.equal(back[key], value), key


def test_swin_recomputed_buffers_are_timms():
    """to_released writes relative_position_index / attn_mask with the values our (timm's) blocks use, which are
    the original's (same construction); the masked blocks are the shifted ones of stages 1-3."""
    model = build("swin_tiny")
    back = KEYMAPS["swin_tiny"].to_released(model.state_dict())
    buffers = dict(model.named_buffers())
    masks = [k for k in back if k.endswith("attn_mask")]
    assert masks == [f"layers.{s}.blocks.{b}.attn_mask" for s, d in enumerate((2, 2, 6)) for b in range(1, d, 2)]
    recomputed = [k for k in back if k.rsplit(".", 1)[-1] in RECOMPUTED]
    # only the downsample moved between layouts: the blocks, and their (non-persistent) buffers, keep their names
    assert set(recomputed) == {k for k in buffers if k.rsplit(".", 1)[-1] in RECOMPUTED}
    for key in recomputed:
        assert torch.equal(back[key], buffers[key]), key
    index = back["layers.0.blocks.0.attn.relative_position_index"]
    assert index.dtype == torch.long and index.min() == 0 and index.max() == 13 * 13 - 1
    mask = back["layers.0.blocks.1.attn_mask"]
    assert set(mask.unique().tolist()) == {0.0, -100.0} and not mask[0].any()  # the top-left window is whole


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(LARGE))
def test_large_released_loads_strictly(name):
    """DiT-XL/2 / SiT-XL/2 (675M parameters) on the meta device: names and shapes load strictly, and each
    released tensor comes back on its own key."""
    km = KEYMAPS[name]
    released = {k: torch.empty(s, device="meta") for k, s in layout(name)["keys"].items()}
    ours = km.to_ours(released)
    model = build(name, meta=True)
    model.load_state_dict(ours, strict=True, assign=True)
    assert shapes(model.state_dict()) == shapes(ours)
    back = km.to_released(ours)
    assert list(back) == list(released) and all(back[k] is released[k] for k in released)


def test_sit_and_dit_xl2_share_a_layout():
    assert layout("sit_xl2")["keys"] == layout("dit_xl2")["keys"]
    assert list(layout("sit_xl2")["keys"]) == list(layout("dit_xl2")["keys"])


@pytest.mark.parametrize("name", list(CLASSIFIERS))
def test_classifier_forward_with_released_weights(name):
    model = build(name)
    model.load_state_dict(KEYMAPS[name].to_ours(released_random(name, seed=1)), strict=True)
    model.eval()
    with torch.no_grad():
        logits = model(torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(2)))
    assert logits.shape == (1, 1000) and torch.isfinite(logits).all()


def _dit_inputs(device=None):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(1, 4, 32, 32, generator=g)
    t, y = torch.tensor([500]), torch.tensor([207])
    return tuple(v.to(device) if device else v for v in (x, t, y))


def test_dit_s2_forward_with_released_weights():
    model = build("dit_s2")
    model.load_state_dict(KEYMAPS["dit_s2"].to_ours(released_random("dit_s2", seed=1)), strict=True)
    model.eval()
    with torch.no_grad():
        out = model(*_dit_inputs())
    assert out.shape == (1, 8, 32, 32) and torch.isfinite(out).all()


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(LARGE))
def test_large_forward_shape(name):
    """Shape only (meta device). Ours returns eps and sigma (8 channels); SiT's forward keeps the first 4."""
    model = build(name, meta=True).eval()
    with torch.no_grad():
        out = model(*_dit_inputs("meta"))
    assert out.shape == (1, 8, 32, 32)


@pytest.mark.parametrize(
    "key, shape",
    [("layers.0.blocks.0.attn.relative_position_bias_table", (529, 3)), ("patch_embed.proj.weight", (96, 3, 8, 8))],
)
def test_swin_tensors_timm_would_resample_are_refused_at_another_size(key, shape, one_torch_thread):
    """timm's checkpoint_filter_fn resizes a position table or patch kernel of another size to fit; a released
    Swin-T file that has one is not Swin-T's, so the map refuses it instead."""
    released = released_random("swin_tiny")
    released[key] = torch.zeros(shape)
    with pytest.raises(ValueError, match=f"{key} has shape"):
        KEYMAPS["swin_tiny"].to_ours(released)


def test_swin_saved_buffers_must_be_swin_ts(one_torch_thread):
    released = released_random("swin_tiny")
    key = "layers.1.blocks.1.attn_mask"
    released[key] = torch.zeros_like(released[key])
    with pytest.raises(ValueError, match="attn_mask is not Swin-T's"):
        KEYMAPS["swin_tiny"].to_ours(released)
