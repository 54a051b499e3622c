"""The runs tables: every run of a branch with its model, attention options, seeds and aggregated metrics."""

from __future__ import annotations

from typing import Any, Dict, List

import pandas as pd

from vcarepro.core.choices import model_options
from vcarepro.params.schema import ClsRun, GenRun
from vcarepro.report.collect import RunResult


def runs_frame(
    results: Dict[str, RunResult], runs: Dict[str, Any], models: Dict[str, Any], keys: List[str], shape: Dict[str, Any]
) -> pd.DataFrame:
    """Every run of a branch: its model, seeds and aggregated metrics.

    Attention options are the ones the run actually used: the model's, with the scale's
    contrast-token count (``shape``) in place of the paper-shape one.
    """
    records = []
    for name, entry in runs.items():
        run = (GenRun if "objective" in entry else ClsRun).model_construct(**entry)
        spec = models.get(run.model, {})
        _, options = model_options(spec.get("attention"), spec.get("options"), shape)
        record = {
            "run": name,
            "model": run.model,
            "attention": spec.get("attention"),
            "attention options": ", ".join(f"{k}={v}" for k, v in (options or {}).items()),
            "seeds": ", ".join(map(str, run.seeds)),
        }
        if isinstance(run, GenRun):
            record["objective"] = run.objective
        m = results[name].metrics if name in results else None
        stale = results[name].stale if name in results else None
        for key in keys:
            if stale is not None:
                record[key] = stale.text
            elif m is None or key not in m:
                record[key] = "not run"
            elif m.get("n_seeds", 1) > 1:
                record[key] = f"{m[key]:.2f} ± {m[key + '_std']:.2f}"
            else:
                record[key] = f"{m[key]:.2f}"
        records.append(record)
    return pd.DataFrame.from_records(records)
