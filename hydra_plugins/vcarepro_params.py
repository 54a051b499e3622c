"""Loaded by DVC before it composes params.yaml from conf/ (`dvc exp run -S`, `.dvc/config` [hydra]; DVC's
`hydra.plugins_path` is the repository's root by default): a bad override is refused in the project's own sentence
before any stage runs (src/vcarepro/params/dvc_compose.py says how). It imports this checkout's own code, never an
installed copy's (as stages/run.py does), and nothing that loads torch."""

import sys
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]
if str(CHECKOUT / "src") not in sys.path:
    sys.path.insert(0, str(CHECKOUT / "src"))

from vcarepro.params import dvc_compose  # noqa: E402

dvc_compose.install(CHECKOUT)
