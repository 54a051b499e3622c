"""How each released checkpoint's state dict maps onto this project's layers.

A ``KeyMap`` knows a released file's container (which top-level entry holds the weights)
and two pure functions over state dicts: ``to_ours`` (released layout -> the names and shapes
our model's ``load_state_dict(strict=True)`` takes) and ``to_released`` (the inverse, used to
write stand-in checkpoints in the released layout for the smoke scale and the tests).
Released buffers that our layers recompute (e.g. Swin's ``relative_position_index``) are
dropped by ``to_ours`` and written back by ``to_released``.

The released layouts themselves (every name and shape, read from the original repositories'
model code) are data in ``tests/data/released_layouts``; the tests hold ``to_released`` of our
model's state dict to them exactly, and ``to_ours`` of them to our model strictly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

import torch

StateDict = Dict[str, torch.Tensor]


@dataclass(frozen=True)
class KeyMap:
    # entries of the saved object tried in order for the state dict ("model", "state_dict_ema", "ema", ...);
    # a file that is itself the state dict matches none of them and is used as it is
    containers: Tuple[str, ...]
    to_ours: Callable[[StateDict], StateDict]
    to_released: Callable[[StateDict], StateDict]
    # the released file is the state dict itself (DiT's, SiT's, PVT's); otherwise it sits under containers[0]
    bare: bool = False

    def wrap(self, state: StateDict):
        """``state`` saved as the released file saves it (for the stand-ins)."""
        return state if self.bare else {self.containers[0]: state}

    def unwrap(self, saved) -> StateDict:
        """The state dict inside a loaded checkpoint object."""
        return self.find(saved)[1]

    def find(self, saved) -> Tuple[Optional[str], StateDict]:
        """(the entry the state dict was found under, None for a bare file; the state dict)."""
        if isinstance(saved, dict):
            for key in self.containers:
                if key in saved and isinstance(saved[key], dict):
                    return key, saved[key]
        return None, saved

    def released_container(self) -> Optional[str]:
        """Where the released file keeps its weights (None: the file is the state dict)."""
        return None if self.bare else self.containers[0]


def identity(state: StateDict) -> StateDict:
    return dict(state)


def renamed(state: StateDict, rules) -> StateDict:
    """``state`` with each key rewritten by the first matching ``(compiled_regex, replacement)`` rule."""
    out = {}
    for key, value in state.items():
        for pattern, replacement in rules:
            new, n = pattern.subn(replacement, key)
            if n:
                key = new
                break
        out[key] = value
    return out
