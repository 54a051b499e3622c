"""Training-step time of a generation or classification run, and the GPU-hours a full run would take.

``python -m vcarepro.bench train-step --run dit_s2-vca --batch 32 --device cuda``
builds the run's model at its scale's shape (params composed with ``scale=paper``, or
``--scale proxy``), times forward + backward + optimizer steps on random latents (or
images, for a ``cls_runs`` entry) at ``--batch`` per device, and projects
``gen_recipe.steps`` (or epochs x steps per epoch) x (global batch / per-device batch) x step time. That
projection assumes data loading and gradient all-reduce are hidden behind compute, so
it is a lower bound on a real multi-GPU run, and it is only as good as the device
it was measured on.
"""
from __future__ import annotations

import math
from typing import Any, Dict

import torch

from ..config import compose
from . import _time_ms
from ..errors import UnknownName
from ..pipeline import cls_run, gen_run
from ..train.classification import ClassifierSpec, build_optimizer
from ..train.generation import GeneratorSpec, make_objective
from ..train.precision import MixedPrecision

LATENT_SHAPE = (4, 32, 32)  # 256 px through the SD VAE


# Training images of the classification set at each scale, for the projection (ImageNet-1K's train
# split; ImageNet-100 of CMC's list as commonly reported for it).
TRAIN_IMAGES = {"paper": 1_281_167, "proxy": 126_689}


def bench_train_step(run_name: str, *, scale: str = "paper", **kw) -> Dict[str, Any]:
    """The step benchmark of a ``gen_runs`` or ``cls_runs`` entry of ``scale``."""
    params = compose([f"scale={scale}"])
    if run_name in params["gen_runs"]:
        return bench_gen_step(run_name, params=params, **kw)
    if run_name in params["cls_runs"]:
        return bench_cls_step(run_name, params=params, train_images=TRAIN_IMAGES[scale], **kw)
    raise UnknownName(f"no run {run_name!r} at scale {scale}; choose one of "
                      f"{', '.join([*params['cls_runs'], *params['gen_runs']])}.")


def bench_cls_step(run_name: str, *, params: Dict[str, Any], train_images: int, batch: int, device: str = "cpu",
                   precision: str = "bf16", min_run_time: float = 2.0) -> Dict[str, Any]:
    run = cls_run(params, run_name)
    recipe = run.recipe
    spec = ClassifierSpec.for_run(run)
    dev = torch.device(device)
    torch.manual_seed(0)
    model = spec.create(num_classes=1000, drop_path=recipe["drop_path"]).to(dev)
    optimizer = build_optimizer(model, recipe)
    amp = MixedPrecision(precision, dev)
    size = recipe["img_size"]
    x = torch.randn(batch, 3, size, size, device=dev)
    y = torch.randint(0, 1000, (batch,), device=dev)

    def step():
        optimizer.zero_grad(set_to_none=True)
        with amp.autocast():
            loss = torch.nn.functional.cross_entropy(model(x), y)
        amp.scaler.scale(loss).backward()
        amp.scaler.step(optimizer)
        amp.scaler.update()
        if dev.type == "cuda":
            torch.cuda.synchronize()

    step()
    seconds = _time_ms(step, min_run_time) / 1e3
    global_batch = recipe["batch_size"]
    steps = (recipe["epochs"] + recipe["cooldown_epochs"]) * (train_images // global_batch)
    device_steps = steps * math.ceil(global_batch / batch)
    return {
        "run": run_name, "model": run.model, "objective": "classification", "device": device,
        "precision": precision, "batch_per_device": batch, "ms_per_step": seconds * 1e3,
        "images_per_second": batch / seconds, "recipe_steps": steps, "global_batch": global_batch,
        "projected_device_hours": device_steps * seconds / 3600.0,
    }


def bench_gen_step(run_name: str, *, params: Dict[str, Any] = None, batch: int, device: str = "cpu",
                   precision: str = "bf16", min_run_time: float = 2.0) -> Dict[str, Any]:
    params = params or compose(["scale=paper"])
    run = gen_run(params, run_name)
    recipe = run.recipe
    spec = GeneratorSpec.for_run(run)
    dev = torch.device(device)
    torch.manual_seed(0)
    model = spec.create(learn_sigma=recipe["learn_sigma"], class_dropout_prob=recipe["class_dropout_prob"]).to(dev)
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe["lr"], weight_decay=recipe["weight_decay"])
    objective = make_objective(run.objective, recipe["flow_path"])
    amp = MixedPrecision(precision, dev)
    x = torch.randn(batch, *LATENT_SHAPE, device=dev)
    y = torch.randint(0, 1000, (batch,), device=dev)

    def step():
        optimizer.zero_grad(set_to_none=True)
        with amp.autocast():
            loss = objective.training_losses(model, x, y)["loss"]
        amp.scaler.scale(loss).backward()
        amp.scaler.step(optimizer)
        amp.scaler.update()
        if dev.type == "cuda":
            torch.cuda.synchronize()

    step()  # warm-up: allocations, kernel selection
    seconds = _time_ms(step, min_run_time) / 1e3
    global_batch, steps = recipe["batch_size"], recipe["steps"]
    device_steps = steps * math.ceil(global_batch / batch)
    return {
        "run": run_name, "model": run.model, "objective": run.objective, "device": device,
        "precision": precision, "batch_per_device": batch, "ms_per_step": seconds * 1e3,
        "images_per_second": batch / seconds, "recipe_steps": steps, "global_batch": global_batch,
        "projected_device_hours": device_steps * seconds / 3600.0,
    }
