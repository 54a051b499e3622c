"""Training-step time of a generation or classification run, and the GPU-hours a full run would take.

``python -m vcarepro.tools.bench train-step --run dit_s2-vca --batch 32 --device cuda``. The projection
assumes loading and all-reduce hide behind compute: a lower bound, only as good as the device measured.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, Optional, Tuple

import torch
from timm.data.mixup import mixup_target
from timm.utils import ModelEmaV3

from vcarepro.core.errors import UnknownName, UserError
from vcarepro.params.config import compose
from vcarepro.params.runs import cls_run, gen_run
from vcarepro.tools.bench.timing import measure_step
from vcarepro.train.classification import ClassifierSpec, build_criterion, build_optimizer, recipe_steps
from vcarepro.train.generation import GeneratorSpec, make_objective
from vcarepro.train.precision import MixedPrecision, maybe_compile

LATENT_SHAPE = (4, 32, 32)  # 256 px through the SD VAE


# Training images of the classification set at each scale, for the projection (ImageNet-1K's train
# split; ImageNet-100 of CMC's list as commonly reported for it).
TRAIN_IMAGES = {"paper": 1_281_167, "proxy": 126_689}


class TrainStep:
    """One training step of a run as its training loop takes it, on random inputs of the run's shape.

    Model, EMA, optimizer, loss and precision come from the training loop's own builders. ``static_bytes``
    counts what lives between steps (weights, gradients, optimizer state, EMA): the memory the batch does not grow.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        step: Callable[[], None],
        *,
        batch: int,
        device: torch.device,
        precision: str,
        ema=None,
        input_shape: Tuple[int, ...] = (),
    ):
        self.model, self.optimizer, self.ema = model, optimizer, ema
        self.batch, self.device, self.precision, self.input_shape = batch, device, precision, input_shape
        self._step = step

    def __call__(self) -> None:
        self._step()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def static_bytes(self) -> int:
        tensors = [*self.model.parameters(), *self.model.buffers()]
        tensors += [p.grad for p in self.model.parameters() if p.grad is not None]
        tensors += [v for state in self.optimizer.state.values() for v in state.values() if torch.is_tensor(v)]
        if self.ema is not None:
            tensors += [*self.ema.module.parameters(), *self.ema.module.buffers()]
        return sum(t.numel() * t.element_size() for t in tensors)


def classification_step(
    run,
    *,
    batch: int,
    device: str = "cpu",
    precision: Optional[str] = None,
    num_classes: int = 1000,
    feed: Optional[Callable[[], Tuple[torch.Tensor, torch.Tensor]]] = None,
) -> TrainStep:
    """The training step of a ``cls_runs`` entry (``params.runs.ClsRun``) at ``batch`` images per device.

    Built as ``train_classifier`` builds it (``precision`` overrides the recipe's). An odd batch cannot be mixed
    (timm's Mixup needs pairs), so it uses smoothed one-hot targets at the same cost. ``feed`` gives each step its
    (images, targets) on the device; else one random batch serves every step.
    """
    recipe = run.recipe
    dev = torch.device(device)
    torch.manual_seed(0)
    model = ClassifierSpec.for_run(run).create(num_classes=num_classes, drop_path=recipe.drop_path).to(dev)
    ema = ModelEmaV3(model, decay=recipe.ema_decay) if recipe.ema_decay > 0 else None
    optimizer = build_optimizer(model, recipe)
    amp = MixedPrecision(precision or recipe.precision, dev)
    forward = maybe_compile(model, recipe.compile)
    mixup, criterion = build_criterion(recipe, num_classes)
    size = recipe.img_size
    x = torch.randn(batch, 3, size, size, device=dev)
    y = torch.randint(0, num_classes, (batch,), device=dev)
    updates = [0]

    def step():
        optimizer.zero_grad(set_to_none=True)
        images, targets = (x, y) if feed is None else feed()
        if mixup is not None:
            if batch % 2 == 0:
                images, targets = mixup(images, targets)
            else:
                targets = mixup_target(targets, num_classes, smoothing=recipe.smoothing)
        with amp.autocast():
            loss = criterion(forward(images), targets)
        amp.scaler.scale(loss / recipe.accum_steps).backward()
        if recipe.clip_grad:
            amp.scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.clip_grad)
        amp.scaler.step(optimizer)
        amp.scaler.update()
        updates[0] += 1
        if ema is not None:
            ema.update(model, step=updates[0])

    model.train()
    return TrainStep(
        model, optimizer, step, batch=batch, device=dev, precision=amp.precision, ema=ema, input_shape=(3, size, size)
    )


def generation_step(run, *, batch: int, device: str = "cpu", precision: Optional[str] = None) -> TrainStep:
    """The training step of a ``gen_runs`` entry (``params.runs.GenRun``) at ``batch`` inputs per device.

    As ``train.generation.train_generator`` builds it: DiT with the recipe's sigma and label dropout, AdamW,
    the EMA updated every step, flips, the run's objective and the recipe's precision (``precision``
    replaces it). The inputs have the model's own shape (latents at paper scale, pixels at embedded scale).
    """
    recipe = run.recipe
    dev = torch.device(device)
    torch.manual_seed(0)
    model = (
        GeneratorSpec.for_run(run)
        .create(learn_sigma=recipe.learn_sigma, class_dropout_prob=recipe.class_dropout_prob)
        .to(dev)
    )
    ema = ModelEmaV3(model, decay=recipe.ema_decay)
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
    objective = make_objective(run.objective, recipe.flow_path)
    amp = MixedPrecision(precision or recipe.precision, dev)
    forward = maybe_compile(model, recipe.compile)
    shape = model_input_shape(model)
    x = torch.randn(batch, *shape, device=dev)
    y = torch.randint(0, model.num_classes, (batch,), device=dev)
    flip = torch.rand(batch, device=dev) < 0.5 if recipe.hflip else None
    updates = [0]

    def step():
        inputs = torch.where(flip[:, None, None, None], x.flip(-1), x) if flip is not None else x
        with amp.autocast():
            loss = objective.training_losses(forward, inputs, y)["loss"]
        optimizer.zero_grad(set_to_none=True)
        amp.scaler.scale(loss).backward()
        amp.scaler.step(optimizer)
        amp.scaler.update()
        ema.update(model, step=updates[0])
        updates[0] += 1

    model.train()
    return TrainStep(
        model, optimizer, step, batch=batch, device=dev, precision=amp.precision, ema=ema, input_shape=shape
    )


def model_input_shape(model: torch.nn.Module) -> Tuple[int, ...]:
    """(channels, height, width) a DiT takes: SD-VAE latents of 256 px unless its shape says otherwise."""
    size = getattr(getattr(model, "x_embedder", None), "img_size", None)
    if size is None:
        return LATENT_SHAPE
    return (model.in_channels, *size)


def bench_train_step(
    run_name: str,
    *,
    scale: str = "paper",
    batch: int,
    device: str = "cpu",
    precision: str = "bf16",
    min_run_time: float = 2.0,
) -> Dict[str, Any]:
    """The step of a ``gen_runs`` or ``cls_runs`` entry of ``scale`` timed (:func:`~.timing.measure_step`) for at
    least ``min_run_time`` seconds, and the device-hours of its recipe's steps at that time."""
    params = compose([f"scale={scale}"])
    if run_name in params["gen_runs"]:
        run = gen_run(params, run_name)
        build, objective, steps = generation_step, run.objective, run.recipe.steps
    elif run_name in params["cls_runs"]:
        run = cls_run(params, run_name)
        build, objective, steps = classification_step, "classification", recipe_steps(run.recipe, TRAIN_IMAGES[scale])
    else:
        runs = ", ".join([*params["cls_runs"], *params["gen_runs"]])
        raise UnknownName(f"no run {run_name!r} at scale {scale}; choose one of {runs}.")
    measured = measure_step(
        lambda b: build(run, batch=b, device=device, precision=precision),
        batch,
        torch.device(device),
        min_seconds=min_run_time,
    )
    if measured.seconds is None:
        raise UserError(f"{run_name} ran out of memory at batch 1 on {device}; run it on a device with more memory.")
    global_batch = run.recipe.batch_size
    return {
        "run": run_name,
        "model": run.model,
        "objective": objective,
        "device": device,
        "precision": precision,
        "batch_per_device": measured.batch,
        "out_of_memory_at": measured.out_of_memory_at,
        "ms_per_step": measured.seconds * 1e3,
        "step_spread": measured.spread,
        "under_load": measured.under_load(),
        "peak_bytes": measured.peak_bytes,
        "images_per_second": measured.batch / measured.seconds,
        "recipe_steps": steps,
        "global_batch": global_batch,
        "projected_device_hours": steps * math.ceil(global_batch / measured.batch) * measured.seconds / 3600.0,
    }
