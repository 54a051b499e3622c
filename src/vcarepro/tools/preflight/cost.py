"""What one run will cost: :class:`RunCost`, a run's recipe beside what was measured on this machine, projected to
the recipe's batch (the step time, the device-hours, the peak memory per device) and whether that peak fits; and,
for a GPU not here (``--estimate-for``), :class:`RunEstimate`: the published training throughputs it is estimated
from (``PUBLISHED``, each with its source) scaled by the run's training FLOPs per image."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from vcarepro.tools.bench.timing import GIB, Measured


@dataclass
class RunCost:
    run: str
    branch: str  # cls or gen
    model: str
    recipe: str  # classification recipe, or the generation objective
    precision: str
    seeds: int
    devices: int
    accum_steps: int
    global_batch: int
    recipe_batch: int  # per device: global / (devices x accum_steps)
    batch_run: Optional[int] = None  # what ran; below recipe_batch the time is scaled linearly
    steps: int = 0  # optimizer steps of one seed
    step_seconds: Optional[float] = None  # one optimizer step at the recipe's batch (accum micro-steps), median
    step_seconds_measured: List[float] = field(default_factory=list)  # each timed step at the batch run
    step_spread: Optional[float] = None  # the slowest timed step over the fastest (1.0: they agree)
    waited: Optional[float] = None  # on the CPU: the share of their ready time the steps waited for a CPU
    train_gpu_hours: Optional[float] = None
    sample_gpu_hours: float = 0.0
    gpu_hours: Optional[float] = None
    peak_bytes_measured: Optional[int] = None
    peak_bytes: Optional[int] = None  # per device at the recipe batch (projected when capped)
    peak_projected: bool = False
    device_memory: int = 0
    fits: Optional[bool] = None  # the peak at the recipe's batch within device_memory (None: not measured)
    fit_note: str = ""  # why not, when it does not fit
    out_of_memory_at: Optional[int] = None
    step_images_per_s: Optional[float] = None
    loader_images_per_s: Optional[float] = None
    sampling: Optional[Dict[str, Any]] = None
    problems: List[str] = field(default_factory=list)

    @property
    def scaled(self) -> bool:
        return self.batch_run is not None and self.batch_run < self.recipe_batch


def fill_costs(cost: RunCost, measured: Measured) -> None:
    """``cost`` from what ``measured`` saw at its batch: the time scaled linearly to the recipe's batch, the peak's
    static part kept and the rest scaled, and whether that fits ``cost.device_memory``."""
    cost.batch_run = measured.batch
    cost.out_of_memory_at = measured.out_of_memory_at
    cost.peak_bytes_measured = measured.peak_bytes
    cost.step_seconds_measured = list(measured.step_seconds)
    cost.waited = measured.waited
    cost.step_spread = measured.spread
    load = measured.under_load()
    if load:
        cost.problems.append(
            f"{cost.run}: {load}, so the machine was busy and its time is not projected; run the preflight again "
            "when nothing else runs here (uptime's load below the core count)"
            + (", or with more --steps." if measured.disagree else ".")
        )
    elif measured.seconds is not None:
        micro = measured.seconds * cost.recipe_batch / measured.batch
        cost.step_seconds = micro * cost.accum_steps
        cost.step_images_per_s = cost.recipe_batch / micro
        cost.train_gpu_hours = cost.seeds * cost.steps * cost.step_seconds * cost.devices / 3600.0
        cost.gpu_hours = cost.train_gpu_hours + cost.sample_gpu_hours
    if measured.peak_bytes is not None:
        static = measured.static_bytes or 0
        growing = max(measured.peak_bytes - static, 0)
        cost.peak_bytes = round(static + growing * cost.recipe_batch / measured.batch)
        cost.peak_projected = measured.batch < cost.recipe_batch
    # Not fitting is not one of the run's problems: it is the table's fits column, and one sentence for all runs
    # (fit_summary), since on a small device it is true of most of them at once.
    gib = cost.device_memory / GIB
    if measured.out_of_memory_at is not None:
        cost.fits = False
        cost.fit_note = f"ran out of memory at batch {measured.out_of_memory_at}"
    elif cost.peak_bytes is not None:
        cost.fits = cost.peak_bytes <= cost.device_memory
        if not cost.fits:
            how = f"projected from batch {measured.batch}" if cost.peak_projected else "measured"
            cost.fit_note = f"needs about {cost.peak_bytes / GIB:.1f} of {gib:.1f} GiB ({how})"


# ----------------------------------------------------------------------------- an estimate for a GPU not here
#
# --estimate-for A100|H100: what a run would cost on a GPU this machine does not have. Named for what it is, "published
# throughput scaled by FLOPs": a reference model's published training images/s on that GPU, times the reference's
# training FLOPs per image over the run's (both counted by metrics/complexity.py's counter, forward and backward, on
# the meta device), against the images the recipe trains. Throughput follows FLOPs only roughly (small models keep a
# GPU less busy than large ones), so it is an estimate until a GPU measures the run (the preflight without
# --estimate-for, on that GPU).

ESTIMATE = "published throughput scaled by FLOPs"
ROUGHLY = (
    "Throughput scales with FLOPs only roughly: a model far smaller than its reference keeps the GPU less busy, so "
    "its images/s come out high and its hours low (timm's RTX 3090 benchmark trains DeiT-Ti at 5.9x DeiT-B's "
    "images/s, not the 14x of their FLOPs)."
)


@dataclass(frozen=True)
class Published:
    """One published training throughput: ``images_per_s`` on ``gpus`` GPUs of ``gpu`` for ``reference`` (built here
    as ``arch`` to count its FLOPs), at ``precision``, and where it was published. ``derived`` says how a figure no
    source gives was derived from another GPU's, with the ratio's source."""

    gpu: str
    branch: str  # cls or gen: the runs it is the reference for
    reference: str  # the model as its source names it
    arch: str  # a timm model name (cls) or a models.dit DIT_CONFIGS key (gen), to count its FLOPs
    precision: str  # as its source states it
    mixed: bool  # fp16/bf16 autocast (serves runs in fp16, bf16), else fp32/tf32 matmuls (runs in fp32, tf32)
    images_per_s: float  # as published, on ``gpus`` GPUs
    gpus: int  # 1: a GPU's figure; 8: a node of 8
    source: str  # URL
    where: str  # the file, table or comment in it, and what it says
    note: str = ""  # how its setting differs from our runs'
    derived: str = ""  # how a figure for a GPU no source covers was derived, with the ratio's source
    ratio: float = 1.0  # the factor it was derived with (1: as published)

    @property
    def per_gpu(self) -> float:
        return self.images_per_s / self.gpus

    @property
    def label(self) -> str:
        """The reference and its precision in a table cell: "DeiT-B/16, fp32"."""
        return f"{self.reference.split(' (')[0]}, {self.precision.split(' ')[0]}"


PLSC = "https://github.com/PaddlePaddle/PLSC/blob/bd0c824649f820d18711bc268381321545683256/task/classification/deit/README.md"
DIT_ISSUE = "https://github.com/facebookresearch/DiT/issues/22"
FAST_DIT = "https://github.com/chuanyangjin/fast-DiT/blob/0ddbd642f47057d5ec6145529237e1043a335942/README.md"
NEMO_VIT = (
    "https://docs.nvidia.com/nemo-framework/user-guide/latest/MultimodalModels/VisionLanguageFoundation/Vit/Perf.html"
)

# The published training throughputs on an A100, one per branch and kind of precision (the table's rows: GPU,
# reference model, precision, images/s, source). No source we found gives these references' training throughput on an
# H100: its rows below are the A100's times H100_OVER_A100.
A100 = (
    Published(
        gpu="A100",
        branch="cls",
        reference="DeiT-B/16 (ViT-B/16, DeiT's recipe, ImageNet-1K at 224 px)",
        arch="deit_base_patch16_224",
        precision="fp32 (PLSC's FP32; whether its matmuls ran in TF32 is not stated)",
        mixed=False,
        images_per_s=2780,
        gpus=8,
        source=PLSC,
        where="PaddlePaddle/PLSC task/classification/deit/README.md, Models table: ViT-B_16_224, FP32, pretrain, "
        "ImageNet2012, A100*N1C8, 2780 img/sec",
        note="PaddlePaddle, not PyTorch; its loader decodes with PIL",
    ),
    Published(
        gpu="A100",
        branch="cls",
        reference="DeiT-B/16 (ViT-B/16, DeiT's recipe, ImageNet-1K at 224 px)",
        arch="deit_base_patch16_224",
        precision="fp16 (Paddle AMP O2)",
        mixed=True,
        images_per_s=3169,
        gpus=8,
        source=PLSC,
        where="PaddlePaddle/PLSC task/classification/deit/README.md, Models table: ViT-B_16_224, FP16_O2, pretrain, "
        "ImageNet2012, A100*N1C8, 3169 img/sec",
        note="PaddlePaddle, not PyTorch; its loader decodes with PIL",
    ),
    Published(
        gpu="A100",
        branch="gen",
        reference="DiT-XL/2 (256 px, DiT's train.py)",
        arch="dit_xl2",
        precision="tf32 (DiT's train.py: TF32 matmuls on)",
        mixed=False,
        images_per_s=0.81 * 256,
        gpus=8,
        source=DIT_ISSUE,
        where="facebookresearch/DiT#22, its author (2023-02-22): TF32 takes train.py from 0.51 to 0.81 "
        "steps/sec on an 80 GB A100 node (8x GPUs); train.py's --global-batch-size defaults to 256",
        note="train.py VAE-encodes every batch, which our runs do once in prepare_gen: it overstates our hours",
    ),
    Published(
        gpu="A100",
        branch="gen",
        reference="DiT-XL/2 (256 px, fast-DiT's train.py)",
        arch="dit_xl2",
        precision="fp16 autocast, with gradient checkpointing",
        mixed=True,
        images_per_s=0.84 * 128,
        gpus=1,
        source=FAST_DIT,
        where="chuanyangjin/fast-DiT README.md, Improved Training Performance: 0.84 steps/sec at a global batch of "
        "128 on an A100 with gradient checkpointing, mixed precision and pre-extracted VAE features (quoted in "
        "facebookresearch/DiT's README)",
        note="gradient checkpointing recomputes the forward pass, which our runs do not: it overstates our hours",
    ),
)

# H100 over A100 in training throughput, the same configuration on both: NVIDIA's NeMo ViT g/14, one DGX H100 node
# 1428 samples/s against one DGX A100 node 693.
H100_OVER_A100 = 1428 / 693
H100_RATIO = (
    f"no source we found gives these references' training throughput on an H100, so each is the A100's x 1428/693 = "
    f"{H100_OVER_A100:.3f}, H100 over A100 in NVIDIA's NeMo ViT g/14 training (one DGX H100 node 1428 samples/s, one "
    f"DGX A100 node 693, the same configuration; {NEMO_VIT})"
)


def _on_h100(row: Published) -> Published:
    from dataclasses import replace

    return replace(
        row, gpu="H100", images_per_s=row.images_per_s * H100_OVER_A100, derived=H100_RATIO, ratio=H100_OVER_A100
    )


# (GPU, branch, mixed precision) -> the published (or derived) figure: the one table the estimate reads.
PUBLISHED: Dict[tuple, Published] = {
    **{(r.gpu, r.branch, r.mixed): r for r in A100},
    **{("H100", r.branch, r.mixed): _on_h100(r) for r in A100},
}
GPUS = tuple(dict.fromkeys(gpu for gpu, _, _ in PUBLISHED))
MIXED_PRECISIONS = ("fp16", "bf16")


def gpu_named(name: str) -> str:
    """``name`` as PUBLISHED spells it (any case), or one sentence naming the GPUs it holds."""
    found = next((gpu for gpu in GPUS if gpu.lower() == str(name).strip().lower()), None)
    if found is None:
        from vcarepro.core.errors import UnknownName

        raise UnknownName(
            f"--estimate-for {name}: the preflight holds published training throughputs for {' and '.join(GPUS)} "
            f"only; choose one of them."
        )
    return found


def reference_for(gpu: str, branch: str, precision: str) -> Published:
    """The figure that serves a ``branch`` run trained in ``precision`` on ``gpu``: autocast runs (fp16, bf16) take the
    mixed-precision row, fp32 and tf32 runs the other."""
    return PUBLISHED[(gpu, branch, precision in MIXED_PRECISIONS)]


def training_flops(model, input_shape, generator: bool) -> int:
    """FLOPs of one training image through ``model`` (built on the meta device): forward and backward at batch 1,
    counted by :func:`vcarepro.metrics.complexity.count_flops` (the complexity stage's counter, math SDPA), on the meta
    device (shapes only: no memory, no compute)."""
    import torch

    from vcarepro.metrics.complexity import count_flops

    x = torch.zeros(1, *input_shape, device="meta")
    if generator:
        t = torch.zeros(1, dtype=torch.long, device="meta")
        y = torch.zeros(1, dtype=torch.long, device="meta")
        return count_flops(lambda: model(x, t, y).float().sum().backward()).flops
    return count_flops(lambda: model(x).float().sum().backward()).flops


def meta_model(run, branch: str, num_classes: int):
    """``run``'s model as the training loop builds it (train/classification.py, train/generation.py), on the meta
    device: shapes only, no memory."""
    import torch

    from vcarepro.train.classification import ClassifierSpec
    from vcarepro.train.generation import GeneratorSpec

    recipe = run.recipe
    with torch.device("meta"):
        if branch == "cls":
            return ClassifierSpec.for_run(run).create(num_classes=num_classes, drop_path=recipe.drop_path)
        spec = GeneratorSpec.for_run(run)
        return spec.create(learn_sigma=recipe.learn_sigma, class_dropout_prob=recipe.class_dropout_prob)


def run_flops(run, branch: str, num_classes: int) -> int:
    """Training FLOPs of one image of ``run``, its model built as training builds it (:func:`meta_model`)."""
    from vcarepro.tools.bench.train_step import model_input_shape

    model = meta_model(run, branch, num_classes)
    size = getattr(run.recipe, "img_size", None)
    shape = (3, size, size) if branch == "cls" else tuple(model_input_shape(model))
    model.train()
    return training_flops(model, shape, branch == "gen")


def reference_flops(row: Published) -> int:
    """Training FLOPs of one image of ``row``'s reference: timm's model at 224 px and 1000 classes, or DiT at 256 px
    (32 x 32 x 4 SD-VAE latents) with learned sigma, as their sources trained them."""
    import torch

    with torch.device("meta"):
        if row.branch == "cls":
            import timm

            model, shape = timm.create_model(row.arch, num_classes=1000), (3, 224, 224)
        else:
            from vcarepro.models.dit import create_dit

            model = create_dit(row.arch, "mhsa", input_size=32, in_channels=4, num_classes=1000, learn_sigma=True)
            shape = (4, 32, 32)
    model.train()
    return training_flops(model, shape, row.branch == "gen")


@dataclass
class RunEstimate:
    """One run's GPU-hours on ``gpu`` by the estimate (ESTIMATE), with the GPUs its training job asks for."""

    run: str
    branch: str
    model: str
    recipe: str
    precision: str
    seeds: int
    images: int  # training images of every seed: seeds x epochs x training images, or seeds x steps x batch
    flops: int  # training FLOPs of one image of the run
    gpu: str
    reference: str  # the PUBLISHED row's reference and precision
    reference_per_gpu: float  # its images/s per GPU
    reference_flops: int
    images_per_s: float  # the run's estimated images/s per GPU
    gpu_hours: float
    nodes: int
    gpus_per_node: int
    global_batch: int
    accum_steps: int
    gpus_from: str  # where the GPU count comes from

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def per_gpu_batch(self) -> int:
        return self.global_batch // (self.gpus * self.accum_steps)

    @property
    def wall_hours(self) -> float:
        return self.gpu_hours / self.gpus


def trained_images(run, branch: str, train_images: int) -> int:
    """The images a run trains, every seed: epochs x the training images (classification), steps x the global batch
    (generation)."""
    per_seed = run.recipe.epochs * train_images if branch == "cls" else run.recipe.steps * run.recipe.batch_size
    return len(run.seeds) * per_seed


def estimate_gpu_hours(images: int, flops: int, row: Published, ref_flops: int) -> Tuple[float, float]:
    """(images/s per GPU, GPU-hours) of training ``images`` of ``flops`` each, by ``row``'s throughput scaled by
    its reference's FLOPs over the run's."""
    rate = row.per_gpu * ref_flops / flops
    return rate, images / rate / 3600.0
