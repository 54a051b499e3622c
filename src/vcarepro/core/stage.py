"""A DVC stage's entry point: :func:`vcarepro.core.errors.run_stage`'s one-line failures, timed by the stage clock.

Every stage script ends in ``run_stage(main)`` from here. The failures (one sentence and exit status 2, Ctrl-C's one
line and 130) are :mod:`vcarepro.core.errors`'; the wall time :mod:`vcarepro.core.stage_clock` records under DVC is
this module's, outside errors, so that the clock writes through :mod:`vcarepro.core.io` like every other file
(io reports a full disk through errors, and errors knows nothing of the clock).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Callable, Optional

from vcarepro.core import errors, stage_clock

STATUS = {0: "ok", errors.USER_ERROR_STATUS: "error: exit 2", errors.INTERRUPTED_STATUS: "interrupted: exit 130"}


def run_stage(main: Callable[[], object], *, stage_table: bool = False, what: Optional[str] = None) -> None:
    """:func:`vcarepro.core.errors.run_stage` of ``main``; under DVC its wall time goes to timings/stages/, and with
    ``stage_table`` (the report, last in the DAG) the table of this DVC run's stages is printed and written to
    timings/stages.md."""
    started = stage_clock.take_start()
    main_started = time.time()
    status = "failed"  # an exception errors does not turn into an exit status: a traceback follows
    try:
        errors.run_stage(main, what=what)
        status = "ok"
    except SystemExit as stop:  # None: 0; a message (SystemExit("...")): Python prints it and exits 1
        code = 0 if stop.code is None else stop.code if isinstance(stop.code, int) else 1
        status = STATUS.get(code, f"exit {code}")
        raise
    finally:
        if started is not None:
            _clock(started, main_started, status, stage_table)


def _clock(started: dict, main_started: float, status: str, stage_table: bool) -> None:
    """Record the stage's wall time; a failure to write it (a full disk) is one line, never the stage's failure."""
    root = Path(os.environ.get("DVC_ROOT") or ".")
    stage = os.environ["DVC_STAGE"]
    try:
        stage_clock.record(root, stage, started, main_started, time.time(), status)
        if stage_table and status == "ok":
            text = stage_clock.write_table(root, stage)
            if text:
                print(f"\n{text}(also in {stage_clock.TABLE})", flush=True)
    except Exception as err:  # a wall time is never worth a stage's result
        print(f"note: the stage's wall time was not recorded ({err})", file=sys.stderr, flush=True)
