"""``python -m vcarepro.tools.cluster`` (and ``vcarepro cluster``): :func:`vcarepro.tools.cluster.cli.main`."""

from vcarepro.core.errors import interruptible
from vcarepro.tools.cluster.cli import main

if __name__ == "__main__":
    interruptible()  # Ctrl-C reaches the driver even when started as a background job of a script
    raise SystemExit(main())
