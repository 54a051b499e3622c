"""The report's tables as CSV and Markdown files beside the HTML, for papers and pull requests."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

import pandas as pd

from vcarepro.core.io import write_bytes

CELL_KEYS = ("paper", "ours", "scale", "diff", "verdict")  # scale: where ours was measured (embedded, smoke, ...)


def flatten_row(row: Dict[str, Any]) -> Dict[str, Any]:
    """A table row whose metric cells are dicts (paper, source, ours, diff, verdict) as flat columns."""
    flat: Dict[str, Any] = {}
    for key, value in row.items():
        if isinstance(value, dict) and "verdict" in value:
            for part in CELL_KEYS:
                flat[f"{key} {part}"] = value.get(part)
            flat[f"{key} source"] = value.get("source")
            flat[f"{key} unverified"] = value.get("unverified")
            if "statistic" in value and key == "top1":
                flat[f"{key} statistic"] = value["statistic"]
        elif isinstance(value, list) and all(isinstance(v, str) for v in value):
            flat[key] = "; ".join(value)  # e.g. a row's convergence flags
        elif not isinstance(value, (dict, list)):
            flat[key] = value
    return flat


def write_tables(tables: Dict[str, List[Dict[str, Any]]], out_dir: str | Path) -> List[Path]:
    """``out_dir/<name>.csv`` and ``<name>.md`` for every non-empty table; returns the paths written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, rows in tables.items():
        if not rows:
            continue
        frame = pd.DataFrame.from_records([flatten_row(r) for r in rows]).astype(object).fillna("")
        write_bytes(out_dir / f"{name}.csv", frame.to_csv(index=False).encode("utf-8"))  # each whole or as it was
        write_bytes(out_dir / f"{name}.md", (frame.to_markdown(index=False) + "\n").encode("utf-8"))
        written += [out_dir / f"{name}.csv", out_dir / f"{name}.md"]
    return written


def records(rows: List[Any]) -> List[Dict[str, Any]]:
    """A table's rows as the records the exports write: a typed row's ``as_dict``, a record as it is."""
    return [row.as_dict() if hasattr(row, "as_dict") else row for row in rows]
