"""Training stages launch on one process, several local processes (gloo, file store) or torchrun."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from helpers import ROOT
from vcarepro.core.recipes import ClsRecipe
from vcarepro.params.config import compose
from vcarepro.train.launch import RELAYED, LaunchError, main, parse, resolve, srun_command, torchrun_command


def launch_args(*argv, env=None, gpus=0, hosts=("gpu-a01", "gpu-a02")):
    return resolve(
        parse([*argv, "stages/train_cls.py", "--run", "deit_tiny-vca"]),
        env=env or {},
        gpu_count=lambda: gpus,
        slurm_host=lambda nodelist: hosts[0],
    )


def test_multi_node_goes_through_torchrun_with_the_params_rendezvous():
    args = launch_args(
        "--nnodes", "2", "--nproc-per-node", "8", "--node-rank", "1", "--rdzv-endpoint", "10.0.0.5:29500"
    )
    assert torchrun_command(args) == [
        "torchrun",
        "--nnodes=2",
        "--nproc-per-node=8",
        "--node-rank=1",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=10.0.0.5:29500",
        "--rdzv-conf=join_timeout=600",
        "--",
        "stages/train_cls.py",
        "--run",
        "deit_tiny-vca",
    ]


def test_the_rendezvous_timeout_reaches_torchrun_from_the_option_or_the_environment():
    endpoint = ("--nnodes", "2", "--rdzv-endpoint", "10.0.0.5:29500")
    assert "--rdzv-conf=join_timeout=90" in torchrun_command(launch_args(*endpoint, "--rdzv-timeout", "90"))
    from_env = launch_args(*endpoint, env={"VCAREPRO_RDZV_TIMEOUT": "45"})
    assert "--rdzv-conf=join_timeout=45" in torchrun_command(from_env)


SLURM = {"SLURM_JOB_ID": "4242", "SLURM_NNODES": "4", "SLURM_NODEID": "2", "SLURM_JOB_NODELIST": "gpu-a[01-04]"}


def test_inside_a_slurm_allocation_one_srun_starts_torchrun_on_every_node():
    args = launch_args(
        "--nnodes", "env", "--nproc-per-node", "gpu", "--rdzv-endpoint", "env", "--launcher", "srun", env=SLURM, gpus=8
    )
    assert srun_command(args, env=SLURM) == [
        "srun",
        "--nodes=4",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=1",
        *RELAYED,
        "torchrun",
        "--nnodes=4",
        "--nproc-per-node=8",
        "--rdzv-backend=c10d",
        "--rdzv-id=4242",
        "--rdzv-endpoint=gpu-a01:29500",
        "--rdzv-conf=join_timeout=600",
        "--",
        "stages/train_cls.py",
        "--run",
        "deit_tiny-vca",
    ]


def test_inside_a_job_step_the_srun_launcher_shares_the_steps_resources():
    args = launch_args(
        "--nnodes",
        "4",
        "--nproc-per-node",
        "8",
        "--rdzv-endpoint",
        "gpu-a01:29500",
        "--launcher",
        "srun",
        env=SLURM,
        gpus=8,
    )
    assert "--overlap" not in srun_command(args, env=SLURM)
    assert srun_command(args, env={**SLURM, "SLURM_STEP_ID": "0"})[:5] == [
        "srun",
        "--nodes=4",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=1",
        "--overlap",
    ]


def test_env_values_come_from_slurm_or_torchrun_style_variables():
    args = launch_args("--nnodes", "env", "--node-rank", "env", "--rdzv-endpoint", "env", env=SLURM)
    assert (args.nnodes, args.node_rank, args.rdzv_endpoint) == (4, 2, "gpu-a01:29500")
    plain = {"NNODES": "3", "NODE_RANK": "1", "MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "6000"}
    args = launch_args("--nnodes", "env", "--node-rank", "env", "--rdzv-endpoint", "env", env=plain)
    assert (args.nnodes, args.node_rank, args.rdzv_endpoint) == (3, 1, "10.1.2.3:6000")


@pytest.mark.parametrize(
    "argv, env, message",
    [
        (["--nnodes", "2", "--rdzv-endpoint", "file"], {}, "a file rendezvous works on one node"),
        (["--nnodes", "env"], {}, "needs one of SLURM_NNODES, NNODES"),
        (["--nnodes", "two"], {}, "'two' is not an integer"),
        (["--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "h:1"], {}, "--node-rank 2 does not exist among 2"),
        (["--nproc-per-node", "gpu"], {}, "found no visible GPU"),
        (["--rdzv-endpoint", "env"], {}, "needs MASTER_ADDR or a SLURM allocation"),
        (["--launcher", "srun", "--rdzv-endpoint", "h:1"], {}, "must run inside a SLURM allocation"),
        (["--launcher", "srun"], SLURM, "a file rendezvous works on one node"),
        (["--rdzv-timeout", "soon"], {}, "--rdzv-timeout 'soon' is not a whole number of seconds; give one"),
        (["--rdzv-timeout", "0"], {}, "--rdzv-timeout is 0; it must be at least 1 second"),
        (["--grace", "-1"], {}, "--grace is -1; it must be at least 0 second"),
    ],
)
def test_launch_settings_that_cannot_work_are_one_line_errors(argv, env, message):
    with pytest.raises(LaunchError, match=message.replace("[", r"\[")):
        launch_args(*argv, env=env)


def test_the_launcher_reports_a_bad_setting_without_starting_anything(capsys):
    assert main(["--nnodes", "0", "stages/train_cls.py"]) == 2
    assert "--nnodes is 0; it must be at least 1" in capsys.readouterr().err


def test_stage_commands_pass_every_distributed_param_to_the_launcher():
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    for name in ("train_cls", "train_gen"):
        cmd = stages[name]["do"]["cmd"]
        for key in compose([])["distributed"]:
            if key == "seed_processes":  # read by the stage from params.yaml, not a launcher option
                assert "distributed.seed_processes" in stages[name]["do"]["params"]
                continue
            assert f"--{key.replace('_', '-')} ${{distributed.{key}}}" in cmd, (name, key)


@pytest.mark.slow
@pytest.mark.parametrize(
    "branch, run, stage",
    [
        ("cls", "deit_tiny-mhsa", "train_cls.py"),
        ("gen", "dit_s2-vca", "train_gen.py"),
    ],
)
def test_a_training_stage_runs_ddp_on_two_cpu_processes(tmp_path, branch, run, stage):
    params = compose([])
    params["cls_shape"].update(depth=1, embed_dim=32)
    params["cls_recipe_overrides"].update(epochs=1, batch_size=64)
    params["gen_shape"].update(depth=1, hidden_size=32)
    params["gen_recipe"].update(steps=3, log_every=1, ckpt_every=3, batch_size=8)
    params["prepare_gen"]["extractor_epochs"] = 1
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    subprocess.run([sys.executable, str(ROOT / "stages" / "prepare_cls.py")], cwd=tmp_path, env=env, check=True)
    if branch == "gen":
        subprocess.run([sys.executable, str(ROOT / "stages" / "prepare_gen.py")], cwd=tmp_path, env=env, check=True)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "vcarepro.train.launch",
            "--nproc-per-node",
            "2",
            "--rdzv-endpoint",
            "file",
            str(ROOT / "stages" / stage),
            "--run",
            run,
            "--max-steps",
            "3",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = tmp_path / "runs" / branch / run
    weights = "model.safetensors" if branch == "cls" else "model_ema.safetensors"
    assert (out / "train" / "seed_0" / weights).is_file()
    summary = json.loads((out / "live" / "metrics.json").read_text())
    assert summary["seed_0"]["world_size"] == 2
    # only rank 0 reports and writes: one summary line, and one progress line for the start and for the end
    prefix = f"{stage.split('.')[0]} {run} seed 0"
    assert result.stdout.count(f"{prefix}:") == 1
    assert result.stdout.count(f"{prefix} | step 0/") == 1, result.stdout
    assert (
        len([line for line in result.stdout.splitlines() if line.startswith(f"{prefix} |") and " | done in " in line])
        == 1
    )


def test_ranks_see_disjoint_data_that_covers_the_split():
    import torch
    from torch.utils.data import TensorDataset

    from vcarepro.train.classification import make_loader
    from vcarepro.train.distributed import DistInfo

    dataset = TensorDataset(torch.arange(100))
    recipe = ClsRecipe.model_construct(batch_size=8, accum_steps=1, repeated_aug=False, workers=0)
    seen = []
    for rank in range(2):
        loader = make_loader(dataset, recipe, DistInfo(rank, 2, rank, torch.device("cpu")), training=True, seed=0)
        assert loader.batch_size == 4  # the global batch is split across ranks
        seen.append({int(i) for (batch,) in loader for i in batch})
    assert not seen[0] & seen[1]
    assert len(seen[0] | seen[1]) >= 96  # drop_last trims at most one partial batch per rank


# A rank of a real 2-process launch on CPU (file store, gloo), started by the launcher with the arguments
# MODE MARKS: "die": rank 1 SIGKILLs itself before init_distributed (as if killed during its imports) once
# rank 0 is in the rendezvous; "late": rank 1 arrives long after the rendezvous timeout; "hold": both join,
# then wait to be stopped. Each rank leaves marker files in MARKS as it goes.
RANK = """
import os, signal, sys, time
from pathlib import Path

mode, marks = sys.argv[1], Path(sys.argv[2])
rank = int(os.environ["RANK"])
if rank == 1 and mode == "die":
    while not (marks / "rank0-joining").exists():
        time.sleep(0.05)
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)
if rank == 1 and mode == "late":
    time.sleep(300)

from vcarepro.core.errors import run_stage
from vcarepro.train.distributed import init_distributed


def main():
    (marks / f"rank{rank}-joining").touch()
    init_distributed()
    (marks / f"rank{rank}-joined").touch()
    if mode == "hold":
        def stop(signum, frame):
            (marks / f"rank{rank}-stopped").touch()
            sys.exit(143)
        signal.signal(signal.SIGTERM, stop)
        while True:
            time.sleep(0.05)


run_stage(main)
"""


class Launch:
    """``python -m vcarepro.train.launch --nproc-per-node 2 --rdzv-endpoint file OPTIONS rank.py MODE MARKS``, with its
    own TMPDIR (where the store's folder goes) and its own session, so that nothing outlives the test."""

    def __init__(self, tmp_path: Path, mode: str, *options: str):
        self.tmp, self.marks = tmp_path / "tmp", tmp_path / "marks"
        self.tmp.mkdir()
        self.marks.mkdir()
        script = tmp_path / "rank.py"
        script.write_text(RANK)
        env = {**os.environ, "TMPDIR": str(self.tmp), "PYTHONPATH": str(ROOT / "src")}
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "vcarepro.train.launch",
                "--nproc-per-node",
                "2",
                "--rdzv-endpoint",
                "file",
                *options,
                str(script),
                mode,
                str(self.marks),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    def wait_for(self, *names: str, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while not all((self.marks / name).exists() for name in names):
            assert self.process.poll() is None, self.process.communicate()[1][-3000:]
            assert time.monotonic() < deadline, f"{names} never appeared"
            time.sleep(0.05)

    def finish(self, timeout: float) -> str:
        """The launcher's stderr once it has ended (within ``timeout`` seconds, or the test fails)."""
        try:
            _, err = self.process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the launcher was still waiting after {timeout} s")
        self.ended = time.time()
        return err

    def since(self, name: str) -> float:
        return self.ended - (self.marks / name).stat().st_mtime

    def stores_left(self):
        return sorted(p.name for p in self.tmp.glob("vcarepro-dist-*"))

    def close(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # the launcher and any rank it left behind
        except ProcessLookupError:
            pass
        self.process.wait()


@pytest.fixture
def launch(tmp_path):
    started = []

    def start(mode, *options):
        started.append(Launch(tmp_path, mode, *options))
        return started[-1]

    yield start
    for each in started:
        each.close()


@pytest.mark.slow
@pytest.mark.alone
def test_a_rank_that_dies_before_the_rendezvous_stops_the_launch_within_seconds(launch):
    run = launch("die")  # the default rendezvous timeout, 600 s: the launcher must not wait for it
    err = run.finish(timeout=120)
    assert run.process.returncode == 128 + signal.SIGKILL, err[-3000:]
    assert (
        "launch: rank 1 exited with status -9 (killed by SIGKILL); stopped rank 0; see the ranks' output above."
        in err.splitlines()
    )
    assert run.since("rank0-joining") < 10  # rank 1 died 0.5 s after rank 0 entered the rendezvous
    assert not (run.marks / "rank0-joined").exists() and not (run.marks / "rank1-joining").exists()
    assert run.stores_left() == []


@pytest.mark.slow
@pytest.mark.alone
def test_the_rendezvous_gives_up_after_its_timeout_naming_the_missing_rank(launch):
    run = launch("late", "--rdzv-timeout", "3", "--grace", "5")
    err = run.finish(timeout=120)
    assert run.process.returncode == 2, err[-3000:]
    lines = err.splitlines()
    assert (
        "error: rank 0: rank 1 did not reach the rendezvous within 3 s (died while starting, or still "
        "starting); see its errors, or give the launcher a longer --rdzv-timeout (VCAREPRO_RDZV_TIMEOUT) if "
        "the ranks start slowly."
    ) in lines
    assert "Traceback (most recent call last):" not in err
    assert "launch: rank 0 exited with status 2; stopped rank 1; see the ranks' output above." in lines
    assert 3 <= run.since("rank0-joining") < 15
    assert not (run.marks / "rank1-joining").exists()
    assert run.stores_left() == []


@pytest.mark.slow
@pytest.mark.alone
def test_sigterm_to_the_launcher_reaches_every_rank_and_removes_the_store(launch):
    run = launch("hold")
    run.wait_for("rank0-joined", "rank1-joined")
    assert len(run.stores_left()) == 1  # the store is there while the ranks run
    run.process.send_signal(signal.SIGTERM)  # the launcher alone, not its process group
    err = run.finish(timeout=60)
    assert run.process.returncode == 143, err[-3000:]
    assert "launch: stopped by SIGTERM, passed on to ranks 0, 1." in err.splitlines()
    assert (run.marks / "rank0-stopped").exists() and (run.marks / "rank1-stopped").exists()
    assert run.stores_left() == []


RANK_SCRIPT = """
import os, sys
from pathlib import Path
Path(sys.argv[2], f"rank_{os.environ['RANK']}.txt").write_text(" ".join(sys.argv[1:]) + " " + os.environ["WORLD_SIZE"])
"""


SEARCH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/local/sbin", "/usr/sbin", "/sbin"])  # ip(8) is in sbin
IP, UNSHARE = shutil.which("ip", path=SEARCH), shutil.which("unshare", path=SEARCH)


@pytest.mark.slow
@pytest.mark.skipif(
    os.geteuid() != 0 or not (IP and UNSHARE),
    reason="a private network namespace (unshare --net, as root) keeps torchrun's store off the network",
)
def test_the_torchrun_launcher_really_starts_its_ranks_with_the_scripts_own_options(tmp_path):
    """The torchrun command line, run: torchrun takes abbreviated options, so without `--` the script's
    `--run` was refused as an ambiguous `--run-path` (caught by the SLURM test's srun launch)."""
    script = tmp_path / "ranks.py"
    script.write_text(RANK_SCRIPT)
    command = (
        f"{IP} link set lo up && {sys.executable} -m vcarepro.train.launch --nnodes 1 --nproc-per-node 2 "
        f"--rdzv-endpoint 127.0.0.1:29531 --launcher torchrun {script} --run {tmp_path}"
    )
    result = subprocess.run(
        [UNSHARE, "--net", "sh", "-c", command],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for rank in (0, 1):
        assert (tmp_path / f"rank_{rank}.txt").read_text() == f"--run {tmp_path} 2"
