"""Key maps for the backbones' own released checkpoints (the originals' ImageNet / DiT / SiT weights).

Each layout (every name and shape, in state-dict order) is recorded in
``tests/data/released_layouts/<name>.json``, read from the original model code:

    deit_tiny / deit_small  facebookresearch/deit models.py deit_{tiny,small}_patch16_224 (timm's
                            VisionTransformer): {'model': sd}; the same names as timm's deit models -> identity.
    swin_tiny               microsoft/Swin-Transformer models/swin_transformer.py SwinTransformer
                            (configs/swin/swin_tiny_patch4_window7_224.yaml): {'model': sd}. to_ours is timm's own
                            swin_transformer.checkpoint_filter_fn (drops the saved relative_position_index /
                            attn_mask buffers, moves layers.i.downsample -> layers.{i+1}.downsample, head -> head.fc);
                            to_released is its inverse and writes the two buffers back with timm's values.
    pvt_tiny                whai362/PVT classification/pvt.py pvt_tiny: main.py takes checkpoint['model'] or the bare
                            state dict. pos_embed{i} / patch_embed{i} / block{i} -> stages.{i-1}.{pos_embed,
                            patch_embed, blocks}; cls_token -> stages.3.cls_token. pos_embed4 (1, 50, 512) carries the
                            class token's slot first, as ours does.
    cswin_tiny              microsoft/CSWin-Transformer models/cswin.py CSWin_64_12211_tiny_224: main.py evaluates
                            with --model-ema (default True), i.e. timm's load_checkpoint(use_ema=True):
                            'state_dict_ema', else 'state_dict'.
                            stage1_conv_embed.{0,2} -> stages.0.embed.{proj,norm};
                            merge{i}.{conv,norm} -> stages.{i}.embed.{proj,norm};
                            stage{s}.{b} -> stages.{s-1}.blocks.{b}, with its qkv / proj -> attn.qkv / attn.proj and
                            attns.{n} -> attn.branches.{n} (branch 0 the vertical stripes, as the original's idx 0).
    dit_s2 / dit_xl2        facebookresearch/DiT models.py DiT_S_2 / DiT_XL_2: a bare EMA state dict (download.py
                            find_model also takes {'ema': ...}); our DiT uses the same names in the same order ->
                            identity.
    sit_xl2                 willisma/SiT models.py SiT_XL_2 with learn_sigma=True (sample.py: learn_sigma for the
                            released 256 px file): the same layout as DiT-XL/2 -> identity. SiT's forward drops the
                            sigma half of the output (x.chunk(2, dim=1)[0]); ours returns both, so a SiT sampler reads
                            channels [:4].
"""

from __future__ import annotations

import functools
import re
from typing import Callable, Dict, Tuple

import torch

from vcarepro.calibration.keymaps import KeyMap, StateDict, identity, renamed


def _ordered(state: StateDict, rank: Callable[[str], Tuple]) -> StateDict:
    """``state`` sorted by ``rank(key)`` (stable: equal ranks keep their order)."""
    return dict(sorted(state.items(), key=lambda item: rank(item[0])))


def _sub(pattern: str, replacement) -> Tuple[re.Pattern, object]:
    return re.compile(pattern), replacement


# --- DeiT / DiT / SiT: same names ---------------------------------------------------------------

DEIT = KeyMap(containers=("model",), to_ours=identity, to_released=identity)
# DiT's download.py find_model: a bare state dict, or {'ema': ...} from its train.py
DIT = KeyMap(containers=("ema",), to_ours=identity, to_released=identity, bare=True)


# --- Swin-T -------------------------------------------------------------------------------------

SWIN_IMG_SIZE, SWIN_PATCH, SWIN_WINDOW = 224, 4, 7  # swin_tiny_patch4_window7_224


@functools.lru_cache(maxsize=None)
def _swin_reference():
    """Our Swin-T on the meta device: the shapes checkpoint_filter_fn compares against (no values, no cost)."""
    from vcarepro.models import create_classifier

    with torch.device("meta"):
        return create_classifier("swin_tiny", "mhsa")


def _swin_to_ours(state: StateDict) -> StateDict:
    """timm's checkpoint_filter_fn, after checking what it would otherwise adapt silently: it resamples a patch
    kernel or a relative-position table of another size to fit the model, and drops the saved index and mask."""
    from timm.models.swin_transformer import checkpoint_filter_fn

    ours = _swin_reference().state_dict()
    for key, value in state.items():
        if key == "patch_embed.proj.weight" or key.endswith("relative_position_bias_table"):
            if key in ours and tuple(value.shape) != tuple(ours[key].shape):
                raise ValueError(f"{key} has shape {tuple(value.shape)}, Swin-T's is {tuple(ours[key].shape)}")
        m = _SWIN_BLOCK.match(key)
        if m and m.group(3) in ("attn.relative_position_index", "attn_mask"):
            index, mask = _swin_block_buffers(
                SWIN_IMG_SIZE // SWIN_PATCH // 2 ** int(m.group(1)), int(m.group(2)) % 2 == 1
            )
            expected = index if m.group(3) == "attn.relative_position_index" else mask
            if expected is None or tuple(value.shape) != tuple(expected.shape) or not torch.equal(value, expected):
                raise ValueError(f"{key} is not Swin-T's (window {SWIN_WINDOW}, {SWIN_IMG_SIZE} px)")
    return checkpoint_filter_fn(dict(state), _swin_reference())


@functools.lru_cache(maxsize=None)
def _swin_block_buffers(grid: int, shifted: bool) -> Tuple[torch.Tensor, object]:
    """(relative_position_index, attn_mask or None) of a Swin block on a grid x grid map, from timm's own block
    (which, like the original, drops the shift when the window covers the map)."""
    from timm.models.swin_transformer import SwinTransformerBlock

    block = SwinTransformerBlock(
        dim=1,
        input_resolution=(grid, grid),
        num_heads=1,
        window_size=SWIN_WINDOW,
        shift_size=SWIN_WINDOW // 2 if shifted else 0,
    )
    mask = block.attn_mask
    return block.attn.relative_position_index.clone(), (None if mask is None else mask.clone())


_SWIN_BLOCK = re.compile(r"^layers\.(\d+)\.blocks\.(\d+)\.(.*)$")
_SWIN_DOWN = re.compile(r"^layers\.(\d+)\.downsample\.(.*)$")
_SWIN_BLOCK_ORDER = (
    "attn_mask",
    "norm1.",
    "attn.relative_position_bias_table",
    "attn.relative_position_index",
    "attn.qkv.",
    "attn.proj.",
    "norm2.",
    "mlp.",
)


def _prefix_rank(rest: str, order) -> int:
    for i, prefix in enumerate(order):
        if rest.startswith(prefix):
            return i
    return len(order)


def _swin_rank(key: str) -> Tuple:
    if key.startswith("patch_embed."):
        return (0,)
    m = _SWIN_BLOCK.match(key)
    if m:
        return (1, int(m.group(1)), 0, int(m.group(2)), _prefix_rank(m.group(3), _SWIN_BLOCK_ORDER))
    m = _SWIN_DOWN.match(key)
    if m:
        return (1, int(m.group(1)), 1, 0, 0 if m.group(2).startswith("reduction.") else 1)
    return (2,) if key.startswith("norm.") else (3,)


def _swin_to_released(state: StateDict) -> StateDict:
    out = renamed(
        state,
        [
            _sub(r"^layers\.(\d+)\.downsample\.", lambda m: f"layers.{int(m.group(1)) - 1}.downsample."),
            _sub(r"^head\.fc\.", "head."),
        ],
    )
    grid0 = SWIN_IMG_SIZE // SWIN_PATCH
    for key in [k for k in out if k.endswith(".attn.relative_position_bias_table")]:
        m = _SWIN_BLOCK.match(key)
        stage, block = int(m.group(1)), int(m.group(2))
        index, mask = _swin_block_buffers(grid0 >> stage, block % 2 == 1)
        prefix = f"layers.{stage}.blocks.{block}."
        out[prefix + "attn.relative_position_index"] = index
        if mask is not None:
            out[prefix + "attn_mask"] = mask
    return _ordered(out, _swin_rank)


SWIN = KeyMap(containers=("model",), to_ours=_swin_to_ours, to_released=_swin_to_released)


# --- PVT v1-Tiny --------------------------------------------------------------------------------


def _pvt_last_stage(state: StateDict, pattern: str) -> int:
    return max(int(m.group(1)) for m in map(re.compile(pattern).match, state) if m)


def _pvt_to_ours(state: StateDict) -> StateDict:
    last = _pvt_last_stage(state, r"^pos_embed(\d+)$") - 1
    return renamed(
        state,
        [
            _sub(r"^pos_embed(\d+)$", lambda m: f"stages.{int(m.group(1)) - 1}.pos_embed"),
            _sub(r"^cls_token$", f"stages.{last}.cls_token"),
            _sub(r"^patch_embed(\d+)\.", lambda m: f"stages.{int(m.group(1)) - 1}.patch_embed."),
            _sub(r"^block(\d+)\.", lambda m: f"stages.{int(m.group(1)) - 1}.blocks."),
        ],
    )


_PVT_STAGE = re.compile(r"^(patch_embed|block)(\d+)\.")


def _pvt_rank(key: str) -> Tuple:
    # pvt.py registers pos_embed{i} and cls_token on the model itself, so they come first
    m = re.match(r"^pos_embed(\d+)$", key)
    if m:
        return (0, int(m.group(1)))
    if key == "cls_token":
        return (1,)
    m = _PVT_STAGE.match(key)
    if m:
        return (2, int(m.group(2)), 0 if m.group(1) == "patch_embed" else 1)
    return (3,) if key.startswith("norm.") else (4,)


def _pvt_to_released(state: StateDict) -> StateDict:
    out = renamed(
        state,
        [
            _sub(r"^stages\.(\d+)\.pos_embed$", lambda m: f"pos_embed{int(m.group(1)) + 1}"),
            _sub(r"^stages\.\d+\.cls_token$", "cls_token"),
            _sub(r"^stages\.(\d+)\.patch_embed\.", lambda m: f"patch_embed{int(m.group(1)) + 1}."),
            _sub(r"^stages\.(\d+)\.blocks\.", lambda m: f"block{int(m.group(1)) + 1}."),
        ],
    )
    return _ordered(out, _pvt_rank)


PVT = KeyMap(containers=("model",), to_ours=_pvt_to_ours, to_released=_pvt_to_released, bare=True)


# --- CSWin-T ------------------------------------------------------------------------------------


def _cswin_to_ours(state: StateDict) -> StateDict:
    def block(m: re.Match, inner: str) -> str:
        return f"stages.{int(m.group(1)) - 1}.blocks.{m.group(2)}.{inner}"

    return renamed(
        state,
        [
            _sub(r"^stage1_conv_embed\.0\.", "stages.0.embed.proj."),
            _sub(r"^stage1_conv_embed\.2\.", "stages.0.embed.norm."),
            _sub(r"^merge(\d+)\.conv\.", r"stages.\1.embed.proj."),
            _sub(r"^merge(\d+)\.norm\.", r"stages.\1.embed.norm."),
            _sub(r"^stage(\d+)\.(\d+)\.attns\.", lambda m: block(m, "attn.branches.")),
            _sub(r"^stage(\d+)\.(\d+)\.(qkv|proj)\.", lambda m: block(m, f"attn.{m.group(3)}.")),
            _sub(r"^stage(\d+)\.(\d+)\.", lambda m: block(m, "")),
        ],
    )


_CSWIN_BLOCK = re.compile(r"^stage(\d+)\.(\d+)\.(.*)$")
_CSWIN_BLOCK_ORDER = ("qkv.", "norm1.", "proj.", "attns.", "mlp.", "norm2.")  # CSWinBlock's registration order


def _cswin_rank(key: str) -> Tuple:
    if key.startswith("stage1_conv_embed."):
        return (0,)
    m = _CSWIN_BLOCK.match(key)
    if m:
        return (2 * int(m.group(1)) - 1, int(m.group(2)), _prefix_rank(m.group(3), _CSWIN_BLOCK_ORDER))
    m = re.match(r"^merge(\d+)\.", key)
    if m:
        return (2 * int(m.group(1)),)
    return (100,) if key.startswith("norm.") else (101,)


def _cswin_to_released(state: StateDict) -> StateDict:
    def block(m: re.Match, inner: str) -> str:
        return f"stage{int(m.group(1)) + 1}.{m.group(2)}.{inner}"

    out = renamed(
        state,
        [
            _sub(r"^stages\.0\.embed\.proj\.", "stage1_conv_embed.0."),
            _sub(r"^stages\.0\.embed\.norm\.", "stage1_conv_embed.2."),
            _sub(r"^stages\.(\d+)\.embed\.proj\.", r"merge\1.conv."),
            _sub(r"^stages\.(\d+)\.embed\.norm\.", r"merge\1.norm."),
            _sub(r"^stages\.(\d+)\.blocks\.(\d+)\.attn\.branches\.", lambda m: block(m, "attns.")),
            _sub(r"^stages\.(\d+)\.blocks\.(\d+)\.attn\.(qkv|proj)\.", lambda m: block(m, f"{m.group(3)}.")),
            _sub(r"^stages\.(\d+)\.blocks\.(\d+)\.", lambda m: block(m, "")),
        ],
    )
    return _ordered(out, _cswin_rank)


CSWIN = KeyMap(
    containers=("state_dict_ema", "state_dict", "model"), to_ours=_cswin_to_ours, to_released=_cswin_to_released
)


KEYMAPS: Dict[str, KeyMap] = {
    "deit_tiny": DEIT,
    "deit_small": DEIT,
    "swin_tiny": SWIN,
    "pvt_tiny": PVT,
    "cswin_tiny": CSWIN,
    "dit_s2": DIT,
    "dit_xl2": DIT,
    "sit_xl2": DIT,
}

__all__ = ["KEYMAPS"]
