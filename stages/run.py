"""Run a stage's command in a warm interpreter (stages/warm.py): `python stages/run.py SCRIPT ARGS...`.

dvc.yaml starts every stage through this file so that torch, timm and vcarepro are imported
once per `dvc repro`, not once per stage. It loads only the standard-library client (warm.py, beside
this file) and vcarepro.core.numerics (torch-free, as `import vcarepro` is); `VCAREPRO_WARM=0` runs the
command in a fresh interpreter instead.

First it sets the numerics profile of params.yaml's `numerics` section (src/vcarepro/core/numerics.py)
in the environment, before torch or numpy is imported in the stage or the warm interpreter it is
forked from: the CPU code paths and thread count that make dvc.lock's hashes reproduce on other CPUs.
It also notes when the stage started, for the stage's wall time in timings/stages/ (vcarepro.core.stage_clock).

Every stage runs the code of the checkout it was started in: this file's own `src/` goes first on the import path,
here and (through PYTHONPATH) in every process the stage starts: the warm server and its children, a fresh
interpreter, torchrun's ranks. DVC runs `dvc exp run --temp` and each queued experiment in a copy of the checkout
under .dvc/tmp/exps/ and hashes that copy's src/ into the experiment's dvc.lock; an editable install (README command
1's `pip install -e .`) or an absolute PYTHONPATH would have its stages import the workspace's src/ instead
(treeverse/dvc#10419), so a lock would record code that did not produce its outputs. A vcarepro imported from
anywhere else all the same (a sitecustomize that imports it, say) is refused in one sentence, exit status 2.
"""

import time

STARTED = time.time()  # the stage's clock (vcarepro.core.stage_clock) starts before any import

import os  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

CHECKOUT = Path(__file__).resolve().parents[1]  # the checkout this stage was started in (a copy, for an experiment)
SOURCE = str(CHECKOUT / "src")
sys.path.insert(1, SOURCE)  # before site-packages and an editable install's finder; after stages/ (warm.py)
_INHERITED = [path for path in os.environ.get("PYTHONPATH", "").split(os.pathsep) if path and path != SOURCE]
os.environ["PYTHONPATH"] = os.pathsep.join([SOURCE, *_INHERITED])

import warm  # noqa: E402
from vcarepro.core import numerics, stage_clock  # noqa: E402


def main() -> int:
    foreign = warm.foreign_code(CHECKOUT)
    if foreign:
        print(f"error: {foreign}", file=sys.stderr, flush=True)
        return 2
    stage_clock.note_start(STARTED)
    try:
        numerics.apply_env()
    except numerics.NumericsError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        return 2
    return warm.run(sys.argv[1:])


if __name__ == "__main__":
    try:
        status = main()
    except KeyboardInterrupt:  # while it starts the warm server (seconds: the server imports torch), say one line
        status = warm.interrupted()
    raise SystemExit(status)
