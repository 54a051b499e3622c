"""Key maps for the LeapLabTHU lab's released DeiT-T checkpoints of its sibling attentions.

FLatten has none: the FLatten-Transformer repository has no DeiT model, config or checkpoint (its README
lists PVT, Swin and CSwin models only), so there is nothing to calibrate its DeiT-T row against.

Every lab repository is built on the Swin codebase: ``utils.py`` ``save_checkpoint`` /
``save_checkpoint_new`` write ``{'model': model_without_ddp.state_dict(), 'optimizer', 'lr_scheduler',
'max_accuracy', 'epoch', 'config'}``, and ``load_checkpoint`` reads ``checkpoint['model']`` (with
``strict=False``). So the container is ``model``; a file that is the bare state dict is used as it is.

All three layouts carry the same tensors with the same shapes as our models (recorded in
``tests/data/released_layouts/<name>.json``); the maps rename and, for ``to_released``, restore the
released key order (a state dict's order is that of module registration, which differs in two places):

    agent_deit_tiny      Agent-Attention agent_transformer/models/agent_deit.py agent_deit_tiny
                         (cfgs/agent_deit_t.yaml: AGENT.NUM 49-49-49-49, window img_size // patch_size = 14):
                         attn.{an,na,ah,aw,ha,wa,ac,ca}_bias and attn.dwc -> our OFFICIAL_NAMES
                         (attention/agent.py); released order has dwc after proj.
    inline_deit_tiny     InLine models/inline_deit.py inline_deit_tiny (6 heads): identical names; released
                         order has attn.proj before attn.residual.
    circulant_deit_tiny  Circulant-Attention models/ca_deit.py ca_deit_tiny: identical names; released
                         order has blocks.N.cpe first in each block (ours registers it last).
"""

from __future__ import annotations

import re
from typing import Dict, Sequence

from vcarepro.calibration.keymaps import KeyMap, StateDict, identity, renamed

CONTAINERS = ("model",)

_BLOCK = re.compile(r"^(blocks\.\d+\.)(.*)$")


def _block_ordered(state: StateDict, order: Sequence[str]) -> StateDict:
    """``state`` with the keys inside each ``blocks.N.`` group sorted by the first entry of ``order`` that
    prefixes their in-block name (a stable sort; names no entry prefixes keep their place at the end).
    Keys outside the blocks keep their positions relative to the block groups."""

    def rank(rest: str) -> int:
        for i, prefix in enumerate(order):
            if rest.startswith(prefix):
                return i
        return len(order)

    out: Dict[str, object] = {}
    pending: list = []  # (rank, index, key) of the current block group
    current = None

    def flush() -> None:
        for _, _, key in sorted(pending):
            out[key] = state[key]
        pending.clear()

    for index, key in enumerate(state):
        match = _BLOCK.match(key)
        group = match.group(1) if match else None
        if group != current:
            flush()
            current = group
        if match:
            pending.append((rank(match.group(2)), index, key))
        else:
            out[key] = state[key]
    flush()
    return out  # type: ignore[return-value]


# --- Agent-DeiT-T -------------------------------------------------------------------------------
# agent_deit.py AgentAttention -> attention/agent.py AgentAttention (OFFICIAL_NAMES there); same shapes:
# an_bias / na_bias (heads, 49, 7, 7), ah (1, heads, 49, 14, 1), aw (1, heads, 49, 1, 14),
# ha (1, heads, 14, 1, 49), wa (1, heads, 1, 14, 49), ac (1, heads, 49, 1), ca (1, heads, 1, 49), dwc 3x3 depthwise.
_AGENT_NAMES = {
    "an_bias": "agent_patch_bias",
    "na_bias": "patch_agent_bias",
    "ah_bias": "agent_row_bias",
    "aw_bias": "agent_col_bias",
    "ha_bias": "row_agent_bias",
    "wa_bias": "col_agent_bias",
    "ac_bias": "agent_prefix_bias",
    "ca_bias": "prefix_agent_bias",
    "dwc": "local_conv",
}
_AGENT_TO_OURS = [
    (re.compile(rf"^(blocks\.\d+\.attn\.){old}(\.|$)"), rf"\g<1>{new}\g<2>") for old, new in _AGENT_NAMES.items()
]
_AGENT_TO_RELEASED = [
    (re.compile(rf"^(blocks\.\d+\.attn\.){new}(\.|$)"), rf"\g<1>{old}\g<2>") for old, new in _AGENT_NAMES.items()
]
# in-block order of each layout (module registration order)
_AGENT_OURS_ORDER = (
    "norm1.",
    "attn.agent_patch_bias",
    "attn.patch_agent_bias",
    "attn.agent_row_bias",
    "attn.agent_col_bias",
    "attn.row_agent_bias",
    "attn.col_agent_bias",
    "attn.agent_prefix_bias",
    "attn.prefix_agent_bias",
    "attn.qkv.",
    "attn.local_conv.",
    "attn.proj.",
    "norm2.",
    "mlp.",
)
_AGENT_RELEASED_ORDER = (
    "norm1.",
    "attn.an_bias",
    "attn.na_bias",
    "attn.ah_bias",
    "attn.aw_bias",
    "attn.ha_bias",
    "attn.wa_bias",
    "attn.ac_bias",
    "attn.ca_bias",
    "attn.qkv.",
    "attn.proj.",
    "attn.dwc.",
    "norm2.",
    "mlp.",
)


def agent_to_ours(state: StateDict) -> StateDict:
    return _block_ordered(renamed(state, _AGENT_TO_OURS), _AGENT_OURS_ORDER)


def agent_to_released(state: StateDict) -> StateDict:
    return _block_ordered(renamed(state, _AGENT_TO_RELEASED), _AGENT_RELEASED_ORDER)


# --- InLine-DeiT-T -----------------------------------------------------------------------------------
# inline_deit.py InLineAttention: qkv, proj, residual.0 / residual.2 (grouped Conv1d, 6 groups), the names and
# shapes of attention/inline.py; only the registration order differs (ours: qkv, residual, proj).
_INLINE_OURS_ORDER = ("norm1.", "attn.qkv.", "attn.residual.", "attn.proj.", "norm2.", "mlp.")
_INLINE_RELEASED_ORDER = ("norm1.", "attn.qkv.", "attn.proj.", "attn.residual.", "norm2.", "mlp.")


def inline_to_ours(state: StateDict) -> StateDict:
    return _block_ordered(identity(state), _INLINE_OURS_ORDER)


def inline_to_released(state: StateDict) -> StateDict:
    return _block_ordered(identity(state), _INLINE_RELEASED_ORDER)


# --- CA-DeiT-T ------------------------------------------------------------------------------------
# ca_deit.py Block registers cpe before norm1; ours (models/family.py ConvPositionBlock) after mlp.
_CIRCULANT_OURS_ORDER = ("norm1.", "attn.", "norm2.", "mlp.", "cpe.")
_CIRCULANT_RELEASED_ORDER = ("cpe.", "norm1.", "attn.", "norm2.", "mlp.")


def circulant_to_ours(state: StateDict) -> StateDict:
    return _block_ordered(identity(state), _CIRCULANT_OURS_ORDER)


def circulant_to_released(state: StateDict) -> StateDict:
    return _block_ordered(identity(state), _CIRCULANT_RELEASED_ORDER)


KEYMAPS: Dict[str, KeyMap] = {
    "agent_deit_tiny": KeyMap(CONTAINERS, agent_to_ours, agent_to_released),
    "inline_deit_tiny": KeyMap(CONTAINERS, inline_to_ours, inline_to_released),
    "circulant_deit_tiny": KeyMap(CONTAINERS, circulant_to_ours, circulant_to_released),
}
