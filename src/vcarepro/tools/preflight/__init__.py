"""The preflight: what every run of a scale will cost on the machine at hand, and what would stop it, before it starts
(``python -m vcarepro.tools.preflight``, ``vcarepro preflight``; :mod:`.cli`'s docstring is the command's help).

One concept a module, in the order a run meets them:

    cli         the command: its options, the scale and runs chosen, the loop over the runs, what it prints and writes
    inputs      the files from outside the repository the selected runs need; one sentence per missing one
    sizing      the data a scale trains on; a run's per-device batch, its optimizer steps, the sizes that cannot work
    branches    classification and generation as one path: what differs held as data, ``run_cost`` for either
    stepping    a run's training step timed after a warm-up, its batch halved on running out of memory
    machine     the device's memory, the peak a block allocates (``/proc/self`` on a CPU), out-of-memory errors
    sampling    a generation run's sampling: the real sampler's passes counted, one forward pass timed
    cost        ``RunCost``: what was measured, projected to the recipe's batch, and whether it fits
    loader      the training transform's images/s at the recipe's workers
    table       the table, its legend, the inputs section, the one sentence for the runs that do not fit
"""
