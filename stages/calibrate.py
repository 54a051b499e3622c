"""DVC stages `calibrate_cls` / `calibrate_gen`: released checkpoints through our evaluation, beside their published
numbers.

Evaluates the entries of ``calibrate.classifiers`` (``--kind cls``) or ``calibrate.generators`` (``--kind gen``)
that ``calibrate.checkpoints`` lists, each loaded strictly from ``calibrate.dir`` (vcarepro.calibration), and
writes ``metrics/calibration_<kind>.json``: one row per evaluated entry (published, ours, difference,
tolerance, verdict, the file's sha256) and the entries not run with the file each needs. At embedded scale
there is no ImageNet to evaluate on, so nothing may be selected there.
"""

from __future__ import annotations

import argparse

import torch

from vcarepro.calibration import KINDS, entries, keymap_for, not_run, require_file, selected
from vcarepro.calibration.run import calibrate_classifier, calibrate_generator
from vcarepro.core import progress
from vcarepro.core.errors import BadInput
from vcarepro.core.io import write_json
from vcarepro.core.stage import run_stage
from vcarepro.params.config import stage_params
from vcarepro.params.runs import CHECKPOINTS_DIR, CLS_DATA, FID_REFERENCE


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kind", choices=sorted(KINDS), required=True)
    kind = parser.parse_args().kind
    params = stage_params()
    progress.configure(params, f"calibrate_{kind}")
    cal = params["calibrate"]
    chosen = selected(cal, kind)
    if chosen and params["scale"] not in ("paper", "smoke"):
        raise BadInput(
            f"calibration evaluates released ImageNet weights, but scale={params['scale']} has no "
            f"ImageNet; run it at scale=paper (or the stand-ins at scale=smoke), or set "
            f"calibrate.checkpoints=[]."
        )
    tracked = ("data/smoke/released",) if params["scale"] == "smoke" else ("data/released",)
    if chosen and cal["dir"].rstrip("/") not in tracked:
        raise BadInput(
            f"calibrate.dir={cal['dir']} is not a directory this stage's DVC dependencies track; put the "
            f"files in {tracked[0]} (a symbolic link to them will do)."
        )
    for name in chosen:  # every file and layout before any GPU-hour is spent
        require_file(cal, name, entries(cal, kind)[name])
        keymap_for(entries(cal, kind)[name], name)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rows = []
    for name in chosen:
        if kind == "cls":
            result = calibrate_classifier(params, name, device, CLS_DATA)
        else:
            result = calibrate_generator(params, name, device, CHECKPOINTS_DIR / "calibrate", FID_REFERENCE)
        rows.append(result)
        print(
            f"calibrate_{kind} {name}: {result['metric']} ours {result['ours']:.3f}, published "
            f"{result['published']:g} (difference {result['difference']:+.3f}, tolerance "
            f"{result['tolerance']:g}): {result['verdict']}"
            + (f" ({'; '.join(result['deviations'])})" if result["deviations"] else "")
        )
    missing = not_run(cal, kind, chosen)
    write_json(f"metrics/calibration_{kind}.json", {"scale": params["scale"], "rows": rows, "not_run": missing})
    if not chosen:
        print(f"calibrate_{kind}: no checkpoint selected (calibrate.checkpoints); {len(missing)} listed as not run")


if __name__ == "__main__":
    run_stage(main)
