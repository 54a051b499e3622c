"""Faults the project survives (issue 23), each through the real processes: a real 2-process gloo launch on CPU,
a real `dvc repro` of a micro pipeline in a temporary git repository, and the real warm interpreter server.

* SIGTERM to one rank of a 2-process training run stops both ranks at the same batch (the stop flag is
  all-reduced), the launcher exits 143, the checkpoint is kept and a re-run resumes to the bits of an
  uninterrupted 2-process run;
* SIGTERM to the whole `dvc repro` process group mid-stage stops within seconds, records nothing in dvc.lock,
  and the next `dvc repro` resumes from the checkpoint and leaves `dvc status` clean;
* a second `dvc repro` while one runs is refused by DVC's locks (the stage's read/write lock on its data while
  the first's command runs) and the first finishes normally.

Every process a test starts (DVC, the shells, the warm server and the children it forks, the ranks) carries a
marker in its environment and is killed by pid when the test ends, whatever happened.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from helpers import ROOT, micro_params, reproduced_repo, sh
from vcarepro.params.config import compose
from vcarepro.train.checkpoint import load_checkpoint

MARK = "VCAREPRO_FAULTS_TEST"  # in the environment of every process a test here starts


def marked(token: str) -> list:
    """Pids of the live processes whose environment holds ``MARK=token``."""
    needle = f"{MARK}={token}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    pids.append(int(entry.name))
            except OSError:  # gone, or not ours
                pass
    return pids


def kill_marked(token: str) -> None:
    for pid in marked(token):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture
def token(monkeypatch):
    """A marker for this test's processes, all killed at its end; its own warm server (a private TMPDIR,
    short enough for a Unix socket path) that idles out in 5 s."""
    value = uuid.uuid4().hex
    tmp = tempfile.mkdtemp(prefix="vcf")
    monkeypatch.setenv(MARK, value)
    monkeypatch.setenv("TMPDIR", tmp)
    monkeypatch.setenv("VCAREPRO_WARM_IDLE", "5")
    monkeypatch.setenv("DVC_NO_ANALYTICS", "1")
    try:
        yield value
    finally:
        kill_marked(value)
        shutil.rmtree(tmp, ignore_errors=True)


def wait_for(path: Path, process: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not path.is_file():
        assert process.poll() is None, f"it ended before {path} appeared"
        assert time.monotonic() < deadline, f"no {path} after {timeout} s"
        time.sleep(0.02)


def same_weights(path: Path, expected: dict) -> bool:
    got = load_file(str(path))
    return got.keys() == expected.keys() and all(torch.equal(got[k], expected[k]) for k in expected)


# -- (a) SIGTERM to one rank of a real 2-process launch ----------------------------------------------------------

RUN = "deit_tiny-vca"
EPOCHS = 4


def rank_pids(launcher: subprocess.Popen, timeout: float = 120) -> dict:
    """{rank: pid} of the launcher's two rank processes (their RANK variable)."""
    deadline = time.monotonic() + timeout
    while True:
        ranks = {}
        try:
            children = Path(f"/proc/{launcher.pid}/task/{launcher.pid}/children").read_text().split()
        except OSError:  # the launcher has gone; said below
            children = []
        for pid in map(int, children):
            try:  # before its exec a child still has the launcher's environment, without RANK
                env = dict(
                    item.split(b"=", 1)
                    for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                    if b"=" in item
                )
            except OSError:
                continue
            if b"RANK" in env:
                ranks[int(env[b"RANK"])] = pid
        if len(ranks) == 2:
            return ranks
        assert launcher.poll() is None and time.monotonic() < deadline, "the launcher did not start two ranks"
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.alone
def test_sigterm_to_one_rank_stops_both_and_the_rerun_resumes_to_the_uninterrupted_bits(tmp_path, token):
    params = compose([])
    params["cls_runs"] = {RUN: {**params["cls_runs"][RUN], "seeds": [0]}}
    params["cls_shape"].update(depth=1, embed_dim=32)
    params["cls_recipe_overrides"].update(epochs=EPOCHS, batch_size=128)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    # one thread a rank: two ranks of two threads each on two cores run some 10x slower
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    subprocess.run(
        [sys.executable, str(ROOT / "stages" / "prepare_cls.py")],
        cwd=tmp_path,
        env=env,
        check=True,
        capture_output=True,
    )
    command = [
        sys.executable,
        "-m",
        "vcarepro.train.launch",
        "--nproc-per-node",
        "2",
        "--rdzv-endpoint",
        "file",
        str(ROOT / "stages" / "train_cls.py"),
        "--run",
        RUN,
    ]

    def launch():
        return subprocess.Popen(
            command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    weights = tmp_path / "runs" / "cls" / RUN / "train" / "seed_0" / "model.safetensors"
    ckpt = tmp_path / "checkpoints" / "cls" / RUN / "seed_0" / "last.pt"
    straight = launch()
    out, err = straight.communicate(timeout=600)
    assert straight.returncode == 0, err[-3000:]
    uninterrupted = load_file(str(weights))
    shutil.rmtree(tmp_path / "runs")
    shutil.rmtree(tmp_path / "checkpoints")

    stopped = launch()
    ranks = rank_pids(stopped)
    wait_for(ckpt, stopped)  # epoch 1 is done on both ranks: each is inside its training loop
    os.kill(ranks[1], signal.SIGTERM)  # the one rank a node's preemption reached
    signalled = time.monotonic()
    out, err = stopped.communicate(timeout=300)
    took = time.monotonic() - signalled
    assert stopped.returncode == 143, err[-3000:]
    assert took < 60, took
    # both ranks stopped themselves at the same batch, the flag having been all-reduced
    stops = re.findall(rf"train_cls {RUN} seed 0: stopped by SIGTERM at epoch (\d+), batch (\d+);", err)
    assert len(stops) == 2 and stops[0] == stops[1], err[-3000:]
    assert re.search(r"launch: rank [01] exited with status 143;", err), err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    kept = load_checkpoint(ckpt)
    assert 1 <= kept["epoch"] < EPOCHS and kept["epoch"] == int(stops[0][0]) - 1
    assert not weights.exists()  # nothing finished-looking

    resumed = launch()
    out, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err[-3000:]
    assert f"seed 0: resuming at epoch {kept['epoch'] + 1} of {EPOCHS} from {ckpt.relative_to(tmp_path)}" in out, out
    assert same_weights(weights, uninterrupted)


# -- (b), (c): a real `dvc repro` of a training stage, long enough to be interrupted ----------------------------

CLS = "deit_tiny-vca"
STAGE = f"train_cls@{CLS}"


def dvc_env() -> dict:
    return {**os.environ, "DVC_NO_ANALYTICS": "1", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}


def micro_repo(tmp_path: Path, epochs: int) -> Path:
    """The micro pipeline with one classification run of ``epochs`` epochs (some 1.5 s each on two busy cores),
    its data prepared and recorded in dvc.lock."""
    params = micro_params(cls_runs=[CLS], gen_runs=[])
    params["cls_recipe_overrides"]["epochs"] = epochs
    return reproduced_repo(tmp_path / "repo", params, targets="prepare_cls")


def start_repro(repo: Path) -> subprocess.Popen:
    """`dvc repro STAGE` in its own session, as a terminal or a job scheduler starts it."""
    return subprocess.Popen(
        ["dvc", "repro", STAGE],
        cwd=repo,
        env=dvc_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def checkpoint(repo: Path) -> Path:
    return repo / "checkpoints" / "cls" / CLS / "seed_0" / "last.pt"


def stage_recorded(repo: Path) -> bool:
    lock = repo / "dvc.lock"
    return lock.is_file() and STAGE in yaml.safe_load(lock.read_text())["stages"]


def job_left(token: str) -> list:
    """This test's processes other than its idle warm server (which leads its own session)."""
    return [pid for pid in marked(token) if os.getsid(pid) != pid]


def stage_process(token: str) -> int:
    """The pid of the stage's own process: a child of the warm server, leading its own process group."""
    found = [pid for pid in job_left(token) if os.getpgid(pid) == pid]
    assert len(found) == 1, found
    return found[0]


def clean(repo: Path) -> None:
    status = sh(f"dvc status {STAGE}", repo)
    assert "Data and pipelines are up to date" in status.stdout, status.stdout


@pytest.mark.slow
@pytest.mark.alone
def test_sigterm_to_the_dvc_repro_process_group_stops_within_seconds_and_the_next_repro_resumes(tmp_path, token):
    epochs = 6
    repo = micro_repo(tmp_path, epochs)
    lock = (repo / "dvc.lock").read_bytes()
    repro = start_repro(repo)
    try:
        wait_for(checkpoint(repo), repro)
        os.killpg(repro.pid, signal.SIGTERM)  # dvc, its shell, the warm client: the whole job
        signalled = time.monotonic()
        out, err = repro.communicate(timeout=120)  # the pipes close once the stage's own process has gone too
        took = time.monotonic() - signalled
    finally:
        if repro.poll() is None:
            os.killpg(repro.pid, signal.SIGKILL)
    assert repro.returncode != 0, out[-3000:]
    assert took < 10, took  # a stop at the next batch: about 0.5 s here
    assert not job_left(token)
    assert f"train_cls {CLS} seed 0: stopped by SIGTERM at epoch" in err, err[-3000:]
    assert (repo / "dvc.lock").read_bytes() == lock and not stage_recorded(repo)  # DVC recorded nothing
    kept = load_checkpoint(checkpoint(repo))
    assert 1 <= kept["epoch"] < epochs
    weights = repo / "runs" / "cls" / CLS / "train" / "seed_0" / "model.safetensors"
    assert not weights.exists()

    again = sh(f"dvc repro {STAGE}", repo)
    assert f"seed 0: resuming at epoch {kept['epoch'] + 1} of {epochs} from" in again.stdout, again.stdout[-3000:]
    assert stage_recorded(repo) and weights.is_file()
    assert load_checkpoint(checkpoint(repo))["epoch"] == epochs
    clean(repo)


@pytest.mark.slow
@pytest.mark.alone
def test_a_second_dvc_repro_is_refused_while_one_runs_and_the_first_finishes(tmp_path, token):
    epochs = 8
    repo = micro_repo(tmp_path, epochs)
    lock = (repo / "dvc.lock").read_bytes()
    first = start_repro(repo)
    try:
        wait_for(checkpoint(repo), first)  # inside the stage's command, training
        # Paused while the second tries (SIGSTOP, SIGCONT: nothing the training sees), so that it still runs
        # then however fast the machine is: an epoch takes 0.15 s on two idle cores, 1.5 s on busy ones.
        stage = stage_process(token)
        os.killpg(stage, signal.SIGSTOP)
        try:
            second = sh(f"dvc repro {STAGE}", repo, check=False)
            assert first.poll() is None, "the first run ended before the second was refused"
        finally:
            os.killpg(stage, signal.SIGCONT)
        out, err = first.communicate(timeout=600)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    assert second.returncode != 0, second.stdout[-3000:]
    # DVC lets go of its repository lock while a stage's command runs; the stage's read/write lock on its
    # dependencies and outputs (.dvc/tmp/rwlock) is what refuses the second, naming the first
    assert "is busy, it is being blocked by:" in second.stderr, second.stderr
    assert f"(PID {first.pid}): " in second.stderr and f"dvc repro {STAGE}" in second.stderr, second.stderr
    assert "Running stage" not in second.stdout
    assert first.returncode == 0, err[-3000:]
    assert "stopped by SIGTERM" not in err and "resuming" not in out, out[-3000:]  # undisturbed: one straight run
    assert f"train_cls {CLS} seed 0: epoch={epochs}," in out, out[-3000:]
    assert (repo / "dvc.lock").read_bytes() != lock and stage_recorded(repo)
    assert (repo / "runs" / "cls" / CLS / "train" / "seed_0" / "model.safetensors").is_file()
    clean(repo)
