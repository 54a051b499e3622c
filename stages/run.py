"""Run a stage's command in a warm interpreter (stages/warm.py): `python stages/run.py SCRIPT ARGS...`.

dvc.yaml starts every stage through this file so that torch, timm and vcarepro are imported
once per `dvc repro`, not once per stage. It loads only the standard-library client (warm.py, beside
this file) and numerics.py by its path (importing vcarepro would import torch, via the package's
__init__); `VCAREPRO_WARM=0` runs the command in a fresh interpreter instead.

First it sets the numerics profile of params.yaml's `numerics` section (src/vcarepro/numerics.py)
in the environment, before torch or numpy is imported in the stage or the warm interpreter it is
forked from: the CPU code paths and thread count that make dvc.lock's hashes reproduce on other CPUs.
"""
import importlib.util
import sys
from pathlib import Path

import warm

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "vcarepro"


def _load(name: str, file: str):
    spec = importlib.util.spec_from_file_location(name, PACKAGE / file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_numerics = _load("vcarepro_numerics", "numerics.py")

if __name__ == "__main__":
    try:
        _numerics.apply_env()
    except _numerics.NumericsError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        raise SystemExit(2)
    raise SystemExit(warm.run(sys.argv[1:]))
