"""Training stages launch on one process, several local processes (gloo, file store) or torchrun."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from vcarepro.config import compose
from vcarepro.launch import LaunchError, main, parse, resolve, srun_command, torchrun_command

ROOT = Path(__file__).resolve().parents[1]


def launch_args(*argv, env=None, gpus=0, hosts=("gpu-a01", "gpu-a02")):
    return resolve(parse([*argv, "stages/train_cls.py", "--run", "deit_tiny-vca"]), env=env or {},
                   gpu_count=lambda: gpus, slurm_host=lambda nodelist: hosts[0])


def test_multi_node_goes_through_torchrun_with_the_params_rendezvous():
    args = launch_args("--nnodes", "2", "--nproc-per-node", "8", "--node-rank", "1",
                       "--rdzv-endpoint", "10.0.0.5:29500")
    assert torchrun_command(args) == [
        "torchrun", "--nnodes=2", "--nproc-per-node=8", "--node-rank=1", "--rdzv-backend=c10d",
        "--rdzv-endpoint=10.0.0.5:29500", "stages/train_cls.py", "--run", "deit_tiny-vca"]


SLURM = {"SLURM_JOB_ID": "4242", "SLURM_NNODES": "4", "SLURM_NODEID": "2", "SLURM_JOB_NODELIST": "gpu-a[01-04]"}


def test_inside_a_slurm_allocation_one_srun_starts_torchrun_on_every_node():
    args = launch_args("--nnodes", "env", "--nproc-per-node", "gpu", "--rdzv-endpoint", "env",
                       "--launcher", "srun", env=SLURM, gpus=8)
    assert srun_command(args, env=SLURM) == [
        "srun", "--nodes=4", "--ntasks-per-node=1", "--kill-on-bad-exit=1",
        "torchrun", "--nnodes=4", "--nproc-per-node=8", "--rdzv-backend=c10d", "--rdzv-id=4242",
        "--rdzv-endpoint=gpu-a01:29500", "stages/train_cls.py", "--run", "deit_tiny-vca"]


def test_env_values_come_from_slurm_or_torchrun_style_variables():
    args = launch_args("--nnodes", "env", "--node-rank", "env", "--rdzv-endpoint", "env", env=SLURM)
    assert (args.nnodes, args.node_rank, args.rdzv_endpoint) == (4, 2, "gpu-a01:29500")
    plain = {"NNODES": "3", "NODE_RANK": "1", "MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "6000"}
    args = launch_args("--nnodes", "env", "--node-rank", "env", "--rdzv-endpoint", "env", env=plain)
    assert (args.nnodes, args.node_rank, args.rdzv_endpoint) == (3, 1, "10.1.2.3:6000")


@pytest.mark.parametrize("argv, env, message", [
    (["--nnodes", "2", "--rdzv-endpoint", "file"], {}, "a file rendezvous works on one node"),
    (["--nnodes", "env"], {}, "needs one of SLURM_NNODES, NNODES"),
    (["--nnodes", "two"], {}, "'two' is not an integer"),
    (["--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "h:1"], {}, "--node-rank 2 does not exist among 2"),
    (["--nproc-per-node", "gpu"], {}, "found no visible GPU"),
    (["--rdzv-endpoint", "env"], {}, "needs MASTER_ADDR or a SLURM allocation"),
    (["--launcher", "srun", "--rdzv-endpoint", "h:1"], {}, "must run inside a SLURM allocation"),
    (["--launcher", "srun"], SLURM, "a file rendezvous works on one node"),
])
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
@pytest.mark.parametrize("branch, run, stage", [
    ("cls", "deit_tiny-mhsa", "train_cls.py"),
    ("gen", "dit_s2-vca", "train_gen.py"),
])
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
        [sys.executable, "-m", "vcarepro.launch", "--nproc-per-node", "2", "--rdzv-endpoint", "file",
         str(ROOT / "stages" / stage), "--run", run, "--max-steps", "3"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    out = tmp_path / "runs" / branch / run
    weights = "model.safetensors" if branch == "cls" else "model_ema.safetensors"
    assert (out / "train" / "seed_0" / weights).is_file()
    summary = json.loads((out / "live" / "metrics.json").read_text())
    assert summary["seed_0"]["world_size"] == 2
    assert result.stdout.count(f"{stage.split('.')[0]} {run} seed 0") == 1  # only rank 0 reports and writes


def test_ranks_see_disjoint_data_that_covers_the_split():
    import torch
    from torch.utils.data import TensorDataset

    from vcarepro.train.classification import make_loader
    from vcarepro.train.distributed import DistInfo

    dataset = TensorDataset(torch.arange(100))
    recipe = {"batch_size": 8, "accum_steps": 1, "repeated_aug": False, "workers": 0}
    seen = []
    for rank in range(2):
        loader = make_loader(dataset, recipe, DistInfo(rank, 2, rank, torch.device("cpu")), training=True, seed=0)
        assert loader.batch_size == 4  # the global batch is split across ranks
        seen.append({int(i) for (batch,) in loader for i in batch})
    assert not seen[0] & seen[1]
    assert len(seen[0] | seen[1]) >= 96  # drop_last trims at most one partial batch per rank
