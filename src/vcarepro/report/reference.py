"""The paper's numbers (data/paper_reference.yaml), each a [value, source] pair."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, Optional

import yaml

from vcarepro.core.errors import BadInput, MissingInput


@dataclass(frozen=True)
class PaperValue:
    value: Optional[float]
    source: Optional[str]
    # False where the source is second-hand (data/paper_reference.yaml `unverified`): not checked against the paper
    verified: bool = True

    @property
    def available(self) -> bool:
        return self.value is not None


def paper_value(entry: Any, sources: Dict[str, str], unverified: Iterable[str] = ()) -> PaperValue:
    """``[value, source]`` as a PaperValue; a value from a source in ``unverified`` is marked so."""
    if entry is None:
        return PaperValue(None, None)
    if not (isinstance(entry, (list, tuple)) and len(entry) == 2):
        raise BadInput(f"paper reference entry {entry!r} must be [value, source]; fix data/paper_reference.yaml.")
    value, source = entry
    if (value is None) != (source is None):
        raise BadInput(f"paper reference entry {entry!r} needs both a value and a source, or neither.")
    if source is not None and source not in sources:
        raise BadInput(
            f"paper reference source {source!r} is not one of {', '.join(sources)}; "
            f"add it under sources in data/paper_reference.yaml."
        )
    return PaperValue(None if value is None else float(value), source, source not in set(unverified))


def load_reference(path: str | Path) -> Dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise MissingInput(f"{path} is missing; it ships with the repository (git checkout {path}).")
    ref = yaml.safe_load(path.read_text())
    for key in ("sources", "unverified", "table1", "table2", "fid_protocol", "table3", "table4", "family", "claims"):
        if key not in ref:
            raise BadInput(f"{path} has no '{key}' section; restore it from git.")
    return ref


def unverified_sources(ref: Dict[str, Any]) -> list:
    """The source codes whose values are second-hand (not checked against the paper's text)."""
    codes = list(ref.get("unverified") or [])
    unknown = [c for c in codes if c not in ref["sources"]]
    if unknown:
        raise BadInput(
            f"unverified lists {', '.join(unknown)}, which sources does not define; fix data/paper_reference.yaml."
        )
    return codes
