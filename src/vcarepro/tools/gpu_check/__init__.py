"""The GPU acceptance check (``vcarepro gpu-check``; :mod:`.cli`'s docstring is its help; docs/layout.md lists its
modules): every paper-scale path that has only run on CPUs, run once on a new GPU machine before the first real job."""
