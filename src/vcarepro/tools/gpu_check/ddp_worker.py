"""The rank torchrun starts for the GPU check's DDP step (:mod:`vcarepro.tools.gpu_check.ddp`), run as a script.

    python -m torch.distributed.run ... ddp_worker.py --spec SPEC.json --result RESULT.json

With one process :func:`vcarepro.train.distributed.init_distributed` sets up no group, so it is initialised
here from torchrun's environment with the backend training would pick.
"""

from __future__ import annotations

import argparse
import json
import os
import traceback
from pathlib import Path

from vcarepro.core.io import write_text
from vcarepro.core.recipes import ClsRecipe


def step(spec, result) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from vcarepro.params.runs import ClsRun, run_paths
    from vcarepro.train.classification import ClassifierSpec, build_optimizer
    from vcarepro.train.distributed import init_distributed
    from vcarepro.train.precision import MixedPrecision

    info = init_distributed()
    backend = "nccl" if info.device.type == "cuda" else "gloo"
    if not dist.is_initialized():  # one process: training runs without a group, the check wants one
        dist.init_process_group(backend, init_method="env://", rank=info.rank, world_size=info.world_size)
    run = ClsRun(
        spec["name"],
        spec["model"],
        spec["shape"],
        ClsRecipe.model_construct(**spec["recipe"]),
        [0],
        run_paths("cls", spec["name"]),
        spec["recipe_name"],
    )
    recipe = run.recipe
    torch.manual_seed(0)
    model = ClassifierSpec.for_run(run).create(num_classes=spec["num_classes"], drop_path=recipe.drop_path)
    model = model.to(info.device)
    ddp = DistributedDataParallel(model, device_ids=[info.local_rank] if info.device.type == "cuda" else None)
    optimizer = build_optimizer(model, recipe)
    amp = MixedPrecision(recipe.precision, info.device)
    size = recipe.img_size
    x = torch.randn(spec["batch"], 3, size, size, device=info.device)
    y = torch.randint(0, spec["num_classes"], (spec["batch"],), device=info.device)
    with amp.autocast():
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
    amp.scaler.scale(loss).backward()
    amp.scaler.step(optimizer)
    amp.scaler.update()
    ones = torch.ones(1, device=info.device)
    dist.all_reduce(ones)
    if info.device.type == "cuda":
        torch.cuda.synchronize(info.device)
    result.update(
        backend=dist.get_backend(),
        world_size=dist.get_world_size(),
        rank=dist.get_rank(),
        device=str(info.device),
        precision=amp.precision,
        loss=float(loss.item()),
        all_reduce=float(ones.item()),
        ddp_wrapped=isinstance(ddp, DistributedDataParallel),
        torchelastic="TORCHELASTIC_RUN_ID" in os.environ,
        nccl_version=_version(torch.cuda.nccl.version()) if backend == "nccl" else None,
    )
    dist.destroy_process_group()


def _version(version) -> str:
    """NCCL's version as torch gives it: a tuple (2, 27, 3), or one number in older releases."""
    return ".".join(map(str, version)) if isinstance(version, (tuple, list)) else str(version)


def main() -> int:
    parser = argparse.ArgumentParser(prog="ddp_worker.py")
    parser.add_argument("--spec", required=True)
    parser.add_argument("--result", required=True)
    args = parser.parse_args()
    result = {}
    status = 0
    try:
        step(json.loads(Path(args.spec).read_text()), result)
    except Exception as err:  # noqa: BLE001 - the parent reads the reason from the result file
        traceback.print_exc()
        result["error"] = f"{type(err).__name__}: {err}"
        status = 1
    write_text(args.result, json.dumps(result))  # whole or absent: the parent reads it after the ranks end
    return status


if __name__ == "__main__":
    raise SystemExit(main())
