"""Gather everything the report shows from files on disk."""
from __future__ import annotations

import base64
import csv
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from ..provenance import Stale, check


@dataclass
class RunResult:
    branch: str
    name: str
    metrics: Optional[Dict[str, float]]
    curves: Dict[str, Dict[int, List[tuple]]] = field(default_factory=dict)  # metric -> seed -> [(step, value)]
    grids: Dict[int, str] = field(default_factory=dict)                       # seed -> data URI
    # set where metrics.json was not produced by the current params: then metrics, curves and grids are empty
    stale: Optional[Stale] = None


def read_json(path: Path) -> Optional[Dict[str, Any]]:
    return json.loads(path.read_text()) if path.is_file() else None


def read_curves(live_dir: Path) -> Dict[str, Dict[int, List[tuple]]]:
    """dvclive logs ``plots/metrics/seed_<s>/<group>/<name>.tsv`` -> {'<group>/<name>': {seed: [(step, value)]}}."""
    curves: Dict[str, Dict[int, List[tuple]]] = {}
    root = live_dir / "plots" / "metrics"
    for tsv in sorted(root.glob("seed_*/**/*.tsv")):
        rel = tsv.relative_to(root)
        seed = int(rel.parts[0].removeprefix("seed_"))
        metric = "/".join(rel.parts[1:])[: -len(".tsv")]
        with tsv.open(newline="") as f:
            rows = list(csv.DictReader(f, delimiter="\t"))
        value_key = rel.stem
        curves.setdefault(metric, {})[seed] = [(int(r["step"]), float(r[value_key])) for r in rows]
    return curves


def png_data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def collect_runs(runs_root: Path, branch: str, names: List[str],
                 params: Optional[Dict[str, Any]] = None) -> Dict[str, RunResult]:
    """Each run's files; with ``params``, a run whose record (provenance.json) disagrees with them is
    collected as stale, without its numbers, so nothing downstream can show or compute with them."""
    results = {}
    for name in names:
        root = runs_root / branch / name
        stale = None if params is None else check(root, params, branch, name)
        if stale is not None:
            results[name] = RunResult(branch, name, None, stale=stale)
            continue
        result = RunResult(branch, name, read_json(root / "metrics.json"), read_curves(root / "live"))
        for grid in sorted((root / "samples").glob("grid_seed_*.png")):
            result.grids[int(grid.stem.removeprefix("grid_seed_"))] = png_data_uri(grid)
        results[name] = result
    return results
