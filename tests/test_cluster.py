"""`python -m vcarepro.tools.cluster`: every stage a SLURM job, DVC keeping the books.

The fast tests check how a job is sized from params.yaml and which stages may start. The slow ones
start a real one-node SLURM (Debian's slurm-wlm and munge, tests/slurm_node.py, in a private network
namespace) and drive a micro pipeline through the command: two training runs as two simultaneous
jobs, one of them preempted (SLURM's USR2, what submitit's timeout and preemption path answers) and
requeued, the command interrupted and started again, then a run that fails for a user error.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import networkx as nx
import psutil
import pytest
import yaml

from helpers import ROOT, micro_params, reproduced_repo, sh
from vcarepro.params.config import compose
from vcarepro.tools.cluster import stages
from vcarepro.tools.cluster.driver import job_parameters
from vcarepro.tools.cluster.slurm import JOB_NAME, ClusterError

# ---------------------------------------------------------------------------------------------
# A job's size and the order of stages, without SLURM.


def paper_params(**cluster_overrides) -> dict:
    params = compose(["scale=paper"])
    params["cluster"].update(cluster_overrides)
    return params


def test_a_training_job_is_sized_by_distributed_and_the_cluster_section():
    params = paper_params(partition="gpu", account="lab", qos="high", mem_gb=400)
    params["distributed"].update(nnodes=1, nproc_per_node=4)
    job = job_parameters("train_cls@deit_tiny-vca", params, Path("/ws"))
    assert job == {
        "job_name": "vcarepro:train_cls@deit_tiny-vca",
        "comment": "/ws",
        "nodes": 1,
        "ntasks_per_node": 1,
        "cpus_per_task": 10,
        "time": 2880,
        "signal_delay_s": 300,
        "stderr_to_stdout": False,
        "additional_parameters": {"requeue": True},
        "gpus_per_node": 4,
        "partition": "gpu",
        "account": "lab",
        "qos": "high",
        "mem": "400GB",
    }
    other = job_parameters("eval_cls@deit_tiny-vca", params, Path("/ws"))
    assert (other["nodes"], other["gpus_per_node"], other["time"]) == (1, 1, 600)


def test_env_and_gpu_words_take_the_cluster_sections_sizes():
    params = paper_params(nodes=4, gpus_per_node=8)
    params["distributed"].update(nnodes="env", nproc_per_node="gpu", launcher="srun", rdzv_endpoint="env")
    job = job_parameters("train_gen@dit_s2-vca", params, Path("/ws"))
    assert (job["nodes"], job["gpus_per_node"]) == (4, 8)


def test_a_multi_node_job_without_the_srun_launcher_is_refused_in_one_sentence():
    params = paper_params(nodes=2)
    params["distributed"].update(nnodes="env", launcher="torchrun")
    with pytest.raises(ClusterError, match="set distributed.launcher: srun"):
        job_parameters("train_cls@deit_tiny-vca", params, Path("/ws"))


def test_cpu_scales_ask_for_no_gpus():
    params = compose([])
    job = job_parameters("train_cls@deit_tiny-vca", params, Path("/ws"))
    assert "gpus_per_node" not in job and job["cpus_per_task"] == 1


GRAPH = nx.DiGraph(  # DVC's direction: a stage -> the stages it reads from
    {
        "prep": [],
        "train@a": ["prep"],
        "train@b": ["prep"],
        "eval@a": ["train@a", "prep"],
        "eval@b": ["train@b", "prep"],
        "report": ["eval@a", "eval@b"],
    }
)


def test_a_stage_starts_only_when_everything_upstream_is_done():
    assert stages.ready_stages(GRAPH, {"prep", "train@a"}) == ["prep"]
    # prep done: both trainings at once; eval@a waits although DVC does not (yet) call it changed
    assert stages.ready_stages(GRAPH, {"train@a", "train@b"}) == ["train@a", "train@b"]
    assert stages.todo_stages(GRAPH, {"train@a"}) == {"train@a", "eval@a", "report"}
    assert stages.ready_stages(GRAPH, {"eval@b", "report"}) == ["eval@b"]
    assert stages.ready_stages(GRAPH, set()) == []
    order = stages.topological(GRAPH)
    assert all(order.index(up) < order.index(s) for s, up in GRAPH.edges)


def test_targets_bring_in_what_they_need_and_unknown_ones_are_named():
    assert set(stages.restrict(GRAPH, ["eval@a"])) == {"eval@a", "train@a", "prep"}
    assert stages.restrict(GRAPH, []) == GRAPH
    with pytest.raises(ClusterError, match="no stage 'eval@c' in dvc.yaml"):
        stages.restrict(GRAPH, ["eval@c"])


def test_the_stage_graph_is_dvcs_own():
    graph = stages.stage_graph(ROOT)
    assert set(graph["eval_cls@deit_tiny-vca"]) == {"train_cls@deit_tiny-vca", "prepare_cls", "check_params"}
    assert set(graph["check_params"]) == set() and nx.ancestors(graph, "check_params") == set(graph) - {"check_params"}
    assert "report" in graph and not any("report" in ups for ups in graph.adj.values())


def test_the_cluster_section_is_checked(tmp_path):
    from vcarepro.params.schema import ParamsError, validate

    params = compose([])
    params["cluster"]["cpus_per_task"] = 0
    with pytest.raises(ParamsError, match="cluster.cpus_per_task must be an integer >= 1"):
        validate(params)


# ---------------------------------------------------------------------------------------------
# A real SLURM.

TOOLS = ("slurmctld", "slurmd", "munged", "sbatch", "squeue", "scontrol", "sacct", "unshare", "nsenter", "ip")
SEARCH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/local/sbin", "/usr/sbin", "/sbin"])  # Debian's daemons
MISSING = [t for t in TOOLS if shutil.which(t, path=SEARCH) is None]
REQUIRED = os.environ.get("VCAREPRO_REQUIRE_SLURM") == "1"  # .ci/run: fail, not skip


def need_slurm():
    why = (
        f"{', '.join(MISSING)} missing (apt-get install slurm-wlm munge)"
        if MISSING
        else None
        if os.geteuid() == 0
        else "the test cluster's daemons run as root"
    )
    if why and REQUIRED:
        pytest.fail(f"VCAREPRO_REQUIRE_SLURM=1 and {why}")
    if why:
        pytest.skip(why)


class OneNodeSlurm:
    """tests/slurm_node.py in its own network, UTS, mount and PID namespaces; commands enter them."""

    def __init__(self, directory: Path):
        self.dir = directory
        directory.mkdir(parents=True)
        self.log = (directory / "node.log").open("w")
        self.holder = subprocess.Popen(
            [
                shutil.which("unshare", path=SEARCH),
                "--net",
                "--uts",
                "--mount",
                "--pid",
                "--fork",
                "--kill-child",
                "--mount-proc",
                sys.executable,
                str(ROOT / "tests" / "slurm_node.py"),
                str(directory),
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 90
        while not (directory / "ready").exists():
            if self.holder.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise AssertionError(f"the test cluster did not start:\n{(directory / 'node.log').read_text()}")
            time.sleep(0.2)
        self.init_pid = psutil.Process(self.holder.pid).children()[0].pid  # the namespace's pid 1, seen from here

    def command(self, args, cwd=None) -> list:
        wd = [f"--wd={cwd}"] if cwd else []  # entering the mount namespace would start in its /
        return [
            shutil.which("nsenter", path=SEARCH),
            f"--target={self.init_pid}",
            "--net",
            "--uts",
            "--mount",
            "--pid",
            *wd,
            "--",
            "env",
            f"SLURM_CONF={self.dir / 'slurm.conf'}",
            *args,
        ]

    def env(self) -> dict:
        return {**os.environ, "DVC_NO_ANALYTICS": "1", "PATH": f"{Path(sys.executable).parent}:{SEARCH}"}

    def run(self, *args, cwd=None, check=True) -> subprocess.CompletedProcess:
        result = subprocess.run(
            self.command(args, cwd), cwd=cwd, capture_output=True, text=True, env=self.env(), timeout=900
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"{' '.join(args)} failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
            )
        return result

    def start(self, *args, cwd, out: Path) -> subprocess.Popen:
        return subprocess.Popen(
            self.command(args, cwd), cwd=cwd, env=self.env(), stdout=out.open("w"), stderr=subprocess.STDOUT
        )

    @staticmethod
    def interrupt(started: subprocess.Popen, sig=signal.SIGINT) -> None:
        """Send ``sig`` to the command itself (nsenter, which started it, does not pass signals on)."""
        try:
            children = psutil.Process(started.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return  # it has ended already
        for child in children:
            try:
                if "vcarepro.tools.cluster" in child.cmdline():
                    child.send_signal(sig)
            except psutil.NoSuchProcess:  # a `dvc status` of the command's, gone meanwhile
                pass

    def close(self) -> None:
        if self.holder.poll() is None:
            try:  # the namespace's init goes, and the kernel ends every daemon and job with it
                os.kill(self.init_pid, signal.SIGTERM)
            except (AttributeError, ProcessLookupError):
                self.holder.terminate()  # --kill-child: unshare's end is the init's
            try:
                self.holder.wait(30)
            except subprocess.TimeoutExpired:
                self.holder.kill()
        self.log.close()


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    need_slurm()
    node = OneNodeSlurm(tmp_path_factory.mktemp("slurm") / "node")
    yield node
    node.close()


CLS, TWIN = "deit_tiny-vca", "deit_tiny-vca-twin"  # the same run under two names: the twin is never interrupted
GEN = "dit_s2-vca"  # its training, sampling and evaluation are jobs too
SHARED = (
    "smoke_inputs prepare_cls prepare_gen fid_reference cls_reference complexity attention_cost "
    "calibrate_cls calibrate_gen"
)
EPOCHS = 10


def completions(node: OneNodeSlurm) -> list:
    """``sacct --completion``: every end of a job (a requeue is one too), oldest first."""
    out = node.run(
        "sacct", "--completion", "--noheader", "--parsable2", "--format=JobID,JobName,State,Start,End"
    ).stdout
    rows = [dict(zip(("id", "name", "state", "start", "end"), line.split("|"))) for line in out.splitlines() if line]
    for row in rows:
        row["start"], row["end"] = datetime.fromisoformat(row["start"]), datetime.fromisoformat(row["end"])
    return rows


def records(repo: Path) -> dict:
    return json.loads((repo / ".slurm" / "jobs.json").read_text())


def wait(condition, what: str, timeout: float = 300, driver: subprocess.Popen | None = None, log: Path | None = None):
    deadline = time.monotonic() + timeout
    while not condition():
        if driver is not None and driver.poll() is not None:
            raise AssertionError(f"the command ended ({driver.returncode}) before {what}:\n{log.read_text()[-4000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} in {timeout} s" + (f":\n{log.read_text()[-4000:]}" if log else ""))
        time.sleep(0.5)


def running_jobs(node: OneNodeSlurm) -> set:
    out = node.run("squeue", "--noheader", "--states=RUNNING", "--format=%j").stdout
    return {line.strip().removeprefix(JOB_NAME) for line in out.splitlines() if line.strip()}


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    need_slurm()
    params = micro_params(cls_runs=[CLS], gen_runs=[GEN])
    params["cls_runs"][TWIN] = dict(params["cls_runs"][CLS])
    params["cls_recipe_overrides"]["epochs"] = EPOCHS
    params["cluster"].update(poll_seconds=1)
    repo = reproduced_repo(tmp_path_factory.mktemp("cluster") / "repo", params, targets=SHARED)
    sh("git add -A && git -c user.name=t -c user.email=t@t commit -qm shared", repo)
    # the lab's backup (docs/lab.md): a default remote, here a path (in config.local: the checkout stays clean)
    sh(f"dvc remote add --local -d lab {repo.parent / 'remote'}", repo)
    return repo


@pytest.mark.slow
@pytest.mark.alone
def test_two_runs_as_simultaneous_jobs_one_preempted_and_requeued_end_bit_identical(slurm, repo):
    before = slurm.run(sys.executable, "-m", "vcarepro.tools.cluster", "status", cwd=repo).stdout
    assert "not on remote 'lab' yet: " in before and "data/cls" in before, before  # what the fixture ran, unpushed
    log1 = repo.parent / "driver1.log"
    started = time.monotonic()
    driver = slurm.start(sys.executable, "-m", "vcarepro.tools.cluster", "run", "--max-jobs", "2", cwd=repo, out=log1)
    try:
        ckpt = repo / "checkpoints" / "cls" / CLS / "seed_0" / "last.pt"
        wait(
            lambda: ckpt.exists() and {f"train_cls@{CLS}", f"train_cls@{TWIN}"} <= running_jobs(slurm),
            "checkpoint while both trainings run",
            driver=driver,
            log=log1,
        )
        job = records(repo)[f"train_cls@{CLS}"]["job_id"]
        twin_job = records(repo)[f"train_cls@{TWIN}"]["job_id"]
        slurm.run("scancel", "--signal=USR2", job)  # what SLURM sends before the time limit and on preemption
        wait(lambda: f"train_cls@{CLS}: job {job} requeued" in log1.read_text(), "requeue", driver=driver, log=log1)
        # the command is interrupted while its jobs run, then started again: nothing is submitted twice
        slurm.interrupt(driver)
        assert driver.wait(60) == 130, log1.read_text()[-3000:]
        assert "the jobs SLURM holds keep running" in log1.read_text()
    finally:
        if driver.poll() is None:
            driver.kill()
    log2 = repo.parent / "driver2.log"
    again = slurm.start(sys.executable, "-m", "vcarepro.tools.cluster", "run", "--max-jobs", "2", cwd=repo, out=log2)
    assert again.wait(600) == 0, log2.read_text()[-4000:]
    took = time.monotonic() - started
    text1, text2 = log1.read_text(), log2.read_text()
    submitted = re.findall(r"^submitted (\S+) as job", text1 + text2, re.M)
    assert sorted(submitted) == sorted(set(submitted)), submitted  # none twice
    assert f"train_cls@{CLS}" in submitted and f"submitted train_cls@{CLS}" not in text2, text2
    assert records(repo)[f"train_cls@{CLS}"]["job_id"] == job

    # two jobs ran at once: sacct's completion records overlap in time; the preempted one ended twice
    ends = completions(slurm)
    ours = [r for r in ends if r["id"] == job]
    twin = [r for r in ends if r["id"] == twin_job]
    # (jobcomp logs a requeue with the state the job is left in: PENDING, waiting to start again)
    assert [r["state"] for r in ours] in (["REQUEUED", "COMPLETED"], ["PENDING", "COMPLETED"]), ends
    assert [r["state"] for r in twin] == ["COMPLETED"], ends
    assert ours[0]["start"] < twin[0]["end"] and twin[0]["start"] < ours[0]["end"], ends
    assert "Restarts=1" in slurm.run("scontrol", "show", "job", job).stdout

    # the requeued job resumed from its checkpoint and ended on the uninterrupted twin's bits
    err = repo / records(repo)[f"train_cls@{CLS}"]["log"]
    job_log = err.read_text() + err.with_name(err.name.replace("_log.err", "_log.out")).read_text()
    assert f"train_cls {CLS} seed 0: stopped by SIGTERM at epoch" in job_log, job_log[-3000:]
    assert "seed 0: resuming at epoch" in job_log, job_log[-3000:]
    weights = [
        (repo / "runs" / "cls" / run / "train" / "seed_0" / "model.safetensors").read_bytes() for run in (CLS, TWIN)
    ]
    assert weights[0] == weights[1]

    # DVC kept the books: every stage recorded in the one dvc.lock, nothing left to run
    lock = yaml.safe_load((repo / "dvc.lock").read_text())["stages"]
    jobs = (
        f"train_cls@{CLS}",
        f"train_cls@{TWIN}",
        f"eval_cls@{CLS}",
        f"eval_cls@{TWIN}",
        f"train_gen@{GEN}",
        f"sample_gen@{GEN}",
        f"eval_gen@{GEN}",
    )
    for stage in (*jobs, "report"):
        assert stage in lock, stage
    assert "Data and pipelines are up to date" in sh("dvc status", repo).stdout
    for stage in jobs[2:]:
        assert f"submitted {stage} as job" in text1 + text2
    assert "running report here" in text2 and "every stage is up to date" in text2
    status = slurm.run(sys.executable, "-m", "vcarepro.tools.cluster", "status", cwd=repo).stdout
    assert f"train_cls@{CLS}" in status and f" done     {job} " in status, status
    # each stage's outputs went to the default remote as it finished: the report's last, then nothing is missing
    for stage in (*jobs, "report"):
        assert f"pushed {stage}'s outputs to remote 'lab'" in text1 + text2, stage
        assert records(repo)[stage]["pushed"] == "yes", stage
    sh("dvc push", repo)  # the shared stages ran before the driver: pushed by hand, as its status line says
    status = slurm.run(sys.executable, "-m", "vcarepro.tools.cluster", "status", cwd=repo).stdout
    assert status.rstrip().endswith("every output in the cache is on remote 'lab'"), status
    print(
        f"\ncluster figures: two trainings of {EPOCHS} epochs as two jobs, one requeued, the command "
        f"interrupted once; {took:.0f} s from the first submission to every stage recorded"
    )


@pytest.mark.slow
@pytest.mark.alone
def test_a_job_that_fails_for_a_user_error_is_not_requeued_and_its_fix_is_shown(slurm, repo):
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["models"]["deit_tiny-vca-broken"] = {"arch": "deit_tiny", "attention": "vca", "options": {"stage1": "bogus"}}
    params["cls_runs"]["deit_tiny-vca-broken"] = {**params["cls_runs"][CLS], "model": "deit_tiny-vca-broken"}
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    log = repo.parent / "driver3.log"
    driver = slurm.start(sys.executable, "-m", "vcarepro.tools.cluster", "run", "--max-jobs", "2", cwd=repo, out=log)
    assert driver.wait(600) == 1, log.read_text()[-4000:]
    text = log.read_text()
    stage = "train_cls@deit_tiny-vca-broken"
    assert f"FAILED {stage} (job " in text, text
    fix = "fix: error: unknown stage1 'bogus'; choose one of 'vca', 'diff'."
    assert fix in text, text
    # the complexity stage builds every model, and fails the same way; what reads either waits
    assert re.search(r"2 stage\(s\) failed: complexity, train_cls@deit_tiny-vca-broken; 2 stage\(s\) wait", text), text
    job = records(repo)[stage]["job_id"]
    assert "Restarts=0" in slurm.run("scontrol", "show", "job", job).stdout
    assert [r["state"] for r in completions(slurm) if r["id"] == job] == ["FAILED"]
    status = slurm.run(sys.executable, "-m", "vcarepro.tools.cluster", "status", cwd=repo).stdout
    assert re.search(rf"^{stage} +failed ", status, re.M) and "unknown stage1 'bogus'" in status, status
    assert re.search(r"^eval_cls@deit_tiny-vca-broken +waiting ", status, re.M), status


@pytest.mark.slow
@pytest.mark.alone
def test_the_srun_launcher_starts_its_ranks_inside_a_cluster_job(slurm, repo, tmp_path):
    """distributed.launcher srun for real: the job's stage starts torchrun with `srun --overlap` inside the job,
    and torchrun's two ranks train together (the command strings of tests/test_launch.py, run)."""
    copy = tmp_path / "repo"
    shutil.copytree(repo, copy, symlinks=True, ignore=shutil.ignore_patterns(".slurm", "checkpoints"))
    params = yaml.safe_load((copy / "params.yaml").read_text())
    params["distributed"].update(launcher="srun", nproc_per_node=2, rdzv_endpoint="env")
    params["cluster"]["cpus_per_task"] = 2
    params["cls_recipe_overrides"]["epochs"] = 6
    (copy / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    stage = f"train_cls@{CLS}"
    log = tmp_path / "driver.log"
    driver = slurm.start(
        sys.executable, "-m", "vcarepro.tools.cluster", "run", stage, "--max-jobs", "1", cwd=copy, out=log
    )
    ckpt = copy / "checkpoints" / "cls" / CLS / "seed_0" / "last.pt"
    wait(ckpt.exists, "checkpoint of the two-rank training", driver=driver, log=log)
    job = records(copy)[stage]["job_id"]
    slurm.run("scancel", "--signal=USR2", job)  # reaches the job's step and the stage's own srun step
    assert driver.wait(600) == 0, log.read_text()[-4000:]
    text = log.read_text()
    assert f"submitted {stage} as job" in text and "every stage is up to date (4 stages)" in text, text
    assert f"{stage}: job {job} requeued" in text, text
    err = copy / records(copy)[stage]["log"]
    job_log = err.read_text() + err.with_name(err.name.replace("_log.err", "_log.out")).read_text()
    assert f"train_cls {CLS} seed 0: stopped by SIGTERM at epoch" in job_log, job_log[-3000:]
    assert "seed 0: resuming at epoch" in job_log, job_log[-3000:]
    summary = json.loads((copy / "runs" / "cls" / CLS / "live" / "metrics.json").read_text())
    assert summary["seed_0"]["world_size"] == 2 and summary["seed_0"]["epoch"] == 6
    lock = yaml.safe_load((copy / "dvc.lock").read_text())["stages"][stage]
    assert "--launcher srun" in lock["cmd"] and "--nproc-per-node 2" in lock["cmd"]
    assert "Data and pipelines are up to date" in sh(f"dvc status {stage}", copy).stdout


@pytest.mark.slow
@pytest.mark.alone
def test_cancel_ends_a_running_job_for_good_and_the_next_run_submits_it_again(slurm, repo, tmp_path):
    copy = tmp_path / "repo"
    shutil.copytree(repo, copy, symlinks=True, ignore=shutil.ignore_patterns(".slurm", "checkpoints"))
    params = yaml.safe_load((copy / "params.yaml").read_text())
    params["cls_recipe_overrides"]["epochs"] = 3000  # not done before it is cancelled
    params["progress"]["interval_s"] = 1  # a progress line every second in the job's log
    (copy / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    stage = f"train_cls@{CLS}"
    log = tmp_path / "driver.log"
    driver = slurm.start(
        sys.executable, "-m", "vcarepro.tools.cluster", "run", stage, "--max-jobs", "1", cwd=copy, out=log
    )
    try:
        ckpt = copy / "checkpoints" / "cls" / CLS / "seed_0" / "last.pt"
        wait(ckpt.exists, "checkpoint", driver=driver, log=log)
        # status reads the running job's latest progress line from its SLURM log: step of total and an ETA, the
        # step moving on between two looks
        job = records(copy)[stage]["job_id"]
        row = re.compile(rf"^{re.escape(stage)} +running +{job} +seed 0: step (\d+)/(\d+) \([\d.]+%\), eta \d.*$", re.M)
        looks = []

        def progressed():
            found = row.search(slurm.run(sys.executable, "-m", "vcarepro.tools.cluster", "status", cwd=copy).stdout)
            if found:
                looks.append((int(found[1]), int(found[2])))
                print(f"\ncluster status: {found[0]}")
            return len(looks) >= 2 and looks[-1][0] > looks[0][0]

        wait(progressed, "a running job's progress in cluster status", timeout=120, driver=driver, log=log)
        assert len({total for _, total in looks}) == 1 and looks[-1][0] < looks[0][1]
        refused = slurm.run(sys.executable, "-m", "vcarepro.tools.cluster", "cancel", cwd=copy, check=False)
        assert refused.returncode == 2 and "stop it first (Ctrl-C), then cancel" in refused.stderr, refused.stderr
        slurm.interrupt(driver)
        assert driver.wait(60) == 130
    finally:
        if driver.poll() is None:
            driver.kill()
    job = records(copy)[stage]["job_id"]
    done = slurm.run(sys.executable, "-m", "vcarepro.tools.cluster", "cancel", cwd=copy)
    assert f"cancelled 1 job(s): {stage} ({job})" in done.stdout
    wait(lambda: any(r["id"] == job for r in completions(slurm)), "the cancelled job's end")
    time.sleep(15)  # longer than the test cluster's requeue delay: a requeue would show now
    assert [r["state"] for r in completions(slurm) if r["id"] == job] == ["CANCELLED"]
    assert "Restarts=0" in slurm.run("scontrol", "show", "job", job).stdout
    assert stage not in running_jobs(slurm)
    # the next run says how the job ended and submits the stage anew
    again = slurm.start(
        sys.executable,
        "-m",
        "vcarepro.tools.cluster",
        "run",
        stage,
        "--max-jobs",
        "1",
        cwd=copy,
        out=tmp_path / "again.log",
    )
    try:
        wait(
            lambda: f"submitted {stage} as job" in (tmp_path / "again.log").read_text(),
            "the new submission",
            driver=again,
            log=tmp_path / "again.log",
        )
        text = (tmp_path / "again.log").read_text()
        assert f"FAILED {stage} (job {job}): job {job} ended without a result (SLURM: CANCELLED)" in text, text
    finally:
        slurm.interrupt(again)
        again.wait(60)
        slurm.run(sys.executable, "-m", "vcarepro.tools.cluster", "cancel", cwd=copy)
