"""SLURM's and the books' view of our jobs: ``squeue``, a job's submitit files, the ledger ``.slurm/jobs.json``."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

import submitit

from vcarepro.core.errors import UserError
from vcarepro.core.io import write_json
from vcarepro.tools.remote import last_line

STATE_DIR = Path(".slurm")
JOBS_FILE = STATE_DIR / "jobs.json"
LOG_DIR = STATE_DIR / "logs"  # submitit's folder: <job>_0_log.out / .err, the job's pickles
LOCAL_LOGS = STATE_DIR / "local"  # the stages run here: <stage>.log
JOB_NAME = "vcarepro:"
# squeue's states (squeue(1) "JOB STATE CODES") of a job waiting to (re)start, and of one that has not ended.
QUEUED = set("PENDING REQUEUED REQUEUE_FED REQUEUE_HOLD RESV_DEL_HOLD SPECIAL_EXIT SUSPENDED".split())
ACTIVE = QUEUED | set("CONFIGURING RUNNING COMPLETING RESIZING STOPPED SIGNALING STAGE_OUT".split())
TAIL_LINES = 8


class ClusterError(UserError):
    """A problem with the cluster set-up or the cluster section (one sentence, exit status 2)."""


def run_slurm(args: Sequence[str]) -> str:
    try:
        result = subprocess.run(list(args), capture_output=True, text=True, timeout=120)
    except FileNotFoundError:
        raise ClusterError(
            f"`{args[0]}` is not on PATH: run this on a SLURM login node (or install slurm-wlm and start a cluster)."
        ) from None
    except subprocess.TimeoutExpired:
        raise ClusterError(
            f"`{' '.join(args)}` did not answer in 120 s: the SLURM controller is down or overloaded; try again later."
        ) from None
    if result.returncode != 0:
        raise ClusterError(
            f"`{' '.join(args)}` failed: {last_line(result.stderr)}; check `sinfo` and the "
            f"cluster section of params.yaml."
        )
    return result.stdout


@dataclass
class SlurmJob:
    job_id: str
    state: str
    reason: str = ""
    stage: str = ""


def our_jobs(root: Path) -> Dict[str, SlurmJob]:
    """Jobs of this user that SLURM still lists, ended ones too (for ``MinJobAge``), by job id (ours: named
    ``vcarepro:<stage>``, with this workspace as their comment)."""
    for attempt in range(6):  # a busy controller times out now and then: retried for about a minute
        try:
            out = run_slurm(["squeue", "--me", "--states=all", "--noheader", "--format=%i|%T|%r|%j|%k"])
            break
        except ClusterError:
            if attempt == 5 or shutil.which("squeue") is None:
                raise
            time.sleep(2**attempt)
    jobs = {}
    for line in out.splitlines():
        parts = line.strip().split("|", 4)
        if len(parts) == 5 and parts[3].startswith(JOB_NAME) and parts[4] == str(root):
            jobs[parts[0]] = SlurmJob(parts[0], parts[1], parts[2], parts[3][len(JOB_NAME) :])
    return jobs


def job_paths(root: Path, job_id: str) -> submitit.core.utils.JobPaths:
    return submitit.core.utils.JobPaths(root / LOG_DIR / "%j", job_id=job_id, task_id=0)


def outcome(root: Path, job_id: str) -> Optional[tuple]:
    """("success", value) or ("error", traceback) once the job has written its result, else None."""
    path = job_paths(root, job_id).result_pickle
    if not path.exists():
        return None
    try:
        return submitit.core.utils.pickle_load(path)
    except Exception:  # being written
        return None


def log_tail(path: Path, lines: int = TAIL_LINES) -> List[str]:
    if not path.is_file():
        return []
    text = path.read_text(errors="replace").splitlines()
    return [line for line in text if line.strip()][-lines:]


def fix_line(path: Path) -> Optional[str]:
    """The one-sentence error our stages print (``error: ...``), the last one in the log."""
    if not path.is_file():
        return None
    found = [line for line in path.read_text(errors="replace").splitlines() if line.startswith("error: ")]
    return found[-1] if found else None


@dataclass
class Record:
    stage: str
    job_id: str = ""  # "" for a stage run here
    state: str = "submitted"  # submitted / done / failed
    log: str = ""
    message: List[str] = field(default_factory=list)
    fix: Optional[str] = None
    pushed: str = ""  # "" (not pushed by this driver), "yes", or "failed: <DVC's last line>"

    def as_dict(self) -> Dict[str, Any]:
        return {key: value for key, value in asdict(self).items() if key != "stage"}  # the books key by stage


def load_records(root: Path) -> Dict[str, Record]:
    path = root / JOBS_FILE
    if not path.is_file():
        return {}
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError:
        raise ClusterError(
            f"{path} is not JSON; move it aside (SLURM still lists the jobs, and `run` finds "
            f"them by name) and run the command again."
        ) from None
    return {stage: Record(stage, **entry) for stage, entry in raw.items()}


def save_records(root: Path, records: Mapping[str, Record]) -> None:
    write_json(root / JOBS_FILE, {s: r.as_dict() for s, r in sorted(records.items())})
