"""Run a stage's command in a warm interpreter (stages/warm.py): `python stages/run.py SCRIPT ARGS...`.

It loads only the standard-library client and vcarepro.core.numerics, and sets the numerics profile in the
environment before torch or numpy loads anywhere (docs/reproducibility.md); it also notes when the stage
started, for vcarepro.core.stage_clock. This checkout's `src/` goes first on the import path and in PYTHONPATH,
so the stage, the warm server and every process they start run this checkout's code; a vcarepro imported from
anywhere else is refused, exit status 2 (docs/lab.md says why). `VCAREPRO_WARM=0` runs a fresh interpreter.
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
