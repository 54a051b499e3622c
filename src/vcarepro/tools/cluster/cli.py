"""The pipeline on SLURM: every stage one job, up to K at once, DVC keeping the books."""

from __future__ import annotations

import argparse
import fcntl
import sys
from pathlib import Path
from typing import Optional, Sequence

from vcarepro.core.errors import refused
from vcarepro.tools.cluster.driver import Driver
from vcarepro.tools.cluster.slurm import STATE_DIR, ClusterError, our_jobs, run_slurm
from vcarepro.tools.cluster.status import print_status


def cancel(root: Path) -> int:
    with _DriverLock(root, "cancel"):  # a running `run` would take the cancelled jobs as failed and go on
        jobs = our_jobs(root)
        if jobs:
            run_slurm(["scancel", *sorted(jobs)])
    print(f"cancelled {len(jobs)} job(s): {', '.join(f'{j.stage} ({i})' for i, j in sorted(jobs.items()))}")
    return 0


class _DriverLock:
    """One ``run`` per workspace at a time (a second would submit the same stages)."""

    def __init__(self, root: Path, purpose: str = "run"):
        (root / STATE_DIR).mkdir(exist_ok=True)
        self.handle = (root / STATE_DIR / "driver.lock").open("a")
        self.purpose = purpose

    def __enter__(self):
        try:
            fcntl.flock(self.handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            then = (
                "watch it with `python -m vcarepro.tools.cluster status`, or stop it first"
                if self.purpose == "run"
                else "stop it first (Ctrl-C), then cancel"
            )
            raise ClusterError(f"a `python -m vcarepro.tools.cluster run` drives this workspace; {then}.") from None
        return self

    def __exit__(self, *exc):
        self.handle.close()


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vcarepro.tools.cluster", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run_p = sub.add_parser("run", help="run every out-of-date stage, each as a SLURM job")
    run_p.add_argument("targets", nargs="*", help="stages to bring up to date, with what they need (default: all)")
    run_p.add_argument("--max-jobs", type=int, default=8, help="jobs queued or running at once (default 8)")
    run_p.add_argument(
        "--poll", type=float, default=None, help="seconds between looks at the queue (default: cluster.poll_seconds)"
    )
    sub.add_parser("status", help="every stage: done / queued / running / failed / ready / waiting")
    sub.add_parser("cancel", help="scancel this workspace's queued and running jobs")
    args = parser.parse_args(argv)
    root = Path.cwd().resolve()
    try:
        if not (root / "dvc.yaml").is_file():
            raise ClusterError(f"{root} has no dvc.yaml; run the command from the repository's root.")
        if args.command == "status":
            print_status(root)
            return 0
        if args.command == "cancel":
            return cancel(root)
        if args.max_jobs < 1:
            raise ClusterError(f"--max-jobs must be at least 1, got {args.max_jobs}.")
        with _DriverLock(root):
            driver = Driver(root, args.max_jobs, 0, args.targets)
            driver.poll = args.poll if args.poll is not None else driver.cluster["poll_seconds"]
            try:
                return driver.run()
            except KeyboardInterrupt:
                driver.stop_local()
                print(
                    "interrupted: the cluster driver (the jobs SLURM holds keep running, "
                    "`python -m vcarepro.tools.cluster status` shows them); resume with "
                    "`python -m vcarepro.tools.cluster run`",
                    file=sys.stderr,
                )
                return 130
    except Exception as err:  # a user error or a full disk: one line
        return refused(err)
