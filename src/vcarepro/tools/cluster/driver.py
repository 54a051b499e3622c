"""``run``: each stage's job sized from params.yaml, submitted once everything upstream is done, watched to its
end, and recorded in the books (docs/cluster.md)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence, Set, Tuple

import submitit

from vcarepro.core import supervise
from vcarepro.params.config import section, stage_params
from vcarepro.tools import remote
from vcarepro.tools.cluster.job import StageJob, repro_command
from vcarepro.tools.cluster.slurm import (
    ACTIVE,
    JOB_NAME,
    LOCAL_LOGS,
    LOG_DIR,
    QUEUED,
    ClusterError,
    Record,
    fix_line,
    job_paths,
    load_records,
    log_tail,
    our_jobs,
    outcome,
    save_records,
)
from vcarepro.tools.cluster.stages import out_of_date, ready_stages, restrict, stage_graph, todo_stages
from vcarepro.tools.remote import dvc_env, last_line

TRAINING_STAGES = ("train_cls", "train_gen")  # the stages whose command is the distributed launcher


def kind(stage: str) -> str:
    return stage.split("@", 1)[0]


def training_gpus(params: Mapping[str, Any]) -> Tuple[int, int]:
    """(nodes, GPUs per node) of a training job: distributed.nnodes x distributed.nproc_per_node, cluster.nodes and
    cluster.gpus_per_node standing in where those say env or gpu (the preflight's estimate counts them too)."""
    c, dist = section(params, "cluster"), section(params, "distributed")
    nodes = dist["nnodes"] if isinstance(dist["nnodes"], int) else c["nodes"]
    per_node = dist["nproc_per_node"] if isinstance(dist["nproc_per_node"], int) else c["gpus_per_node"]
    return nodes, per_node


def job_parameters(stage: str, params: Mapping[str, Any], root: Path) -> Dict[str, Any]:
    """submitit's SlurmExecutor parameters for ``stage`` (see conf/config.yaml ``cluster`` for each)."""
    c = section(params, "cluster")
    dist = section(params, "distributed")
    training = kind(stage) in TRAINING_STAGES
    nodes, gpus = 1, (1 if c["gpu"] else 0)
    if training:
        nodes, per_node = training_gpus(params)
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


def stop_grace(signal_delay_s: int) -> int:
    """Seconds a job gives its stage to stop after USR2: two thirds of the warning, the rest for submitit's
    requeue, so the job is gone before SLURM's limit."""
    return max(5, signal_delay_s * 2 // 3)


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
