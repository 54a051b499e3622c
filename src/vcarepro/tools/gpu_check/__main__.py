"""``python -m vcarepro.tools.gpu_check`` (and ``vcarepro gpu-check``): :func:`vcarepro.tools.gpu_check.cli.main` as a
stage runs, a problem the user can fix one ``error:`` line and exit status 2."""

import os
import sys

from vcarepro.core.errors import run_stage
from vcarepro.core.supervise import Terminated, terminated_raises
from vcarepro.tools.gpu_check.cli import main

if __name__ == "__main__":
    status = [0]
    try:
        with terminated_raises():  # SIGTERM, SIGHUP (`timeout`, scancel, a closed terminal): as Ctrl-C, own line
            run_stage(lambda: status.__setitem__(0, main()), what="the GPU check")
    except SystemExit as stop:  # 2 (a user error) or 130 (Ctrl-C, while a part's thread still runs)
        if not isinstance(stop.code, int):
            raise
        status[0] = stop.code
    except Terminated as stop:
        print(stop.line("the GPU check"), file=sys.stderr, flush=True)
        status[0] = stop.status
    from vcarepro.tools.gpu_check.parts import abandoned

    ddp = sys.modules.get("vcarepro.tools.gpu_check.ddp")
    if ddp is not None:  # a torchrun whose part's thread is left behind: that thread's finally never runs
        ddp.stop_all()
    # a part that never returned, or that Ctrl-C left running, still holds its thread (and perhaps the GPU): do not
    # wait for it. After Ctrl-C the interpreter's own shutdown under torch's threads ended in SIGSEGV or in
    # "terminate called without an active exception" (SIGABRT), measured: it is skipped, what was written is whole.
    if abandoned() or status[0] > 128:  # 128 + N: a signal ended it (Ctrl-C 130, SIGTERM 143, SIGHUP 129)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status[0])
    raise SystemExit(status[0])
