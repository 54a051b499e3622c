"""Image classification with the DeiT recipe, built from timm's pieces.

timm provides the transforms (RandAugment, colour jitter, random erasing), Mixup /
CutMix, the losses, AdamW, the cosine schedule with warm-up, the EMA and the
repeated-augmentation sampler; this module only wires them to the prepared
layout, the params and the logs.
"""

from __future__ import annotations

import json
import math
import os
import signal
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import torch
import torch.nn as nn
from safetensors.torch import load_file
from timm.data import Mixup, create_transform
from timm.data.distributed_sampler import RepeatAugSampler
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from timm.utils import AverageMeter, ModelEmaV3
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from vcarepro.core.errors import BadInput, MissingInput, UserError
from vcarepro.core.integrity import intact_file
from vcarepro.core.io import save_tensors, write_json
from vcarepro.core.progress import Progress
from vcarepro.core.recipes import ClsRecipe, input_path
from vcarepro.data import fast
from vcarepro.data.augment import pillow_safe
from vcarepro.data.folders import ManifestDataset, read_classes
from vcarepro.models import ModelSpec, create_classifier
from vcarepro.train.checkpoint import TrainingState, resume_message, seed_everything, stream_seed
from vcarepro.train.distributed import DistInfo, all_reduce_mean, any_rank, say
from vcarepro.train.precision import MixedPrecision, maybe_compile, slow_precision_note
from vcarepro.train.preemption import Preempted, stop_on_sigterm


class NonFiniteLossError(UserError, RuntimeError):
    pass


class ClassifierSpec(ModelSpec):
    """A classifier's spec (``ModelSpec``), created through the (arch, attention) factory."""

    def create(self, num_classes: int, drop_path: float = 0.0) -> nn.Module:
        shape, options = self.resolved()
        return create_classifier(
            self.arch, self.attention, num_classes=num_classes, drop_path_rate=drop_path, **shape, **options
        )


# The recipe's knobs that only build_transforms' training augmentation reads: with train_augment false none is applied.
AUGMENT_KNOBS = ("auto_augment", "color_jitter", "train_interpolation", "scale", "hflip", "reprob")


def unapplied(recipe: ClsRecipe) -> Dict[str, str]:
    """The knobs of ``recipe`` its training never reads, each with the switch that leaves it out (``vcarepro
    explain`` lists them apart): :func:`build_transforms`, :func:`build_criterion` and the loader decide the same."""
    skipped = {}
    if not recipe.train_augment:
        skipped.update(dict.fromkeys(AUGMENT_KNOBS, "train_augment is false: training images get the eval transform"))
        skipped["input_path"] = "train_augment is false: training images get the eval transform, on the PIL path"
    elif recipe.cache_images:
        skipped["cache_images"] = "train_augment is true: augmented images are never cached"
    if not (recipe.mixup > 0 or recipe.cutmix > 0):
        skipped["mixup_switch_prob"] = "mixup and cutmix are 0"
    return skipped


def build_transforms(recipe: ClsRecipe, training: bool):
    """timm's transform for the recipe: training augmentation, or the evaluation resize and crop.

    ``train_augment: false`` gives training images the evaluation transform (deterministic).
    """
    if (
        not training or not recipe.train_augment
    ):  # crop_mode squash: resize to a square, then crop (the lab's data/build.py)
        return create_transform(
            input_size=recipe.img_size,
            interpolation=recipe.interpolation,
            is_training=False,
            crop_pct=recipe.crop_pct,
            crop_mode=recipe.crop_mode,
        )
    auto_augment = None if recipe.auto_augment in (None, "none") else recipe.auto_augment
    return pillow_safe(
        create_transform(
            input_size=recipe.img_size,
            interpolation=recipe.train_interpolation,
            is_training=True,
            scale=tuple(recipe.scale),
            hflip=recipe.hflip,
            color_jitter=recipe.color_jitter or None,
            auto_augment=auto_augment,
            re_prob=recipe.reprob,
            re_mode="pixel",
            re_count=1,
        )
    )


def training_split(recipe: ClsRecipe, data_root: str | Path):
    """(the training split as the recipe's input path reads it, the fast path's draws or None).

    The PIL path's items are transformed images; the fast path's are crops with their draws
    (:mod:`vcarepro.data.fast`), augmented on the device by :func:`device_batches`. Only deterministic transforms
    are cached: a cached augmentation would repeat every epoch.
    """
    transform = build_transforms(recipe, training=True)
    if input_path(recipe) == "fast":
        draws = fast.Draws(transform)
        return fast.CropSet(data_root, "train", draws), draws
    cache = recipe.cache_images and not recipe.train_augment
    return ManifestDataset(data_root, "train", transform, cache=cache), None


def device_batches(loader: DataLoader, draws: Optional[fast.Draws], device: torch.device):
    """What the training loop iterates each epoch: the loader itself on the PIL path; on the fast path its crops,
    augmented, normalized and erased on ``device`` (:class:`~vcarepro.data.fast.DevicePrefetcher`)."""
    return loader if draws is None else fast.DevicePrefetcher(loader, draws, device)


def make_loader(dataset, recipe: ClsRecipe, info: DistInfo, training: bool, seed: int) -> DataLoader:
    per_rank = recipe.batch_size // (info.world_size * recipe.accum_steps)
    if per_rank < 1:
        raise BadInput(f"batch_size={recipe.batch_size} is smaller than world size x accum_steps; raise it.")
    sampler = None
    if training and recipe.repeated_aug:
        # in one process too, as DeiT's and PVT's main.py do (`if True:  # args.distributed`)
        sampler = RepeatAugSampler(dataset, num_replicas=info.world_size, rank=info.rank, shuffle=True, num_repeats=3)
    elif info.distributed:
        sampler = DistributedSampler(dataset, num_replicas=info.world_size, rank=info.rank, shuffle=training, seed=seed)
    generator = torch.Generator().manual_seed(seed)
    workers = recipe.workers
    # Workers are started afresh each epoch, seeded from ``generator`` (reseeded per epoch by
    # the training loop), so the augmentation of epoch k is the same whether or not the run
    # was resumed; persistent workers would carry their random state across epochs.
    return DataLoader(
        dataset,
        batch_size=per_rank,
        shuffle=training and sampler is None,
        sampler=sampler,
        num_workers=workers,
        pin_memory=info.device.type == "cuda",
        drop_last=training,
        persistent_workers=False,
        generator=generator,
        worker_init_fn=_ignore_sigterm,
        collate_fn=dataset.collate if isinstance(dataset, fast.CropSet) else None,
    )


def check_fills_a_batch(train_loader: DataLoader, recipe: ClsRecipe, info: DistInfo) -> None:
    """Refuse a run whose training split cannot fill one optimizer step, before any work.

    The loader drops the last incomplete batch (``drop_last``), and timm's repeated-augmentation
    sampler, once the split holds 256 images, rounds it down to a multiple of 256 before dividing it
    between the processes: such a run would train zero steps and still write weights, an evaluation
    and a report.
    """
    if len(train_loader) >= recipe.accum_steps:
        return
    images = len(train_loader.sampler) if train_loader.sampler is not None else len(train_loader.dataset)
    repeated = " after repeated augmentation" if isinstance(train_loader.sampler, RepeatAugSampler) else ""
    raise BadInput(
        f"the training split gives {images} images per process and epoch{repeated}, fewer than one optimizer step "
        f"of batch_size={recipe.batch_size} (x accum_steps={recipe.accum_steps} over {info.world_size} "
        f"process(es)) needs; lower cls_recipe_overrides.batch_size or train on more images."
    )


def device_notes(recipe: ClsRecipe, info: DistInfo) -> List[str]:
    """One line each for what the recipe asks that this machine runs badly (said once, not per batch)."""
    notes = []
    slow = slow_precision_note(recipe.precision, info.device, "cls_recipe_overrides.precision")
    if slow:
        notes.append(slow)
    cpus = os.cpu_count() or 1
    if recipe.workers > cpus:
        notes.append(
            f"{recipe.workers} loader workers on {cpus} CPUs: the recipe's count is kept (it fixes "
            f"which worker draws each batch's augmentation), so the loader may bound the step."
        )
    return notes


# device_notes says this once per run; torch would repeat it at every epoch's loader start
warnings.filterwarnings("ignore", message="This DataLoader will create", category=UserWarning)


def _ignore_sigterm(worker_id: int) -> None:
    """Loader workers leave SIGTERM to the training process, which stops at a step boundary."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


@torch.no_grad()
def evaluate(
    model: nn.Module,
    loader: DataLoader,
    device: torch.device,
    *,
    report: Optional[str] = None,
    seed: Optional[int] = None,
) -> Dict[str, float]:
    """Top-1 / top-5 accuracy (%) and mean cross-entropy over the loader.

    ``report``: a name for its progress (:mod:`vcarepro.core.progress`; an evaluation stage's), none inside training.
    """
    model.eval()
    correct1 = correct5 = total = 0
    loss_sum = 0.0
    with Progress(report, len(loader.dataset), unit="image", seed=seed, enabled=report is not None) as progress:
        for images, targets in loader:
            images, targets = images.to(device), targets.to(device)
            logits = model(images)
            loss_sum += nn.functional.cross_entropy(logits, targets, reduction="sum").item()
            top = logits.topk(min(5, logits.shape[1]), dim=1).indices
            correct1 += (top[:, 0] == targets).sum().item()
            correct5 += (top == targets[:, None]).any(dim=1).sum().item()
            total += targets.numel()
            progress.update(total)
    return {"top1": 100.0 * correct1 / total, "top5": 100.0 * correct5 / total, "loss": loss_sum / total}


def train_classifier(
    *,
    spec: ClassifierSpec,
    recipe: ClsRecipe,
    data_root: str | Path,
    seed: int,
    out_dir: str | Path,
    ckpt_dir: str | Path,
    info: DistInfo,
    live=None,
    max_steps: Optional[int] = None,
    fingerprint: Any = "",
    log_prefix: str = "",
) -> Dict[str, float]:
    """Train one seed; rank 0 writes ``out_dir/model.safetensors`` and returns the final figures.

    ``ckpt_dir/last.pt`` is written after every epoch and resumed from when present and
    made with the same ``fingerprint`` (the stage's facts and the seed:
    :func:`~vcarepro.train.checkpoint.resumable_checkpoint`).
    ``max_steps`` stops early (tests only).
    """
    device = info.device
    classes, train_loader, val_loader, draws = _loaders(recipe, data_root, info, seed, log_prefix)
    updates_per_epoch = max(1, len(train_loader) // recipe.accum_steps)
    state, total_epochs = _classifier_state(spec, recipe, len(classes), info, seed, updates_per_epoch)
    model, ema, optimizer, scheduler = state.model, state.ema, state.optimizer, state.scheduler
    mixup, criterion = build_criterion(recipe, len(classes))
    start_epoch, history = _resume(ckpt_dir, fingerprint, seed, info, state, total_epochs)
    # DVC deletes a stage's logs before re-running it: replay what the checkpoint saw
    for past in history:
        _log_epoch(live, info, past, log_prefix)

    ddp = DistributedDataParallel(model) if info.distributed else model
    objective = Objective(maybe_compile(ddp, recipe.compile), mixup, criterion)
    state.epoch, state.step = start_epoch, start_epoch * updates_per_epoch
    started = time.perf_counter()
    figures: Dict[str, float] = {}
    losses = AverageMeter()  # the epoch's batch losses
    total_steps = (
        total_epochs * updates_per_epoch if max_steps is None else min(total_epochs * updates_per_epoch, max_steps)
    )
    progress = _progress(state, total_steps, total_epochs, losses, recipe.batch_size, seed, info)
    feed = device_batches(train_loader, draws, device)
    with progress, stop_on_sigterm() as stop:
        watch = Watch(progress, stop, info, max_steps, Path(ckpt_dir) / "last.pt")
        for epoch in range(start_epoch, total_epochs):
            state.epoch = epoch
            _seed_epoch(feed, seed, info.rank, epoch)
            ddp.train()
            train_one_epoch(state, feed, objective, recipe, losses, watch)
            scheduler.step(epoch + 1)
            train_loss = all_reduce_mean(losses.avg, info)
            figures = {"epoch": epoch + 1, "train_loss": train_loss, "train_lr": optimizer.param_groups[0]["lr"]}
            if (epoch + 1) % recipe.eval_every == 0 or epoch + 1 == total_epochs or watch.capped(state.step):
                figures.update(_validate(model, ema, val_loader, device, info))
            _log_epoch(live, info, figures, log_prefix)
            history.append(figures)
            progress.note(epoch_line(history, total_epochs))
            if info.is_main:
                state.write(watch.ckpt, epoch=epoch + 1, history=history, fingerprint=fingerprint)
            if watch.capped(state.step):
                break

    # a copy: the last epoch's entry of ``history`` must not gain the wall time written below
    figures = dict(figures or (history[-1] if history else {}))  # empty: resumed from the final checkpoint
    figures["train_seconds"] = time.perf_counter() - started
    figures["world_size"] = info.world_size
    if info.is_main:
        _save_trained(Path(out_dir), model, ema, history)
    return figures


def _progress(state: TrainingState, total_steps: int, total_epochs: int, losses, batch: int, seed: int, info):
    """The loop's progress line; read when a line is due only (vcarepro.core.progress): the loss is a float already,
    the lr a lookup."""
    return Progress(
        None,
        total_steps,
        start=state.step,
        unit="step",
        images_per_step=batch,
        seed=seed,
        enabled=info.is_main,
        figures=lambda: {
            "epoch": f"{state.epoch + 1}/{total_epochs}",
            "loss": f"{losses.val:.4f} (avg {losses.avg:.4f})",
            "lr": state.optimizer.param_groups[0]["lr"],
        },
    )


def _loaders(recipe: ClsRecipe, data_root: str | Path, info: DistInfo, seed: int, log_prefix: str):
    """(the class names, the training loader, the validation loader, the training set's draws), each checked."""
    classes = read_classes(data_root)
    train_set, draws = training_split(recipe, data_root)
    val_set = ManifestDataset(data_root, "val", build_transforms(recipe, training=False), cache=recipe.cache_images)
    train_loader = make_loader(train_set, recipe, info, training=True, seed=seed)
    val_loader = make_loader(val_set, recipe, info, training=False, seed=seed)
    check_fills_a_batch(train_loader, recipe, info)
    for note in device_notes(recipe, info):
        say(info, f"{log_prefix.rstrip('/') or 'train_cls'}: {note}")
    return classes, train_loader, val_loader, draws


def _classifier_state(spec, recipe: ClsRecipe, num_classes: int, info: DistInfo, seed: int, updates: int):
    """A fresh model, seeded alike on every rank, with its EMA, optimizer and scheduler; and the epochs to train."""
    torch.manual_seed(seed)  # identical initial weights on every rank
    model = spec.create(num_classes=num_classes, drop_path=recipe.drop_path).to(info.device)
    ema = ModelEmaV3(model, decay=recipe.ema_decay) if recipe.ema_decay > 0 else None
    optimizer = build_optimizer(model, recipe)
    scheduler, total_epochs = build_scheduler(optimizer, recipe, updates)
    return TrainingState(model, ema, optimizer, MixedPrecision(recipe.precision, info.device), scheduler), total_epochs


def _resume(ckpt_dir, fingerprint, seed: int, info: DistInfo, training: TrainingState, total_epochs: int):
    """(the epochs done, their history): those of the checkpoint to resume, loaded into ``training``; else (0, [])."""
    state = training.resume(ckpt_dir, fingerprint, seed, lambda message: say(info, message))
    if state is None:
        return 0, []
    done = state["epoch"]
    finished = done >= total_epochs
    position = f"{total_epochs} of {total_epochs} epochs" if finished else f"epoch {done + 1} of {total_epochs}"
    say(info, resume_message(seed, state, position, finished))
    return done, list(state["history"])


def _seed_epoch(train_loader, seed: int, rank: int, epoch: int) -> None:
    """Every random stream of the epoch (data order, loader workers' augmentation, mixup, drop path) restarts from
    (seed, rank, epoch): a resumed run cannot depend on how far an interrupted epoch had drawn, and ranks draw
    independently."""
    seed_everything(stream_seed(seed, rank, epoch))
    train_loader.generator.manual_seed(stream_seed(seed, rank, epoch))
    if isinstance(train_loader.sampler, DistributedSampler):
        train_loader.sampler.set_epoch(epoch)  # it shuffles with seed + epoch
    elif isinstance(train_loader.sampler, RepeatAugSampler):
        train_loader.sampler.set_epoch(seed * 100_003 + epoch)  # timm's shuffles with the epoch alone


@dataclass
class Objective:
    """How a batch becomes a loss: timm's mixup / cutmix (or none), then the criterion on the logits of ``forward`` (the
    model, DDP-wrapped and compiled as the recipe asks)."""

    forward: Callable[[torch.Tensor], torch.Tensor]
    mixup: Optional[Callable]
    criterion: Callable


@dataclass
class Watch:
    """Where a training loop reports and what stops it: its progress lines, a SIGTERM on any rank (``stop``), a cap on
    the optimizer steps (tests only), and the checkpoint a non-finite loss names as the last good one."""

    progress: Progress
    stop: Any
    info: DistInfo
    max_steps: Optional[int]
    ckpt: Path

    def capped(self, step: int) -> bool:
        return self.max_steps is not None and step >= self.max_steps


def train_one_epoch(
    state: TrainingState, feed, objective: Objective, recipe: ClsRecipe, losses: AverageMeter, watch: Watch
) -> None:
    """One epoch's batches from optimizer step ``state.step``, which moves on (``losses`` gathers their losses).

    Stops at ``watch``'s cap; a SIGTERM raises :class:`Preempted` at a batch boundary."""
    model, optimizer, amp, info = state.model, state.optimizer, state.scaler, watch.info
    accum = recipe.accum_steps
    losses.reset()
    optimizer.zero_grad(set_to_none=True)
    for i, (images, targets) in enumerate(feed):
        images, targets = images.to(info.device, non_blocking=True), targets.to(info.device, non_blocking=True)
        if objective.mixup is not None:
            images, targets = objective.mixup(images, targets)
        with amp.autocast():
            loss = objective.criterion(objective.forward(images), targets)
        latest = loss.item()
        if not math.isfinite(latest):
            raise NonFiniteLossError(
                f"the training loss became {latest} at epoch {state.epoch}, batch {i}; lower the learning "
                f"rate or check the data. The last good checkpoint is {watch.ckpt}."
            )
        amp.scaler.scale(loss / accum).backward()
        losses.update(latest)
        if (i + 1) % accum == 0:
            if recipe.clip_grad:
                amp.scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.clip_grad)
            amp.scaler.step(optimizer)
            amp.scaler.update()
            optimizer.zero_grad(set_to_none=True)
            state.step += 1
            state.scheduler.step_update(num_updates=state.step)
            if state.ema is not None:
                state.ema.update(model, step=state.step)
            watch.progress.update(state.step)
        if watch.capped(state.step):
            break
        if any_rank(watch.stop.requested, info):  # the last finished epoch's checkpoint is the resume point
            raise Preempted(
                f"at epoch {state.epoch + 1}, batch {i + 1}; resuming repeats epoch {state.epoch + 1} from its start, "
                "exactly"
            )


def _validate(model, ema, val_loader, device, info: DistInfo) -> Dict[str, float]:
    """The epoch's validation figures, averaged over ranks; the EMA's too (CSWin reports its best epoch)."""
    figures = {f"val_{k}": all_reduce_mean(v, info) for k, v in evaluate(model, val_loader, device).items()}
    if ema is not None:
        val = evaluate(ema.module, val_loader, device)
        figures.update({f"val_{k}_ema": all_reduce_mean(v, info) for k, v in val.items()})
    return figures


def _save_trained(out_dir: Path, model, ema, history) -> None:
    """The trained weights (with their digest, checked on load), the EMA's, and every epoch's validation for the
    best-epoch figures eval_cls reports (no wall times: it is a DVC output)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    save_tensors(out_dir / "model.safetensors", model.state_dict())
    if ema is not None:
        save_tensors(out_dir / "model_ema.safetensors", ema.module.state_dict())
    write_json(out_dir / HISTORY, history)


HISTORY = "history.json"
# The plateau check: the spread (max - min) of validation top-1 over the last this many evaluated epochs.
PLATEAU_EPOCHS = 3


def best_epoch_figures(seed_dir: str | Path) -> Dict[str, float]:
    """Best validation top-1 over the epochs a seed was evaluated at, raw and EMA, and the raw one's epoch.

    ``plateau_spread``: max - min of the raw top-1 over the last ``PLATEAU_EPOCHS`` evaluations (in points;
    within 1 the curve has flattened).

    A run whose training history is missing (trained before it was kept) is an error that says how to fix it.
    """
    path = Path(seed_dir) / HISTORY
    if not path.is_file():
        raise MissingInput(
            f"{path} is missing, so the best epoch is unknown; retrain the run (dvc repro -f -s train_cls@RUN)."
        )
    evaluated = [h for h in json.loads(path.read_text()) if "val_top1" in h]
    best = max(evaluated, key=lambda h: h["val_top1"])
    last = [h["val_top1"] for h in evaluated[-PLATEAU_EPOCHS:]]
    out = {"top1_best": best["val_top1"], "best_epoch": best["epoch"], "plateau_spread": max(last) - min(last)}
    if "val_top1_ema" in evaluated[-1]:
        best_ema = max(evaluated, key=lambda h: h["val_top1_ema"])
        out.update(top1_best_ema=best_ema["val_top1_ema"], best_epoch_ema=best_ema["epoch"])
    return out


def build_criterion(recipe: ClsRecipe, num_classes: int):
    """(timm's Mixup / CutMix or None, the loss they imply): soft-target cross-entropy under mixing, else
    label smoothing, else plain cross-entropy (DeiT's main.py)."""
    mixes = recipe.mixup > 0 or recipe.cutmix > 0
    if mixes:
        mixup = Mixup(
            mixup_alpha=recipe.mixup,
            cutmix_alpha=recipe.cutmix,
            switch_prob=recipe.mixup_switch_prob,
            label_smoothing=recipe.smoothing,
            num_classes=num_classes,
        )
        return mixup, SoftTargetCrossEntropy()
    if recipe.smoothing > 0:
        return None, LabelSmoothingCrossEntropy(smoothing=recipe.smoothing)
    return None, nn.CrossEntropyLoss()


def recipe_steps(recipe: ClsRecipe, train_images: int) -> int:
    """Optimizer steps of a whole run: ``epochs`` (cooldown included) of ``train_images // batch_size`` each."""
    return recipe.epochs * (train_images // recipe.batch_size)


def scaled_lrs(recipe: ClsRecipe) -> Dict[str, float]:
    """lr (and, where the recipe says so, warm-up and minimum lr) scaled linearly by batch_size / 512.

    DeiT scales only the base lr (facebookresearch/deit main.py); Swin and the lab scale all three
    (microsoft/Swin-Transformer main.py, LeapLabTHU/Agent-Attention main.py).
    """
    factor = recipe.batch_size / 512.0
    bounds = factor if recipe.scale_warmup_min_lr else 1.0
    return {"lr": recipe.lr * factor, "warmup_lr": recipe.warmup_lr * bounds, "min_lr": recipe.min_lr * bounds}


def build_optimizer(model: nn.Module, recipe: ClsRecipe) -> torch.optim.Optimizer:
    """timm's optimizer: weight decay on every parameter but the 1-D ones, biases and ``model.no_weight_decay()``.

    That is the rule of every original code here (DeiT's timm, PVT's, Swin's and the lab's set_weight_decay),
    so VCA's lambda vectors and norm weights are not decayed while its contrast embeddings are.
    """
    return create_optimizer_v2(model, opt=recipe.opt, lr=scaled_lrs(recipe)["lr"], weight_decay=recipe.weight_decay)


def build_scheduler(optimizer, recipe: ClsRecipe, updates_per_epoch: int):
    """timm's scheduler for the recipe, and the number of epochs to train: ``recipe.epochs``.

    ``lr_step: epoch`` moves the lr once an epoch (DeiT, PVT, CSWin); ``update`` every optimizer step (Swin,
    the lab). The last ``cooldown_epochs`` of ``epochs`` hold min_lr after the cosine, as timm's train.py
    (CSWin: 300 + 10) and the lab's PVT / CSwin configs do; timm counts them on top of its ``num_epochs``,
    the recipe inside ``epochs``, so that an override ``epochs=N`` trains N epochs whatever the recipe.
    """
    lrs = scaled_lrs(recipe)
    scheduler, _ = create_scheduler_v2(
        optimizer,
        sched=recipe.sched,
        num_epochs=recipe.epochs - recipe.cooldown_epochs,
        cooldown_epochs=recipe.cooldown_epochs,
        warmup_epochs=recipe.warmup_epochs,
        warmup_lr=lrs["warmup_lr"],
        min_lr=lrs["min_lr"],
        step_on_epochs=recipe.lr_step == "epoch",
        updates_per_epoch=updates_per_epoch,
    )
    # not timm's count, which adds the cooldown back only for its cycle schedulers (cosine, tanh, poly)
    return scheduler, recipe.epochs


def epoch_line(history: List[Dict[str, float]], total_epochs: int) -> str:
    """What an epoch's end prints (its last entry of ``history``): loss, lr, and the validation top-1 with the best so
    far, where the epoch was evaluated."""
    now = history[-1]
    parts = [
        f"epoch {int(now['epoch'])}/{total_epochs} done",
        f"train loss {now['train_loss']:.4f}",
        f"lr {now['train_lr']:.3g}",
    ]
    for suffix, name in (("", "val top-1"), ("_ema", "EMA val top-1")):
        key = f"val_top1{suffix}"
        if key in now:
            best = max((h for h in history if key in h), key=lambda h: h[key])
            parts.append(f"{name} {now[key]:.2f} (best {best[key]:.2f} at epoch {int(best['epoch'])})")
    return " | ".join(parts)


def _log_epoch(live, info: DistInfo, figures: Dict[str, float], prefix: str) -> None:
    if live is None or not info.is_main:
        return
    live.step = int(figures["epoch"])
    for name, value in figures.items():
        if name != "epoch":
            live.log_metric(f"{prefix}{name.replace('_', '/', 1)}", value)


def load_classifier(spec: ClassifierSpec, weights: str | Path, num_classes: int) -> nn.Module:
    if not Path(weights).is_file():
        raise MissingInput(f"trained weights {weights} are missing; train the run first (dvc repro train_cls@RUN).")
    intact_file(weights, "train_cls@RUN")
    model = spec.create(num_classes=num_classes)
    model.load_state_dict(load_file(str(weights)))
    return model.eval()
