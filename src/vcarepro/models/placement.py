"""Where the compared attention enters a hierarchical backbone: one kind and one token count per stage.

The layout is a string with one letter per stage, as in the lab's Agent Attention code
(LeapLabTHU/Agent-Attention ``agent_transformer/cfgs/*.yaml``, ``MODEL.AGENT.ATTN_TYPE``):
``A`` puts the compared attention (here VCA) in every block of the stage, ``B`` keeps the
backbone's own attention (PVT's spatial reduction, Swin's windows, CSWin's stripes).
``contrast_tokens`` gives one count for every stage or one per stage (the lab's
``MODEL.AGENT.NUM``, e.g. 9-16-49-49); a ``B`` stage ignores its count.
"""
from __future__ import annotations

from typing import List, Sequence, Tuple, Union

from .deit import VCA_OPTIONS
from vcarepro.errors import BadInput

ContrastTokens = Union[int, Sequence[int], Sequence[Union[int, Sequence[int]]]]

COMPARED, OWN = "A", "B"

# What a VCA hierarchical model accepts beyond its backbone's arguments; a baseline refuses them.
HIERARCHICAL_VCA_OPTIONS = (*VCA_OPTIONS, "attn_layout")


def attention_layout(layout: str, num_stages: int) -> List[bool]:
    """``"AAAB"`` -> [True, True, True, False]: whether each stage uses the compared attention."""
    if not isinstance(layout, str) or len(layout) != num_stages or set(layout) - {COMPARED, OWN}:
        raise BadInput(f"attn_layout={layout!r} must be {num_stages} letters, one per stage: {COMPARED} for the "
                         f"compared attention, {OWN} for the backbone's own (e.g. {'A' * (num_stages - 1) + 'B'!r}).")
    return [letter == COMPARED for letter in layout]


def per_stage(value: ContrastTokens, num_stages: int) -> List[Union[int, Tuple[int, int]]]:
    """One contrast-token setting for all stages (49, (7, 7)) or one per stage ((9, 16, 49, 49), ((3, 3), ...))."""
    if isinstance(value, int):
        return [value] * num_stages
    items = list(value)
    if len(items) == 2 and all(isinstance(v, int) for v in items) and num_stages != 2:
        return [tuple(items)] * num_stages  # an (h, w) grid shared by all stages
    if len(items) != num_stages:
        raise BadInput(f"contrast_tokens needs one value per stage ({num_stages}), got {value!r}.")
    return items
