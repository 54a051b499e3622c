"""The pipeline on SLURM: every stage one job, up to K at once, DVC keeping the books.

    python -m vcarepro.tools.cluster run [STAGE...] [--max-jobs K] [--poll S]  # on the login node, in the workspace
    python -m vcarepro.tools.cluster status                                 # every stage: done / queued / running / ...
                                                                      # (a running one's step of the total, ETA;
                                                                      # what the default remote lacks yet)
    python -m vcarepro.tools.cluster cancel                                 # scancel this workspace's jobs

``run`` reads the stage graph from DVC (``dvc.yaml``) and what is out of date from ``dvc status``.
A stage runs once every stage upstream of it is up to date: each one named in ``cluster.local_stages``
(the report) in this process, every other one as a SLURM job that runs ``dvc repro --single-item
<stage>`` in the workspace (a shared file system, as on every cluster). So DVC itself runs each
stage's command and records it in the workspace's one ``dvc.lock`` and its run cache, exactly as
``dvc repro`` would: DVC releases its repository lock while a command runs and guards the
outputs with its read/write locks, which is what makes independent stages safe to reproduce in
parallel (DVC's documented way to run a pipeline's branches side by side).

Jobs are submitted with submitit (what DeiT, DINO and MAE use in ``run_with_submitit.py``), sized by
``distributed`` (a training stage: its nodes and GPUs per node) and the ``cluster`` section of
params.yaml (partition, account, QOS, CPUs, memory, time limits). ``.slurm/jobs.json`` records each
stage's job; jobs carry the name ``vcarepro:<stage>`` and the workspace as their comment, so an
interrupted ``run`` started again finds every job still queued or running (also one submitted just
before the interruption) and submits nothing twice, and stages DVC reports up to date are not run.

Preemption and time limits: submitit asks SLURM for ``USR2`` ``cluster.signal_delay_s`` seconds before
the limit (SLURM sends it on preemption too where the site sets ``PreemptParameters=send_user_signal``).
:class:`StageJob` then stops the stage the way a SIGTERM stops any stage here (training checkpoints at
the next step, exit 143, DVC records nothing), and submitit requeues the job; the requeued job's
``dvc repro`` resumes from the checkpoint and ends bit-identical to an uninterrupted run on CPU.
Requeues that submitit takes for a time limit (a USR2 after 80% of it) are counted against
``cluster.max_requeues``. A job that fails for any other reason, or that SLURM ends by SIGTERM
(``scancel``, the limit itself), is not requeued: ``run`` shows its log's last lines and the fix our
stages print (``error: ...``), goes on with what does not depend on it, and exits 1 when nothing else
can run.

Backups: a cluster's outputs live on a scratch disk that sites purge. With a default DVC remote in the workspace
(``dvc remote add -d``; docs/lab.md), ``run`` pushes each stage's outputs as soon as the stage is done (``dvc push
<stage>``, :mod:`vcarepro.tools.remote`), and ``status`` lists the outputs the remote lacks yet; a push that fails is
one line, and the stage stays done (``dvc push`` sends it later).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set

import submitit

from vcarepro.core import supervise
from vcarepro.core.errors import UserError, refused
from vcarepro.core.io import write_json
from vcarepro.core.progress import latest
from vcarepro.params.config import section, stage_params
from vcarepro.tools import remote
from vcarepro.tools.remote import dvc_env, last_line

STATE_DIR = Path(".slurm")
JOBS_FILE = STATE_DIR / "jobs.json"
LOG_DIR = STATE_DIR / "logs"  # submitit's folder: <job>_0_log.out / .err, the job's pickles
LOCAL_LOGS = STATE_DIR / "local"  # the stages run here: <stage>.log
JOB_NAME = "vcarepro:"
TRAINING_STAGES = ("train_cls", "train_gen")  # the stages whose command is the distributed launcher
# squeue's states of a job that has not ended (squeue(1) "JOB STATE CODES").
ACTIVE = {
    "PENDING",
    "CONFIGURING",
    "RUNNING",
    "COMPLETING",
    "REQUEUED",
    "REQUEUE_FED",
    "REQUEUE_HOLD",
    "RESIZING",
    "SUSPENDED",
    "STOPPED",
    "SIGNALING",
    "STAGE_OUT",
    "RESV_DEL_HOLD",
    "SPECIAL_EXIT",
}
QUEUED = {"PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESV_DEL_HOLD", "SPECIAL_EXIT", "SUSPENDED"}
TAIL_LINES = 8
STATUS_TIMEOUT = 3600  # seconds `dvc status` may wait for DVC's lock (a job caching a large output holds it)


class ClusterError(UserError):
    """A problem with the cluster set-up or the cluster section (one sentence, exit status 2)."""


# ----------------------------------------------------------------------------------------------
# What DVC knows: the stage graph and what is out of date.


def stage_graph(root: Path) -> Dict[str, List[str]]:
    """Every pipeline stage of ``root`` (DVC's addressing, ``train_cls@deit_tiny-vca``) -> the stages it
    reads from directly, in DVC's own graph of dvc.yaml."""
    from dvc.repo import Repo

    with Repo(str(root)) as repo:
        graph = repo.index.graph
        return {s.addressing: sorted(u.addressing for u in graph.successors(s)) for s in graph.nodes}


def topological(graph: Mapping[str, Sequence[str]]) -> List[str]:
    """The stages, each after every stage it reads from (ties by name, so the order is stable)."""
    done: List[str] = []
    seen: Set[str] = set()

    def visit(name: str) -> None:
        if name in seen:
            return
        seen.add(name)
        for up in sorted(graph.get(name, ())):
            visit(up)
        done.append(name)

    for name in sorted(graph):
        visit(name)
    return done


def ancestors(graph: Mapping[str, Sequence[str]], name: str) -> Set[str]:
    found: Set[str] = set()
    todo = list(graph.get(name, ()))
    while todo:
        up = todo.pop()
        if up not in found:
            found.add(up)
            todo.extend(graph.get(up, ()))
    return found


def descendants(graph: Mapping[str, Sequence[str]], names: Set[str]) -> Set[str]:
    return {s for s in graph if ancestors(graph, s) & names}


def out_of_date(
    root: Path, graph: Mapping[str, Sequence[str]], busy: Set[str] = frozenset(), attempts: int = 20
) -> Set[str]:
    """The stages not done: those ``dvc status`` reports changed, and ``busy`` ones (running now) with
    everything downstream of them. DVC is asked about the others only: a running stage holds DVC's write
    lock on its outputs, which ``dvc status`` of that stage or of one reading them would wait on."""
    busy = set(busy) | descendants(graph, set(busy))
    targets = sorted(set(graph) - busy)
    if not targets:
        return busy
    for _ in range(attempts):
        try:  # DVC holds its repository lock while a job records (and caches) its stage's outputs
            result = subprocess.run(
                [sys.executable, "-m", "dvc", "--wait-for-lock", "status", "--json", *targets],
                cwd=root,
                capture_output=True,
                text=True,
                env=dvc_env(),
                timeout=STATUS_TIMEOUT,
            )
        except subprocess.TimeoutExpired:
            raise ClusterError(
                f"`dvc status` waited {STATUS_TIMEOUT} s for DVC's lock: another DVC command holds "
                f"it in this workspace; wait for it to finish, then run the command again."
            ) from None
        if result.returncode == 0:
            return set(json.loads(result.stdout or "{}")) | busy
        if "Unable to acquire lock" not in result.stderr and "is busy" not in result.stderr:
            raise ClusterError(
                f"`dvc status` failed in {root}: {last_line(result.stderr)}; fix that first, "
                f"then run the command again."
            )
        time.sleep(3)  # a job's DVC holds the repository lock while it records its stage
    raise ClusterError(
        "DVC's locks stayed taken for a minute (`dvc status` could not read them): another DVC "
        "command runs in this workspace; wait for it to finish, then run the command again."
    )


def todo_stages(graph: Mapping[str, Sequence[str]], changed: Set[str]) -> Set[str]:
    """What is not done: each stage DVC reports changed and each one downstream of such a stage (its inputs
    will change when that one has run, so DVC's answer for it is not yet the last word)."""
    return (set(changed) & set(graph)) | descendants(graph, set(changed))


def ready_stages(graph: Mapping[str, Sequence[str]], changed: Set[str]) -> List[str]:
    """The changed stages whose inputs are all done: they can run now, in topological order."""
    todo = todo_stages(graph, changed)
    return [s for s in topological(graph) if s in changed and not ancestors(graph, s) & todo]


# ----------------------------------------------------------------------------------------------
# A stage's job: its size from params.yaml, what runs inside it.


def restrict(graph: Mapping[str, Sequence[str]], targets: Sequence[str]) -> Dict[str, List[str]]:
    """The part of ``graph`` that ``targets`` need (themselves and everything upstream), as ``dvc repro
    TARGETS`` would run it; all of it without targets."""
    if not targets:
        return dict(graph)
    unknown = [t for t in targets if t not in graph]
    if unknown:
        raise ClusterError(
            f"no stage {unknown[0]!r} in dvc.yaml; name one as `dvc stage list` does (e.g. {sorted(graph)[0]})."
        )
    keep = set(targets).union(*(ancestors(graph, t) for t in targets))
    return {s: list(ups) for s, ups in graph.items() if s in keep}


def kind(stage: str) -> str:
    return stage.split("@", 1)[0]


def job_parameters(stage: str, params: Mapping[str, Any], root: Path) -> Dict[str, Any]:
    """submitit's SlurmExecutor parameters for ``stage`` (see conf/config.yaml ``cluster`` for each)."""
    c = section(params, "cluster")
    dist = section(params, "distributed")
    training = kind(stage) in TRAINING_STAGES
    nodes, gpus = 1, (1 if c["gpu"] else 0)
    if training:
        nodes = dist["nnodes"] if isinstance(dist["nnodes"], int) else c["nodes"]
        per_node = dist["nproc_per_node"] if isinstance(dist["nproc_per_node"], int) else c["gpus_per_node"]
        gpus = per_node if c["gpu"] else 0
        if nodes > 1 and dist["launcher"] != "srun":
            raise ClusterError(
                f"{stage} asks for {nodes} nodes, and a job reaches its other nodes through the "
                f"srun launcher; set distributed.launcher: srun and distributed.rdzv_endpoint: env "
                f"(or host:port) in params.yaml."
            )
    minutes = c["train_minutes"] if training else c["stage_minutes"]
    out: Dict[str, Any] = {
        "job_name": f"{JOB_NAME}{stage}",
        "comment": str(root),
        "nodes": nodes,
        "ntasks_per_node": 1,
        "cpus_per_task": c["cpus_per_task"],
        "time": minutes,
        "signal_delay_s": c["signal_delay_s"],
        "stderr_to_stdout": False,
        "additional_parameters": {"requeue": True},  # sbatch --requeue: whatever the site's JobRequeue default
    }
    if gpus:
        out["gpus_per_node"] = gpus
    for key in ("partition", "account", "qos"):
        if c[key]:
            out[key] = c[key]
    if c["mem_gb"]:
        out["mem"] = f"{c['mem_gb']}GB"
    if c["setup"]:
        out["setup"] = list(c["setup"])
    return out


def _ignore_usr2() -> None:  # in the child, before exec: SLURM signals every process of the job step
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


class StageJob(submitit.helpers.Checkpointable):
    """What a job runs: ``dvc --wait-for-lock repro --single-item STAGE`` in the workspace, on the job's first task.

    (DVC holds its repository lock for a moment before and after each command; other jobs' DVC waits.)

    The stage runs as DVC runs it for ``dvc repro``, in a fresh interpreter (``VCAREPRO_WARM=0``: a warm
    server started by one job would run another job's stage outside that job's cgroup and signals)
    with ``OMP_NUM_THREADS`` = the job's CPUs unless set. On submitit's checkpoint (``USR2``, sent
    ``signal_delay_s`` before the time limit, and on preemption where the site sets
    ``PreemptParameters=send_user_signal``) the stage is stopped by SIGTERM within ``grace`` seconds,
    DVC records nothing, and submitit requeues the job. A SIGTERM from SLURM itself (``scancel``, the
    limit reached, a preemption without the user signal) stops the stage the same way, and the job
    ends without a result: not requeued by us (SLURM requeues a preempted job where PreemptMode=REQUEUE).
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


SHELLS = {"sh", "dash", "bash", "zsh", "fish", "ksh"}


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


# ----------------------------------------------------------------------------------------------
# SLURM's view of our jobs.


def _slurm(args: Sequence[str]) -> str:
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
            out = _slurm(["squeue", "--me", "--states=all", "--noheader", "--format=%i|%T|%r|%j|%k"])
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


def stop_grace(signal_delay_s: int) -> int:
    """Seconds a job gives its stage to stop after USR2: two thirds of the warning, the rest for submitit's
    requeue, so the job is gone before SLURM's limit."""
    return max(5, signal_delay_s * 2 // 3)


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


PROGRESS_TAIL_BYTES = 1 << 18  # the end of a log that holds its latest progress lines (vcarepro.core.progress)


def progress_log(root: Path, record: "Record") -> Path:
    """Where a stage's progress lines go: a job's stdout (submitit's ``_log.out``), a local stage's one log."""
    return job_paths(root, record.job_id).stdout if record.job_id else root / record.log


def log_progress(path: Path, stage: str = "") -> str:
    """How far the loops in a log have got, from their latest progress lines: ``step 1200/375000 (0.3%), eta
    3d 04:12:00`` (several, ``;``-separated, where seeds train side by side); "" for none."""
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - PROGRESS_TAIL_BYTES))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    named = " ".join(stage.split("@"))  # the label's stage and run: the row names them already
    shown = []
    for line in latest(text.splitlines()):
        label = line.label[len(named) :].strip() if named and line.label.startswith(named) else line.label
        shown.append(f"{label}: {line.summary()}" if label else line.summary())
    return "; ".join(shown)


def repro_command(stage: str) -> List[str]:
    """How a job, or this command for a local stage, runs one stage: DVC's own repro of it alone, waiting for
    DVC's repository lock, which other jobs' DVC holds for a moment before and after each command."""
    return [sys.executable, "-m", "dvc", "--wait-for-lock", "repro", "--single-item", stage]


# ----------------------------------------------------------------------------------------------
# The books: .slurm/jobs.json.


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
        return {
            "job_id": self.job_id,
            "state": self.state,
            "log": self.log,
            "message": self.message,
            "fix": self.fix,
            "pushed": self.pushed,
        }


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


# ----------------------------------------------------------------------------------------------
# The driver.


class Driver:
    def __init__(self, root: Path, max_jobs: int, poll: float, targets: Sequence[str] = (), out=sys.stdout):
        self.root, self.max_jobs, self.poll, self.out = root, max_jobs, poll, out
        self.params = stage_params(root / "params.yaml")
        self.cluster = section(self.params, "cluster")
        self.local = set(self.cluster["local_stages"])
        self.graph = restrict(stage_graph(root), targets)
        self.records = load_records(root)
        for stage in self.graph:  # a bad size is refused now, not when the stage comes up hours later
            if stage not in self.local and kind(stage) not in self.local:
                job_parameters(stage, self.params, root)
        for record in self.records.values():  # a stage an interrupted command ran here died with it
            if record.state == "submitted" and not record.job_id:
                record.state = "interrupted"
        self.local_proc: Optional[tuple] = None  # (stage, Popen, log path)
        self.finished_here: Set[str] = set()  # stages that ended (either way) during this command
        self.last_state: Dict[str, tuple] = {}
        self.watching = False
        self.remote = remote.default_remote(root)  # "" when the workspace has no default remote: nothing is pushed

    def relative(self, path: Path) -> str:
        path = Path(path)
        return str(path.relative_to(self.root) if path.is_absolute() and path.is_relative_to(self.root) else path)

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    # one stage's job
    def submit(self, stage: str) -> None:
        executor = submitit.SlurmExecutor(
            folder=str(self.root / LOG_DIR / "%j"), max_num_timeout=self.cluster["max_requeues"]
        )
        parameters = job_parameters(stage, self.params, self.root)
        executor.update_parameters(**parameters)
        grace = stop_grace(self.cluster["signal_delay_s"])
        try:
            job = executor.submit(StageJob(grace), stage, str(self.root))
        except Exception as err:  # sbatch refused it: a partition, account or QOS the cluster does not know
            raise ClusterError(
                f"sbatch refused {stage}: {last_line(str(err))}; check cluster.partition, "
                f"cluster.account and cluster.qos in params.yaml against `sinfo` / `sacctmgr show assoc`."
            ) from None
        log = self.relative(job_paths(self.root, job.job_id).stderr)
        self.records[stage] = Record(stage, job.job_id, "submitted", log)
        save_records(self.root, self.records)
        gpus = parameters.get("gpus_per_node", 0)
        self.say(
            f"submitted {stage} as job {job.job_id} ({parameters['nodes']} node(s), {gpus} GPU(s) per node, "
            f"{parameters['cpus_per_task']} CPU(s), {parameters['time']} min); log {log}"
        )

    def start_local(self, stage: str) -> None:
        log = self.root / LOCAL_LOGS / f"{stage}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        handle = log.open("w")
        proc = subprocess.Popen(
            repro_command(stage), cwd=self.root, env=dvc_env(), stdout=handle, stderr=subprocess.STDOUT
        )
        handle.close()
        self.local_proc = (stage, proc, log)
        self.records[stage] = Record(stage, "", "submitted", str(log.relative_to(self.root)))
        save_records(self.root, self.records)
        self.say(f"running {stage} here; log {log.relative_to(self.root)}")

    def done(self, stage: str, where: str = "") -> None:
        """``stage`` is done: recorded, and its outputs pushed to the default remote where there is one."""
        record = self.records[stage]
        record.state = "done"
        self.finished_here.add(stage)
        save_records(self.root, self.records)
        self.say(f"done {stage}{where}")
        if not self.remote:
            return
        trouble = remote.push_stage(self.root, stage)
        record.pushed = "yes" if trouble is None else f"failed: {trouble}"
        save_records(self.root, self.records)
        if trouble is None:
            self.say(f"pushed {stage}'s outputs to remote '{self.remote}'")
        else:
            self.say(f"could not push {stage}'s outputs to remote '{self.remote}': {trouble}; `dvc push` sends them")

    def failed(self, stage: str, log: Path, why: str) -> None:
        record = self.records[stage]
        record.state, record.message, record.fix = "failed", [why, *log_tail(log)], fix_line(log)
        if self.watching:  # a job that ended while no command watched is submitted again by this one
            self.finished_here.add(stage)
        save_records(self.root, self.records)
        where = f"job {record.job_id}" if record.job_id else "here"
        self.say(f"FAILED {stage} ({where}): {why}; log {record.log}")
        for line in record.message[1:]:
            self.say(f"    | {line}")
        if record.fix:
            self.say(f"    fix: {record.fix}")

    def update(self) -> bool:
        """Collect what ended; True when something did."""
        changed = False
        if self.local_proc is not None:
            stage, proc, log = self.local_proc
            if proc.poll() is not None:
                self.local_proc = None
                changed = True
                if proc.returncode == 0:
                    self.done(stage)
                else:
                    self.failed(stage, log, f"`dvc repro --single-item {stage}` exited with {proc.returncode}")
        listed = our_jobs(self.root)
        for job in listed.values():  # a job submitted just before an interruption, not yet in the books
            record = self.records.get(job.stage)
            if job.state in ACTIVE and (record is None or record.job_id != job.job_id):
                self.records[job.stage] = Record(
                    job.stage, job.job_id, "submitted", self.relative(job_paths(self.root, job.job_id).stderr)
                )
                save_records(self.root, self.records)
                self.say(f"found {job.stage} as job {job.job_id} ({job.state.lower()}), not submitted again")
        for stage, record in list(self.records.items()):
            if record.state != "submitted" or not record.job_id:
                continue
            job = listed.get(record.job_id)
            if job is not None and job.state in ACTIVE:
                state = "queued" if job.state in QUEUED else "running"
                seen = (state, job.reason if state == "queued" else "")
                if self.last_state.get(stage) != seen:
                    before = self.last_state.get(stage, ("", ""))[0]
                    word = "requeued" if state == "queued" and before == "running" else state
                    why = (
                        f" ({job.state}: {job.reason})" if state == "queued" and job.reason not in ("", "None") else ""
                    )
                    self.say(f"{stage}: job {record.job_id} {word}{why}")
                self.last_state[stage] = seen
                continue
            result = outcome(self.root, record.job_id)
            changed = True
            log = job_paths(self.root, record.job_id).stderr
            if result is not None and result[0] == "success":
                self.done(stage, f" (job {record.job_id})")
            elif result is not None:
                self.failed(stage, log, f"job {record.job_id} failed")
            else:
                state = job.state if job is not None else "no longer listed by squeue"
                self.failed(
                    stage,
                    log,
                    f"job {record.job_id} ended without a result (SLURM: {state}); "
                    f"a time limit beyond cluster.max_requeues, memory, or a scancel",
                )
        return changed

    def busy(self) -> Set[str]:
        return {s for s, r in self.records.items() if r.state == "submitted"}

    def stop_local(self) -> None:
        """The stage this command runs itself stops with it (SIGTERM; DVC records nothing)."""
        if self.local_proc is not None and self.local_proc[1].poll() is None:
            supervise.stop(self.local_proc[1], 60)  # SIGTERM, SIGKILL after 60 s

    def active_jobs(self) -> int:
        return sum(1 for r in self.records.values() if r.state == "submitted" and r.job_id)

    def step(self, changed: Set[str]) -> bool:
        """Start what can start; False when nothing runs and nothing can start."""
        for stage in ready_stages(self.graph, changed):
            record = self.records.get(stage)
            if record is not None and record.state == "submitted":
                continue
            if stage in self.finished_here:
                if record is not None and record.state == "done":  # ran, and DVC still says changed
                    self.failed(
                        stage,
                        self.root / record.log,
                        "it ran, yet `dvc status` still reports it changed (were params.yaml or the code "
                        "edited meanwhile?)",
                    )
                continue
            if stage in self.local or kind(stage) in self.local:
                if self.local_proc is None:
                    self.start_local(stage)
            elif self.active_jobs() < self.max_jobs:
                self.submit(stage)
        return self.local_proc is not None or self.active_jobs() > 0

    def run(self) -> int:
        self.update()  # what ended while no command watched
        self.watching = True
        changed = out_of_date(self.root, self.graph, self.busy())
        while True:
            running = self.step(changed)
            if not running:
                break
            time.sleep(self.poll)
            if self.update():
                changed = out_of_date(self.root, self.graph, self.busy())
        changed = out_of_date(self.root, self.graph, self.busy())
        failed = sorted(s for s in self.finished_here if self.records[s].state == "failed")
        if not todo_stages(self.graph, changed):
            self.say(f"every stage is up to date ({len(self.graph)} stages); dvc.lock records them")
            return 0
        blocked = sorted(todo_stages(self.graph, changed) - set(failed))
        self.say(
            f"{len(failed)} stage(s) failed: {', '.join(failed)}; {len(blocked)} stage(s) wait for them. "
            f"Fix what the logs say, then run `python -m vcarepro.tools.cluster run` again."
        )
        return 1


def status_rows(root: Path) -> List[Dict[str, Any]]:
    """Every stage: its state (done / queued / running / failed / ready / waiting), job id, log, note, a
    running one's progress, and a failed one's last log lines."""
    graph = stage_graph(root)
    records = load_records(root)
    listed = our_jobs(root)
    busy = {
        s
        for s, r in records.items()
        if r.state == "submitted" and (not r.job_id or (r.job_id in listed and listed[r.job_id].state in ACTIVE))
    }
    changed = out_of_date(root, graph, busy)
    todo = todo_stages(graph, changed)
    rows = []
    for stage in topological(graph):
        record = records.get(stage)
        job = listed.get(record.job_id) if record is not None and record.job_id else None
        row = {
            "stage": stage,
            "job": record.job_id if record else "",
            "log": record.log if record else "",
            "note": "",
            "tail": [],
            "progress": "",
        }
        if job is not None and job.state in ACTIVE:
            row["state"] = "queued" if job.state in QUEUED else "running"
            row["note"] = job.reason if job.reason not in ("None", "") else ""
        elif record is not None and record.state == "submitted" and not record.job_id:
            row["state"] = "running" if stage in todo else "done"
        elif stage not in todo:
            row["state"] = "done"
        elif record is not None and record.state == "failed":
            row["state"] = "failed"
            row["note"] = " / ".join(record.message[:1] + ([record.fix] if record.fix else []))
            row["tail"] = record.message[1:]
        elif ancestors(graph, stage) & todo:
            row["state"] = "waiting"
        else:
            row["state"] = "ready"
        if row["state"] == "running":  # how far it has got: its log's latest progress lines
            row["progress"] = log_progress(progress_log(root, record), stage)
        rows.append(row)
    return rows


def print_status(root: Path, out=sys.stdout) -> None:
    rows = status_rows(root)
    for line in status_lines(rows):
        print(line, file=out)
    for r in rows:
        if r["state"] == "failed":
            print(f"\n{r['stage']} (job {r['job'] or 'here'}) failed; last lines of {r['log']}:", file=out)
            for line in r["tail"]:
                print(f"    | {line}", file=out)
    counts = {
        s: sum(1 for r in rows if r["state"] == s) for s in ("done", "queued", "running", "failed", "ready", "waiting")
    }
    print("\n" + ", ".join(f"{n} {s}" for s, n in counts.items()), file=out)
    print(backup_line(root), file=out)


def backup_line(root: Path) -> str:
    """What the default remote lacks of the workspace's cache, in one line (or that there is no remote)."""
    name = remote.default_remote(root)
    if not name:
        return "no default DVC remote: nothing is backed up (`dvc remote add -d NAME URL`; docs/lab.md)"
    missing, trouble = remote.not_pushed(root)
    if trouble:
        return f"could not read remote '{name}': {trouble}"
    if not missing:
        return f"every output in the cache is on remote '{name}'"
    shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
    return f"not on remote '{name}' yet: {len(missing)} output(s), {shown}; `dvc push` sends them"


def status_lines(rows: Sequence[Mapping[str, Any]]) -> List[str]:
    """The table of ``status``: stage, state, job, how far a running one has got (a column only while one
    reports: :func:`log_progress`), log; a row's note below it."""
    width = max(len(r["stage"]) for r in rows)
    shown = max((len(r.get("progress") or "") for r in rows), default=0)
    column = (lambda text: f"{text:<{max(shown, len('progress'))}} ") if shown else (lambda text: "")
    lines = [f"{'stage':<{width}}  {'state':<8} {'job':<8} {column('progress')}log"]
    for r in rows:
        lines.append(
            f"{r['stage']:<{width}}  {r['state']:<8} {r['job']:<8} {column(r.get('progress') or '')}{r['log']}"
        )
        if r["note"]:
            lines.append(f"{'':<{width}}  {r['note']}")
    return lines


def cancel(root: Path) -> int:
    with _DriverLock(root, "cancel"):  # a running `run` would take the cancelled jobs as failed and go on
        jobs = our_jobs(root)
        if jobs:
            _slurm(["scancel", *sorted(jobs)])
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
    parser = argparse.ArgumentParser(prog="python -m vcarepro.tools.cluster", description=__doc__.split("\n\n")[0])
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


if __name__ == "__main__":
    # Through the importable module, so that jobs pickle vcarepro.tools.cluster.StageJob by reference, not __main__'s.
    from vcarepro.core.errors import interruptible
    from vcarepro.tools.cluster import main as _main

    interruptible()  # Ctrl-C reaches the driver even when started as a background job of a script
    raise SystemExit(_main())
