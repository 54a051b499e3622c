"""``python -m vcarepro.tools.gpu_check`` (and ``vcarepro gpu-check``): :func:`vcarepro.tools.gpu_check.cli.main` as a
stage runs, a problem the user can fix one ``error:`` line and exit status 2."""

import os
import sys

from vcarepro.core.errors import run_stage
from vcarepro.tools.gpu_check.cli import main

if __name__ == "__main__":
    status = [0]
    run_stage(lambda: status.__setitem__(0, main()), what="the GPU check")
    from vcarepro.tools.gpu_check.parts import abandoned

    if abandoned():  # a part that never returned still holds its thread (and perhaps the GPU): do not wait for it
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status[0])
    raise SystemExit(status[0])
