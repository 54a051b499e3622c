"""``python -m vcarepro.tools.preflight`` (and ``vcarepro preflight``): :func:`vcarepro.tools.preflight.cli.main` as a
stage runs, a problem the user can fix one ``error:`` line and exit status 2."""

from vcarepro.core.errors import run_stage
from vcarepro.tools.preflight.cli import main

if __name__ == "__main__":
    status = [0]
    run_stage(lambda: status.__setitem__(0, main()), what="the preflight")
    raise SystemExit(status[0])
