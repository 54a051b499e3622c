"""A lab's loop through DVC's own tools (docs/lab.md), on micro repositories that start their one stage as the
project does (stages/run.py, the warm interpreter, this checkout's vcarepro): every experiment runs the code it was
started with (treeverse/dvc#10419), sweeps through DVC's queue, and results that travel through remotes and a shared
cache. The remotes are real servers on 127.0.0.1 that the tests start: moto's S3 server and Debian's openssh-server."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from test_pipeline import sh

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = 'MARKER = "committed"\n'


def lab_repo(repo: Path, **probe) -> Path:
    """A new git repository with this project's package and launcher and one stage, tests/lab_stage.py, whose deps
    are the module it reports and core/; params.yaml (and conf/, for Hydra's -S) hold ``probe`` and the embedded
    scale's numerics profile."""
    probe = {"lr": 0.01, "steps": 0, "files": 2, "file_kib": 4, **probe}
    tracked = sh("git ls-files src/vcarepro", ROOT).stdout.split()
    for rel in [*tracked, "stages/run.py", "stages/warm.py"]:
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, repo / rel)
    shutil.copy2(ROOT / "tests" / "lab_stage.py", repo / "stages" / "lab.py")
    (repo / "src" / "vcarepro" / "lab_marker.py").write_text(COMMITTED)
    numerics = yaml.safe_load((ROOT / "params.yaml").read_text())["numerics"]
    params = {"numerics": numerics, "probe": probe}
    (repo / "conf").mkdir()
    for name in ("conf/config.yaml", "params.yaml"):
        (repo / name).write_text(yaml.safe_dump(params, sort_keys=False))
    stage = {
        "cmd": "python stages/run.py stages/lab.py",
        "deps": ["stages/lab.py", "src/vcarepro/lab_marker.py", "src/vcarepro/core"],
        "params": ["numerics", "probe"],
        "outs": ["data"],
        "metrics": [{"metrics.json": {"cache": False}}],
    }
    (repo / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"lab": stage}}, sort_keys=False))
    (repo / ".gitignore").write_text("__pycache__/\n")
    sh("git init -q && dvc init -q && dvc config core.analytics false && dvc config core.check_update false", repo)
    sh("dvc config hydra.enabled true", repo)  # -S composes conf/ into params.yaml, as in the project
    sh("git add -A && git -c user.name=t -c user.email=t@t commit -qm lab", repo)
    return repo


def commit(repo: Path, message: str) -> None:
    sh(f"git add -A && git -c user.name=t -c user.email=t@t commit -qm '{message}'", repo)


def start_queue(repo: Path, env: dict, jobs: int = 1) -> None:
    """`dvc queue start -j JOBS`, its output not captured: the workers it leaves behind hold the pipes of whoever
    started them until the queue is empty."""
    done = popen(f"dvc queue start -j {jobs}", repo, env, capture=False)
    assert done.wait(timeout=60) == 0


def finish_queue(repo: Path, env: dict, timeout: float = 300) -> str:
    """Wait until no task is queued or running and the workers have stopped; `dvc queue status` then."""
    deadline = time.monotonic() + timeout
    while True:
        status = sh("dvc queue status", repo, env=env).stdout
        busy = any(word in status for word in (" Queued", " Running")) or "0 active, 0 idle" not in status
        if not busy:
            return status
        assert time.monotonic() < deadline, status
        time.sleep(2)


def experiments(repo: Path, failed: bool = False) -> dict:
    """Each finished experiment's name -> its `dvc exp show --json` data (params, metrics, deps); with ``failed``,
    the failed ones' instead (DVC lists those too, with an error and the baseline's metrics)."""
    shown = json.loads(sh("dvc exp show --json", repo).stdout)
    rows = [e for row in shown for e in row.get("experiments") or [] if e.get("name")]
    return {e["name"]: e["revs"][0]["data"] for e in rows if bool(e["revs"][0].get("error")) == failed}


def metrics_of(data: dict) -> dict:
    return data["metrics"]["metrics.json"]["data"]


def md5(text: str) -> str:
    return hashlib.md5(text.encode()).hexdigest()


def editable(repo: Path, **more) -> dict:
    """What README command 1's `pip install -e .` does for the checkout it was run in: its src/ on every
    interpreter's import path (here as an absolute PYTHONPATH, the other form of dvc#10419's trap)."""
    return {"PYTHONPATH": str(repo / "src"), **{k: str(v) for k, v in more.items()}}


def wait_for(path: Path, proc: subprocess.Popen | None = None, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the command ended ({proc.returncode}) before {path} appeared:\n{proc.stdout.read()}")
        assert time.monotonic() < deadline, f"{path} did not appear in {timeout} s"
        time.sleep(0.1)


def popen(cmd: str, cwd: Path, env: dict, capture: bool = True) -> subprocess.Popen:
    return subprocess.Popen(
        cmd,
        shell=True,
        cwd=cwd,
        start_new_session=True,
        stdout=subprocess.PIPE if capture else subprocess.DEVNULL,
        stderr=subprocess.STDOUT if capture else subprocess.DEVNULL,
        text=True,
        env={
            **os.environ,
            "DVC_NO_ANALYTICS": "1",
            "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
            **env,
        },
    )


# -- every experiment runs its own code ------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_queued_experiment_runs_the_code_it_was_queued_with(tmp_path):
    """treeverse/dvc#10419 replayed: change the code, queue, revert the workspace, start the queue. The
    experiment's output is the queued code's, and its lock records that code; the workspace's run is its own."""
    repo = lab_repo(tmp_path / "repo")
    env = editable(repo)
    marker = repo / "src" / "vcarepro" / "lab_marker.py"
    marker.write_text('MARKER = "queued"\n')
    sh("dvc exp run --queue -n queued", repo, env=env)
    marker.write_text(COMMITTED)  # the workspace holds the committed code again
    start_queue(repo, env)
    status = finish_queue(repo, env)
    assert "Success" in status and "Failed" not in status, status
    ran = experiments(repo)["queued"]
    assert metrics_of(ran)["marker"] == "queued"
    assert ran["deps"]["src/vcarepro/lab_marker.py"]["hash"] == md5('MARKER = "queued"\n')
    sh("dvc repro", repo, env=env)
    assert json.loads((repo / "metrics.json").read_text())["marker"] == "committed"


@pytest.mark.slow
def test_a_temp_experiment_keeps_its_copy_while_the_workspace_changes(tmp_path):
    """`dvc exp run --temp` runs in a copy under .dvc/tmp/exps; an edit of the workspace's src/ while its stage
    runs does not reach it, though the workspace's src/ is on the import path (the editable install)."""
    repo = lab_repo(tmp_path / "repo")
    gate = tmp_path / "gate"
    gate.mkdir()
    proc = popen("dvc exp run --temp -n temp", repo, editable(repo, LAB_GATE=gate))
    wait_for(gate / "started", proc)
    assert Path(json.loads((gate / "started").read_text())["cwd"]).is_relative_to(repo / ".dvc" / "tmp" / "exps")
    (repo / "src" / "vcarepro" / "lab_marker.py").write_text('MARKER = "edited"\n')
    (gate / "go").touch()
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out
    assert metrics_of(experiments(repo)["temp"])["marker"] == "committed"


@pytest.mark.slow
def test_a_stage_refuses_a_vcarepro_from_outside_its_checkout(tmp_path):
    """A vcarepro imported before stages/run.py could put its checkout first (here by a sitecustomize) is refused
    in one sentence, exit status 2, and DVC records nothing."""
    repo = lab_repo(tmp_path / "repo")
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(f"import sys\nsys.path.insert(0, {str(ROOT / 'src')!r})\nimport vcarepro\n")
    failed = sh("dvc repro", repo, check=False, env={"PYTHONPATH": str(site)})
    assert failed.returncode != 0
    errors = [line for line in failed.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: this stage imported vcarepro from {ROOT / 'src' / 'vcarepro'}, not from its own checkout's "
        f"{repo.resolve() / 'src' / 'vcarepro'}, so its outputs would not be its code's; remove what imports that "
        "copy first (a sitecustomize or .pth file, python -m from another folder) or run the stage in the checkout "
        "that holds that code."
    ], failed.stderr
    assert "exited with 2" in failed.stderr
    assert not (repo / "dvc.lock").exists() and not (repo / "metrics.json").exists()


# -- sweeps through DVC's queue --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_sweep_runs_two_at_a_time_with_the_bits_of_a_serial_run(tmp_path):
    """docs/lab.md's sweep: `dvc exp run --queue -S 'probe.lr=a,b,c'` (Hydra's sweep syntax), `dvc queue start -j 2`.
    Two experiments run at once in two copies, each through a warm interpreter of its own, and each gives the bits
    (a loss after 30 AdamW steps, under the profile's 2 threads) that a serial `dvc repro` gives. A bad point fails
    alone, its one sentence in `dvc queue logs`; the others finish."""
    repo = lab_repo(tmp_path / "repo", steps=30)
    trace, barrier = tmp_path / "trace", tmp_path / "barrier"
    barrier.mkdir()
    sh("dvc repro", repo, env={"LAB_TRACE": str(trace)})
    commit(repo, "results")
    env = {"LAB_TRACE": str(trace), "LAB_BARRIER": f"{barrier}:2"}  # the two good points wait for each other
    queued = sh("dvc exp run --queue -S 'probe.lr=0.02,-1,0.03'", repo, env=env).stdout
    assert queued.count("Queued experiment") == 3, queued
    start_queue(repo, env, jobs=2)
    status = finish_queue(repo, env)
    assert status.count("Success") == 2 and status.count("Failed") == 1, status
    bad = next(line.split()[1] for line in status.splitlines() if line.endswith("Failed"))
    logs = sh(f"dvc queue logs {bad}", repo).stdout
    assert (
        "error: probe.lr is -1, and a learning rate must be positive; pass -S probe.lr=<a positive number>." in logs
    ), logs
    by_lr = {d["params"]["params.yaml"]["data"]["probe"]["lr"]: metrics_of(d) for d in experiments(repo).values()}
    assert set(by_lr) == {0.02, 0.03}
    runs = [line.split() for line in trace.read_text().splitlines()[1:]]  # after the workspace's first run
    assert len(runs) == 2 and all(".dvc/tmp/exps" in run[0] for run in runs), runs
    (start_a, end_a), (start_b, end_b) = [(float(run[1]), float(run[2])) for run in runs]
    assert start_a < end_b and start_b < end_a, runs  # they ran at once
    # the same point alone, in the workspace: the same bits, and the profile's 2 threads in each
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["probe"]["lr"] = 0.02
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    sh("dvc repro", repo, env={"LAB_TRACE": str(trace)})
    serial = json.loads((repo / "metrics.json").read_text())
    assert by_lr[0.02] == serial and serial["threads"] == 2
    assert by_lr[0.03]["threads"] == 2 and by_lr[0.03]["loss"] != serial["loss"]


@pytest.mark.slow
def test_queue_kill_leaves_no_half_recorded_experiment(tmp_path):
    """`dvc queue kill` on a running experiment: no experiment is recorded for it, its stage's processes are gone,
    and the workspace is as committed."""
    repo = lab_repo(tmp_path / "repo")
    gate = tmp_path / "gate"
    gate.mkdir()
    env = {"LAB_GATE": str(gate)}
    sh("dvc exp run --queue -n doomed -S probe.lr=0.02", repo, env=env)
    start_queue(repo, env)
    wait_for(gate / "started")
    stage = psutil.Process(json.loads((gate / "started").read_text())["pid"])
    killed = time.monotonic()
    sh("dvc queue kill doomed", repo, env=env)
    status = finish_queue(repo, env, timeout=60)
    assert time.monotonic() - killed < 60
    assert "doomed" not in experiments(repo)
    assert "doomed" not in sh("dvc exp list --name-only", repo).stdout
    assert not stage.is_running() or stage.status() == psutil.STATUS_ZOMBIE, status
    assert sh("git status --porcelain", repo).stdout == ""
