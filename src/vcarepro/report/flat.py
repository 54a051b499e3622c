"""Nested params as dotted keys, the way `dvc params diff` names them."""
from __future__ import annotations

from typing import Any, Dict


def flatten(d: Any, prefix: str = "") -> Dict[str, Any]:
    if isinstance(d, dict):
        out: Dict[str, Any] = {}
        for k, v in d.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out  # an empty section (the paper's shape: no overrides) contributes no knob
    return {prefix.rstrip("."): d}
