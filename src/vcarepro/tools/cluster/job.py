"""What runs on a node: one stage under ``dvc repro``, stopped on SLURM's USR2 and requeued by submitit
(docs/cluster.md#preemption-and-time-limits)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional

import submitit

from vcarepro.core import supervise
from vcarepro.tools.remote import dvc_env

SHELLS = {"sh", "dash", "bash", "zsh", "fish", "ksh"}


def repro_command(stage: str) -> List[str]:
    """One stage, alone, as DVC reproduces it; waiting for DVC's repository lock, which other jobs' DVC holds for a
    moment before and after each command."""
    return [sys.executable, "-m", "dvc", "--wait-for-lock", "repro", "--single-item", stage]


def _ignore_usr2() -> None:  # in the child, before exec: SLURM signals every process of the job step
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


class StageJob(submitit.helpers.Checkpointable):
    """A job's callable: :func:`repro_command` in the workspace, on the job's first task.

    The stage runs in a fresh interpreter (``VCAREPRO_WARM=0``: a warm server started by one job would run
    another job's stage outside that job's cgroup and signals). submitit's checkpoint (USR2) stops it with
    SIGTERM within ``grace`` seconds and requeues the job; a SIGTERM from SLURM itself stops it the same way
    and ends the job without a result.
    """

    def __init__(self, grace: float = 60) -> None:
        self.grace = grace
        self._proc: Optional[subprocess.Popen] = None
        self._sigterm = False

    def __getstate__(self) -> Dict[str, Any]:
        return {"grace": self.grace}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__init__(**state)

    def __call__(self, stage: str, root: str) -> Dict[str, Any]:
        if int(os.environ.get("SLURM_PROCID", "0")) != 0:
            return {"stage": stage, "task": os.environ["SLURM_PROCID"]}  # other nodes: the stage's srun reaches them
        env = {**dvc_env(), "VCAREPRO_WARM": "0"}
        if "OMP_NUM_THREADS" not in env and env.get("SLURM_CPUS_PER_TASK"):
            env["OMP_NUM_THREADS"] = env["SLURM_CPUS_PER_TASK"]
        signal.signal(signal.SIGTERM, self._on_sigterm)
        self._proc = subprocess.Popen(repro_command(stage), cwd=root, env=env, preexec_fn=_ignore_usr2)
        while self._proc.poll() is None:
            time.sleep(0.5)
        code = self._proc.returncode
        if code == 0:
            return {"stage": stage, "host": os.uname().nodename}
        if self._sigterm:  # SLURM ended the job (scancel, the time limit, a preemption): no result is written,
            # so the command reports the job's end as SLURM names it; a preemption that requeues runs it again
            print(f"{stage}: stopped by SIGTERM from SLURM; its checkpoint is kept", file=sys.stderr, flush=True)
            raise SystemExit(-1)
        raise RuntimeError(
            f"`dvc repro --single-item {stage}` failed with exit status {code}; its error is above in this log."
        )

    def _on_sigterm(self, signum, frame) -> None:
        self._sigterm = True

    def checkpoint(self, stage: str, root: str) -> submitit.helpers.DelayedSubmission:
        """submitit's hook on USR2: stop the stage (it checkpoints), then hand back the same job to requeue."""
        self._stop_stage(self.grace)
        return submitit.helpers.DelayedSubmission(StageJob(self.grace), stage, root)

    def _stop_stage(self, grace: float) -> None:
        import psutil

        if self._proc is None or self._proc.poll() is not None:
            return
        try:
            children = psutil.Process(self._proc.pid).children(recursive=True)
            top = command_processes(self._proc.pid)
        except psutil.NoSuchProcess:  # DVC ended meanwhile: nothing left to stop
            return
        # The command's own process, as a SIGTERM from a terminal would reach it: it passes the signal on
        # (stages/run.py to the stage, the launcher to torchrun or srun, srun to its step on every node,
        # torchrun to the ranks), each once; one that got it twice may stop before its checkpoint. DVC
        # itself is left to see its command fail, so it releases its locks and records nothing.
        supervise.send(top, signal.SIGTERM, gone=(psutil.NoSuchProcess,))
        # Past the grace (or once DVC has ended) every process under DVC goes; DVC, recording nothing, gets 10 s
        # more to exit.
        supervise.stop(self._proc, grace, signals=(), kill=children, reap_s=10, gone=(psutil.NoSuchProcess,))


def command_processes(dvc_pid: int) -> list:
    """The processes of the command DVC runs: its children, or a shell's children where DVC's ``$SHELL -c``
    did not exec the command."""
    import psutil

    found = []
    for child in psutil.Process(dvc_pid).children():
        try:
            found.extend(child.children() if child.name() in SHELLS else [child])
        except psutil.NoSuchProcess:
            pass
    return found
