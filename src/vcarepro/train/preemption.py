"""SIGTERM as a request to stop cleanly: finish the step, checkpoint, exit non-zero.

Clusters preempt jobs with SIGTERM and a grace period before SIGKILL. Inside
:func:`stop_on_sigterm` the signal only sets a flag; training loops check
:meth:`StopRequest.requested` at step boundaries, write their checkpoint, and raise
:class:`Preempted`, which exits with status 143 (128 + SIGTERM) so that DVC records
the stage as failed and keeps none of its outputs. Re-running ``dvc repro`` resumes.
"""

from __future__ import annotations

import signal
from contextlib import contextmanager
from typing import Iterator


class Preempted(SystemExit):
    def __init__(self, where: str):
        super().__init__(143)
        self.where = where

    def __str__(self) -> str:
        return f"stopped by SIGTERM {self.where}; the checkpoint is saved, re-run `dvc repro` to resume from it."


class StopRequest:
    def __init__(self) -> None:
        self.requested = False

    def _handle(self, signum, frame) -> None:
        self.requested = True


@contextmanager
def stop_on_sigterm() -> Iterator[StopRequest]:
    """Turn SIGTERM into a flag for the duration (main thread only; elsewhere the flag never rises).

    Nested (a seed worker's flag around a training loop's): the inner flag starts raised if the
    outer one is, and raises the outer one on the way out, so a SIGTERM that arrives while a seed
    is still setting up is not lost when training installs its own flag.
    """
    request = StopRequest()
    try:
        previous = signal.signal(signal.SIGTERM, request._handle)
    except ValueError:  # not the main thread: leave signals alone
        yield request
        return
    outer = getattr(previous, "__self__", None)
    outer = outer if isinstance(outer, StopRequest) else None
    if outer is not None:
        request.requested = outer.requested
    try:
        yield request
    finally:
        signal.signal(signal.SIGTERM, previous)
        if outer is not None and request.requested:
            outer.requested = True
