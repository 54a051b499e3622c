"""The report's calibration section: released checkpoints through our evaluation, beside their published numbers."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict

from vcarepro.report.collect import read_json

LABELS = {"top1": "top-1 (%)", "fid": "FID-50K"}


def calibration_section(root: Path, scale: str) -> Dict[str, Any]:
    """Rows evaluated (published, ours, difference, tolerance, verdict) and one line of the files not run."""
    rows, not_run, stale = [], [], []
    for kind in ("cls", "gen"):
        result = read_json(root / "metrics" / f"calibration_{kind}.json")
        if not result:
            continue
        if result.get("scale") != scale:  # written for another scale: its rows are not this run's
            stale.append(f"metrics/calibration_{kind}.json (scale {result.get('scale')})")
            continue
        for r in result["rows"]:
            if r.get("standin"):
                note = "stand-in weights (random, in the released layout)"
            elif scale != "paper":
                note = "not ImageNet"
            else:
                note = "; ".join(r.get("deviations") or [])  # why a paper-scale row is not judged
            measured = (
                f"{r['val_images']:,} val images"
                if r["kind"] == "cls"
                else f"{r['num_samples']:,} samples, {r['sampler']} {r['sampler_steps']} steps, cfg {r['cfg_scale']:g}"
            )
            rows.append(
                {
                    **r,
                    "label": LABELS[r["metric"]],
                    "ours": f"{r['ours']:.2f}",
                    "difference": f"{r['difference']:+.2f}",
                    "tolerance": f"±{r['tolerance']:g}",
                    "note": note,
                    "measured": measured,
                }
            )
        not_run.extend(result["not_run"])
    return {"rows": rows, "not_run": not_run, "stale": stale, "files": sorted({n["file"] for n in not_run})}
