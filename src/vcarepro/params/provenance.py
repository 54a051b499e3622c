"""What produced a run's numbers: the record an evaluation stage writes beside ``metrics.json``.

:func:`run_provenance` builds it for both the stage and the report, so they compare like with like
(docs/pipeline.md, "Provenance and staleness"). It is its own file, not entries of ``metrics.json``: DVC
would show every nested entry as a metric (a learning rate "changed") and drop lists (the seeds).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from vcarepro.core.io import write_json
from vcarepro.core.recipes import input_path
from vcarepro.params.config import flatten
from vcarepro.params.runs import cls_run, gen_run, run_paths

PROVENANCE_FILE = "provenance.json"
DIGEST_KEY = "metrics_sha256"  # of the metrics.json the record vouches for (written just before it)


def run_provenance(params: Dict[str, Any], branch: str, name: str) -> Dict[str, Any]:
    """Everything in params that defines run ``name``'s numbers, as JSON values.

    Scale, run, model (name and spec), recipe (the named classification recipe with the scale's
    overrides and the input path it trains through, or the generation recipe with the run's, plus
    sampling and the evaluation settings), seeds and shape.
    """
    entry = params[f"{branch}_runs"][name]
    if branch == "cls":
        run = cls_run(params, name)
        recipe = run.recipe.model_dump(exclude_unset=True)
        defines = {"recipe_name": run.recipe_name, "recipe": recipe, "input_path": input_path(run.recipe)}
    elif branch == "gen":
        run = gen_run(params, name)
        defines = {
            "objective": run.objective,
            "recipe": run.recipe.model_dump(exclude_unset=True),
            "sampling": run.sampling,
            "evaluation": {
                **params.get("eval_gen", {}),
                "fid_extractor": params.get("prepare_gen", {}).get("fid_extractor"),
            },
        }
    else:
        raise ValueError(f"branch must be 'cls' or 'gen', not {branch!r}")
    record = {
        "scale": params.get("scale"),
        "branch": branch,
        "run": name,
        "model_name": entry["model"],
        "model": run.model,
        **defines,
        "seeds": run.seeds,
        "shape": run.shape,
    }
    return json.loads(json.dumps(record))  # as it reads back from disk (tuples as lists, keys as strings)


def eval_stage(branch: str, name: str) -> str:
    """The DVC stage whose run refreshes a run's numbers (with whatever upstream of it changed)."""
    return f"eval_{branch}@{name}"


def write_provenance(params: Dict[str, Any], branch: str, name: str, run_root: Optional[Path] = None) -> Path:
    """``runs/<branch>/<name>/provenance.json`` (or under ``run_root``), vouching for the metrics.json there.

    Written after metrics.json: a stage killed between the two leaves new numbers under an old
    (or no) record, which reads as stale, never old numbers under a new record.
    """
    root = Path(run_root) if run_root is not None else run_paths(branch, name).root
    record = {**run_provenance(params, branch, name), DIGEST_KEY: _digest(root / "metrics.json")}
    target = root / PROVENANCE_FILE
    write_json(target, record)
    return target


@dataclass(frozen=True)
class Stale:
    """Why a run's numbers on disk are not the current params' numbers, and what refreshes them."""

    stage: str
    fields: Tuple[str, ...]  # what differs, one line each

    @property
    def command(self) -> str:
        return f"dvc repro {self.stage}"

    @property
    def text(self) -> str:
        return f"stale: re-run {self.command}"

    @property
    def detail(self) -> str:
        return "; ".join(self.fields)


def check(run_root: Path, params: Dict[str, Any], branch: str, name: str) -> Optional[Stale]:
    """None where run ``name``'s metrics.json is missing (not run) or was produced by the current params."""
    metrics = run_root / "metrics.json"
    if not metrics.is_file():
        return None
    stage = eval_stage(branch, name)
    record_path = run_root / PROVENANCE_FILE
    if not record_path.is_file():
        return Stale(
            stage, (f"no {PROVENANCE_FILE} beside metrics.json (written before runs recorded what produced them)",)
        )
    try:
        recorded = json.loads(record_path.read_text())
    except ValueError:
        return Stale(stage, (f"{PROVENANCE_FILE} is not valid JSON",))
    if not isinstance(recorded, dict):
        return Stale(stage, (f"{PROVENANCE_FILE} does not hold a record",))
    fields = differing_fields(recorded, run_provenance(params, branch, name))
    if recorded.get(DIGEST_KEY) != _digest(metrics):
        fields.append("metrics.json is not the file the record was written for")
    return Stale(stage, tuple(fields)) if fields else None


def differing_fields(recorded: Dict[str, Any], expected: Dict[str, Any]) -> list:
    """``field: recorded X, params now Y`` for every dotted field of the two records that differs."""
    ours = flatten({k: v for k, v in recorded.items() if k != DIGEST_KEY})
    now = flatten(expected)
    missing = object()
    out = []
    for key in sorted(set(ours) | set(now)):
        a, b = ours.get(key, missing), now.get(key, missing)
        if a != b:
            out.append(f"{key}: recorded {_show(a, missing)}, params now {_show(b, missing)}")
    return out


def _show(value: Any, missing: object) -> str:
    text = "absent" if value is missing else json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _digest(path: Path) -> Optional[str]:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
