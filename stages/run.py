"""Run a stage's command in a warm interpreter (src/vcarepro/warm.py): `python stages/run.py SCRIPT ARGS...`.

dvc.yaml starts every stage through this file so that torch, timm and vcarepro are imported
once per `dvc repro`, not once per stage. It loads only the standard-library client;
`VCAREPRO_WARM=0` runs the command in a fresh interpreter instead.
"""
import importlib.util
import sys
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "vcarepro_warm", Path(__file__).resolve().parents[1] / "src" / "vcarepro" / "warm.py")
_warm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_warm)

if __name__ == "__main__":
    raise SystemExit(_warm.run(sys.argv[1:]))
