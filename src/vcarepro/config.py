"""Reading ``params.yaml``: the single source of every knob a stage uses."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict

import yaml


def load_params(path: str | Path = "params.yaml") -> Dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found; run the stage from the repository root, where params.yaml lives.")
    with path.open() as f:
        params = yaml.safe_load(f) or {}
    if not isinstance(params, dict):
        raise ValueError(f"{path} must hold a mapping of parameter sections, not {type(params).__name__}.")
    return params


def section(params: Dict[str, Any], name: str) -> Any:
    try:
        return params[name]
    except KeyError:
        raise KeyError(f"params.yaml has no '{name}' section; add it (see README, 'Parameters').") from None
