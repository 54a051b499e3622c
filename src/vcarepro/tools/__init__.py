"""What a user runs by hand, on top of everything: the ``vcarepro`` command (cli), the preflight, the SLURM driver
(cluster), the lock's checker (lockcheck), the smoke scale's stand-ins, the weights export and the benchmarks."""

FLOOR = 6
