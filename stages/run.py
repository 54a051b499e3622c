"""Run a stage's command in a warm interpreter (stages/warm.py): `python stages/run.py SCRIPT ARGS...`.

dvc.yaml starts every stage through this file so that torch, timm and vcarepro are imported
once per `dvc repro`, not once per stage. It loads only the standard-library client (warm.py, beside
this file) and vcarepro.core.numerics (torch-free, as `import vcarepro` is); `VCAREPRO_WARM=0` runs the
command in a fresh interpreter instead.

First it sets the numerics profile of params.yaml's `numerics` section (src/vcarepro/core/numerics.py)
in the environment, before torch or numpy is imported in the stage or the warm interpreter it is
forked from: the CPU code paths and thread count that make dvc.lock's hashes reproduce on other CPUs.
It also notes when the stage started, for the stage's wall time in timings/stages/ (vcarepro.core.stage_clock).
"""

import time

STARTED = time.time()  # the stage's clock (vcarepro.core.stage_clock) starts before any import

import sys  # noqa: E402

import warm  # noqa: E402
from vcarepro.core import numerics, stage_clock  # noqa: E402

if __name__ == "__main__":
    stage_clock.note_start(STARTED)
    try:
        numerics.apply_env()
    except numerics.NumericsError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        raise SystemExit(2)
    raise SystemExit(warm.run(sys.argv[1:]))
