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
from vcarepro.launch import parse, torchrun_command

ROOT = Path(__file__).resolve().parents[1]


def test_multi_node_goes_through_torchrun_with_the_params_rendezvous():
    args = parse(["--nnodes", "2", "--nproc-per-node", "8", "--node-rank", "1", "--rdzv-endpoint", "10.0.0.5:29500",
                  "stages/train_cls.py", "--run", "deit_tiny-vca"])
    assert torchrun_command(args) == [
        "torchrun", "--nnodes=2", "--nproc-per-node=8", "--node-rank=1", "--rdzv-backend=c10d",
        "--rdzv-endpoint=10.0.0.5:29500", "stages/train_cls.py", "--run", "deit_tiny-vca"]


def test_a_file_rendezvous_is_refused_across_nodes():
    with pytest.raises(SystemExit):
        parse(["--nnodes", "2", "--rdzv-endpoint", "file", "stages/train_cls.py"])


@pytest.mark.slow
@pytest.mark.parametrize("branch, run, stage", [
    ("cls", "deit_tiny-mhsa", "train_cls.py"),
    ("gen", "dit_s2-vca", "train_gen.py"),
])
def test_a_training_stage_runs_ddp_on_two_cpu_processes(tmp_path, branch, run, stage):
    params = compose([])
    params["cls_shape"].update(depth=1, embed_dim=32)
    params["cls_recipe"].update(epochs=1, batch_size=64)
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
