"""The pipeline on SLURM, every stage one job, DVC keeping the books (``python -m vcarepro.tools.cluster``,
``vcarepro cluster``; docs/cluster.md says what it does and why).

    cli       the command: run / status / cancel, one driver per workspace
    stages    DVC's stage graph, what ``dvc status`` reports out of date, which stages may start
    driver    a job's size from params.yaml, submitting, watching and recording every stage
    job       what runs on a node: the stage under ``dvc repro``, stopped on SLURM's USR2 and requeued
    slurm     SLURM's and the books' view of our jobs: squeue, submitit's files, ``.slurm/jobs.json``
    status    the ``status`` table: each stage's state, a running one's progress, what the remote lacks
"""
