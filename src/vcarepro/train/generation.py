"""Class-conditional generation training: DiT (DDPM) and SiT (flow) share this loop.

DiT's train.py recipe: AdamW (no weight decay), constant learning rate, EMA of the
weights updated every step (initialised to the model), horizontal flips, label
dropout for classifier-free guidance inside the model, and epochs of a shuffled
distributed sampler with the last partial batch dropped (:func:`epoch_batch`). The
objective is the only difference between DiT and SiT.
"""

from __future__ import annotations

import functools
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Tuple

import torch
import torch.nn as nn
from safetensors.torch import load_file
from timm.utils import ModelEmaV3
from torch.nn.parallel import DistributedDataParallel

from vcarepro.core.choices import LABEL_MODES
from vcarepro.core.errors import BadInput, MissingInput
from vcarepro.core.integrity import intact_file, prepared
from vcarepro.core.io import save_tensors
from vcarepro.core.progress import Progress
from vcarepro.core.recipes import GenRecipe
from vcarepro.metrics.protocol import sampler_of
from vcarepro.models import ModelSpec
from vcarepro.models.dit import create_dit
from vcarepro.train.checkpoint import TrainingState, resume_message, seed_everything, stream_seed
from vcarepro.train.classification import NonFiniteLossError
from vcarepro.train.diffusion import GaussianDiffusion
from vcarepro.train.distributed import DistInfo, all_reduce_mean, any_rank, say
from vcarepro.train.flow import FlowMatching
from vcarepro.train.precision import MixedPrecision, maybe_compile, slow_precision_note
from vcarepro.train.preemption import Preempted, stop_on_sigterm


class GeneratorSpec(ModelSpec):
    """A DiT / SiT backbone's spec (``ModelSpec``), created by models.dit."""

    def create(self, *, learn_sigma: bool = True, class_dropout_prob: float = 0.1) -> nn.Module:
        shape, options = self.resolved()
        return create_dit(
            self.arch,
            self.attention,
            learn_sigma=learn_sigma,
            class_dropout_prob=class_dropout_prob,
            attention_options=options,
            **shape,
        )


def make_objective(objective: str, flow_path: str = "linear"):
    """DiT's DDPM, or SiT's flow matching on ``flow_path`` (``linear``, SiT's default, or ``gvp``)."""
    if objective == "ddpm":
        return GaussianDiffusion()
    if objective == "flow":
        return FlowMatching(path=flow_path)
    raise BadInput(f"unknown objective {objective!r}; choose 'ddpm' (DiT) or 'flow' (SiT).")


class PixelSet:
    """Pixel-space training images held in memory (embedded scale); flips mirror the pixels."""

    def __init__(self, inputs: torch.Tensor, labels: torch.Tensor):
        self.inputs, self.labels = inputs, labels

    def __len__(self) -> int:
        return len(self.labels)

    def batch(self, indices: torch.Tensor, flip: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        x = self.inputs[indices]
        return torch.where(flip[:, None, None, None], x.flip(-1), x)


def load_training_set(root: str | Path):
    """The prepared generation set under ``root`` (data/gen): in-memory pixels, or VAE latent shards.

    Either way: ``len``, ``labels`` and ``batch(indices, flip, generator)`` giving model inputs.
    """
    root = Path(root)
    meta_path = root / "meta.json"
    if not meta_path.is_file():
        raise MissingInput(f"{meta_path} is missing; run the prepare_gen stage (dvc repro prepare_gen) first.")
    if os.environ.get("LOCAL_RANK", "0") == "0":  # one process per node reads the bytes through (42 GB at paper scale)
        prepared(root, "prepare_gen")
    meta = json.loads(meta_path.read_text())
    if meta["kind"] == "vae_latents":
        from vcarepro.data.latents import LatentShards  # diffusers is imported only where latents are used

        return LatentShards(root / "latents")
    data = load_file(str(root / "train.safetensors"))
    return PixelSet(data["inputs"].float(), data["labels"].long())


def epoch_batch(step: int, *, n: int, per_rank: int, info: DistInfo, seed: int) -> torch.Tensor:
    """Training-set indices of this rank's batch at ``step``, as DiT's DistributedSampler gives them.

    Each epoch is a permutation of the set seeded by (seed, epoch), dealt to the ranks
    round-robin (rank r takes positions r, r + world, ...); each rank walks its share in
    batches of ``per_rank`` and drops the last partial one, as DiT's DataLoader
    (drop_last=True) does. A function of the step alone, so a resumed run continues the
    same order without saving any sampler state.
    """
    per_epoch = (n // info.world_size) // per_rank
    epoch, position = divmod(step, per_epoch)
    share = _epoch_share(n, info.world_size, info.rank, seed, epoch)
    return share[position * per_rank : (position + 1) * per_rank]


@functools.lru_cache(maxsize=2)
def _epoch_share(n: int, world_size: int, rank: int, seed: int, epoch: int) -> torch.Tensor:
    """This rank's share of epoch ``epoch``'s permutation (computed once per epoch: 1.28M take ~15 ms)."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))
    return order[rank::world_size][: n // world_size]


def train_generator(
    *,
    spec: GeneratorSpec,
    objective: str,
    recipe: GenRecipe,
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
    """Train one seed for ``recipe.steps`` steps; rank 0 writes the EMA and raw weights."""
    data = load_training_set(data_root)
    n = len(data)
    state, per_rank = _generator_state(spec, recipe, info, seed, n)
    model, ema, optimizer = state.model, state.ema, state.optimizer
    loss_fn = make_objective(objective, recipe.flow_path)
    slow = slow_precision_note(recipe.precision, info.device, "gen_recipe.precision")
    if slow:
        say(info, f"{log_prefix.rstrip('/') or 'train_gen'}: {slow}")
    total = recipe.steps if max_steps is None else min(recipe.steps, max_steps)
    history, running, count = _resumed(state, ckpt_dir, fingerprint, seed, info, total)
    # DVC deletes a stage's logs before re-running it: replay what the checkpoint saw
    for past in history:
        _log_step(live, info, past, log_prefix)

    ddp = DistributedDataParallel(model) if info.distributed else model
    forward = maybe_compile(ddp, recipe.compile)
    ckpt = Path(ckpt_dir) / "last.pt"
    batches = StepBatches(data, seed, per_rank, info, recipe.hflip)
    started = time.perf_counter()
    ddp.train()
    per_epoch = (n // info.world_size) // per_rank  # epoch_batch's
    latest = math.nan
    # read when a line is due only (vcarepro.core.progress): the loss is a float already, the lr a lookup
    progress = Progress(
        None,
        total,
        start=state.step,
        unit="step",
        images_per_step=recipe.batch_size,
        seed=seed,
        enabled=info.is_main,
        figures=lambda: {
            "epoch": state.step // per_epoch + 1,
            "loss": f"{latest:.4f}" + (f" (avg {running / count:.4f})" if count else ""),
            "lr": optimizer.param_groups[0]["lr"],
        },
    )
    with progress, stop_on_sigterm() as stop:
        while state.step < total:
            latest = generator_step(state, batches(state.step), forward, loss_fn, ckpt)
            running += latest
            count += 1
            step = state.step
            if step % recipe.log_every == 0 or step == total:
                history.append(_logged(live, info, step, running / count, optimizer, log_prefix))
                running, count = 0.0, 0
            stopping = any_rank(stop.requested, info)  # a SIGTERM that reached any rank stops them all
            if info.is_main and (step % recipe.ckpt_every == 0 or step == total or stopping):
                state.write(ckpt, step=step, history=history, running=running, count=count, fingerprint=fingerprint)
            if stopping:
                raise Preempted(f"at step {step} of {total}")
            progress.update(step)

    figures = {
        "steps": float(state.step),
        "train_seconds": time.perf_counter() - started,
        "world_size": info.world_size,
    }
    if info.is_main:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        save_tensors(
            Path(out_dir) / "model_ema.safetensors", ema.module.state_dict()
        )  # with its digest, checked on load
    return figures


def _logged(live, info: DistInfo, step: int, loss: float, optimizer, log_prefix: str) -> Dict[str, float]:
    """A log line's (step, loss over the ranks, lr), logged; the checkpoint keeps it to replay on resume."""
    logged = {"step": step, "loss": all_reduce_mean(loss, info), "lr": optimizer.param_groups[0]["lr"]}
    _log_step(live, info, logged, log_prefix)
    return logged


def _generator_state(spec: GeneratorSpec, recipe: GenRecipe, info: DistInfo, seed: int, n: int):
    """A fresh model, its EMA and AdamW, seeded alike on every rank, and the batch each rank takes of ``n``."""
    per_rank = recipe.batch_size // info.world_size
    if per_rank < 1 or per_rank > n // info.world_size:
        raise BadInput(
            f"gen_recipe.batch_size={recipe.batch_size} does not fit {info.world_size} process(es) "
            f"and {n} training examples; choose a batch between world size and the dataset size."
        )
    torch.manual_seed(seed)  # identical initial weights on every rank
    model = spec.create(learn_sigma=recipe.learn_sigma, class_dropout_prob=recipe.class_dropout_prob)
    model = model.to(info.device)
    ema = ModelEmaV3(model, decay=recipe.ema_decay)
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
    return TrainingState(model, ema, optimizer, MixedPrecision(recipe.precision, info.device)), per_rank


def _resumed(state: TrainingState, ckpt_dir, fingerprint, seed: int, info: DistInfo, total: int):
    """(history, running loss, its count) from the run's checkpoint where one matches, else a fresh start."""
    resumed = state.resume(ckpt_dir, fingerprint, seed, lambda message: say(info, message))
    if resumed is None:
        return [], 0.0, 0  # every logged (step, loss, lr); the loss of the steps since the last log line
    state.step = resumed["step"]
    finished = state.step >= total
    position = f"{total} of {total} steps" if finished else f"step {state.step} of {total}"
    say(info, resume_message(seed, resumed, position, finished))
    return list(resumed["history"]), resumed["running"], resumed["count"]


@dataclass
class StepBatches:
    """The batch (latents, labels) of each optimizer step, drawn from (seed, rank, step) alone, so that a resumed run
    draws what an uninterrupted one would: DiT's sampler order (:func:`epoch_batch`), the flips and the latents'
    samples; the global RNG (t, noise, label dropout) is reseeded with them."""

    data: Any  # a LatentSet or PixelSet
    seed: int
    per_rank: int
    info: DistInfo
    hflip: bool
    generator: torch.Generator = field(default_factory=torch.Generator)

    def __call__(self, step: int) -> Tuple[torch.Tensor, torch.Tensor]:
        seed_everything(stream_seed(self.seed, self.info.rank, step))
        self.generator.manual_seed(stream_seed(self.seed, self.info.rank, step))
        idx = epoch_batch(step, n=len(self.data), per_rank=self.per_rank, info=self.info, seed=self.seed)
        if self.hflip:
            flip = torch.rand(self.per_rank, generator=self.generator) < 0.5
        else:
            flip = torch.zeros(self.per_rank, dtype=torch.bool)
        device = self.info.device
        return self.data.batch(idx, flip, self.generator).to(device), self.data.labels[idx].to(device)


def generator_step(
    state: TrainingState, batch: Tuple[torch.Tensor, torch.Tensor], forward: Callable, loss_fn, ckpt: Path
) -> float:
    """One optimizer step of a generator on ``batch`` (latents, labels), its EMA updated, ``state.step`` moved on;
    the step's loss. ``ckpt``: the checkpoint a non-finite loss names as the last good one."""
    x, y = batch
    amp = state.scaler
    with amp.autocast():
        loss = loss_fn.training_losses(forward, x, y)["loss"]
    latest = loss.item()
    if not math.isfinite(latest):
        raise NonFiniteLossError(
            f"the training loss became {latest} at step {state.step}; lower the learning rate or check the "
            f"data. The last good checkpoint is {ckpt}."
        )
    state.optimizer.zero_grad(set_to_none=True)
    amp.scaler.scale(loss).backward()
    amp.scaler.step(state.optimizer)
    amp.scaler.update()
    state.ema.update(state.model, step=state.step)
    state.step += 1
    return latest


def _log_step(live, info: DistInfo, logged: Dict[str, float], prefix: str) -> None:
    if live is None or not info.is_main:
        return
    live.step = int(logged["step"])
    live.log_metric(f"{prefix}train/loss", logged["loss"])
    live.log_metric(f"{prefix}train/lr", logged["lr"])


def load_generator(spec: GeneratorSpec, weights: str | Path, recipe: GenRecipe) -> nn.Module:
    if not Path(weights).is_file():
        raise MissingInput(f"trained weights {weights} are missing; train the run first (dvc repro train_gen@RUN).")
    intact_file(weights, "train_gen@RUN")
    model = spec.create(learn_sigma=recipe.learn_sigma, class_dropout_prob=recipe.class_dropout_prob)
    model.load_state_dict(load_file(str(weights)))
    return model.eval()


@torch.no_grad()
def generate_batches(
    model: nn.Module,
    objective: str,
    sampling: Dict[str, Any],
    *,
    num_samples: int,
    num_classes: int,
    input_shape,
    seed: int,
    device: torch.device,
    flow_path: str = "linear",
    start_batch: int = 0,
):
    """Yield ``(start, samples, labels)`` per sampling batch, in model space, deterministic in ``seed``.

    Batch ``b`` draws its labels and noise from a generator seeded by (seed, b) alone, so
    sampling can resume at ``start_batch`` and produce exactly the batches an uninterrupted
    run would. ``sampling["labels"]``: ``random`` (uniform, as DiT's and SiT's ``sample_ddp.py``)
    or ``balanced`` (cycles through the classes: slightly lower FID, higher IS).
    ``flow_path`` is the path a flow model was trained on (``gen_recipe.flow_path``).
    """
    model = model.to(device).eval()
    sampler = make_objective(objective, flow_path)
    method, steps = sampler_of(objective, sampling)  # the protocol sample_gen records (vcarepro.metrics.protocol)
    size = sampling["batch_size"]
    for batch in range(start_batch, math.ceil(num_samples / size)):
        start = batch * size
        count = min(size, num_samples - start)
        generator = torch.Generator(device="cpu").manual_seed(seed * 1_000_003 + batch)
        y = sample_labels(sampling["labels"], start, count, num_classes, generator).to(device)
        noise = torch.randn((len(y), *input_shape), generator=generator).to(device)
        if method == "ddpm":
            x = sampler.sample(model, noise, y, num_steps=steps, cfg_scale=sampling["cfg_scale"], generator=generator)
        elif method == "flow-sde":
            x = sampler.sample_sde(
                model, noise, y, num_steps=steps, cfg_scale=sampling["cfg_scale"], generator=generator
            )
        else:  # flow-ode
            x = sampler.sample_ode(
                model, noise, y, num_steps=steps, method=sampling["flow_ode_method"], cfg_scale=sampling["cfg_scale"]
            )
        yield start, x.float().cpu(), y.cpu()


def sample_labels(mode: str, start: int, count: int, num_classes: int, generator: torch.Generator) -> torch.Tensor:
    """The class labels of samples ``start .. start + count``: uniform draws from ``generator`` or a balanced cycle."""
    if mode == "random":
        return torch.randint(0, num_classes, (count,), generator=generator)
    if mode == "balanced":
        return torch.arange(start, start + count) % num_classes
    raise BadInput(f"sampling.labels={mode!r} is unknown; use one of {', '.join(LABEL_MODES)}.")


def pixels_to_uint8(x: torch.Tensor) -> torch.Tensor:
    """Model-space pixels in [-1, 1] to uint8 images."""
    return ((x.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
