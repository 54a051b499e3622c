"""What every run of a scale will cost on the machine at hand, and what would stop it, before it starts.

    python -m vcarepro.tools.preflight [--scale paper] [--runs NAME,...] [--batch N] [--devices K] [--steps N]
                                 [--device cuda] [--json PATH] [--loader-seconds S] [--verbose] [KEY=VALUE ...]

For every ``cls_runs`` and ``gen_runs`` entry of the scale (params composed with ``scale=<scale>`` and
any Hydra overrides given, e.g. ``prepare_cls.imagenet_root=/data/imagenet``; params.yaml is not touched) it builds the model, EMA, optimizer, loss and precision as training does
(:mod:`vcarepro.tools.bench.train_step`) and runs one warm-up step and ``--steps`` timed steps (default 3; the
median is reported) at the recipe's per-device batch (global batch / (devices x accum_steps)), or at
``--batch`` if that is smaller, the time then scaled linearly to the recipe's batch. It records the peak
memory of those steps (``torch.cuda.max_memory_allocated`` on a GPU, the growth of the process's peak RSS
on a CPU) and, where the batch was capped, projects it to the recipe's batch (what lives between steps
stays, the rest grows with the batch). It measures the training transform's throughput at the recipe's
workers, the cost of sampling (forward passes at the sampling batch, counted by running the real sampler
on a stand-in model), and checks the files the scale needs. Inputs that are missing do not stop the
measurement: the models run on random tensors of the right shape.

What it prints leads with what to fix: first one ``error:`` sentence per missing input (an input several
params name, such as the SD-VAE, once), before any run is stepped; then the table (its ``fits`` column
says whether the recipe's per-device batch fits this device); then any problem of a single run, and one
sentence counting the runs that do not fit. Progress goes to stderr through :mod:`vcarepro.core.progress`: a bar on a
terminal, a line every ``progress.interval_s`` in a log, and a line at every run with ``--verbose``.

Exit status 0: every selected run can start here. 2: at least one problem (a missing input, a run that
does not fit, a split too small for one batch, ...), each printed as an ``error: ...`` sentence; an
unknown scale or run name stops at once with one sentence. 1: a run failed unexpectedly (a bug: its
traceback is printed, the other runs are still measured).
"""
from __future__ import annotations

import argparse
import gc
import logging
import math
import os
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from vcarepro.params.config import REPO_ROOT, compose, load_params
from vcarepro.core.errors import USER_ERROR_STATUS, BadInput, UnknownName, UserError, run_stage
from vcarepro.params.runs import CLS_DATA, GEN_DATA, cls_run, gen_run

GIB = 1024 ** 3
# Training images of the classification set per scale when it is not prepared here: ImageNet-1K's
# train split, and ImageNet-100 of CMC's class list as commonly reported for it.
KNOWN_TRAIN_IMAGES = {"paper": 1_281_167, "proxy": 126_689}
DIGITS = 1797  # scikit-learn's load_digits, the embedded scale's source
DEFAULT_CPU_BATCH = 2
LOADER_BATCH = 16


def scales() -> List[str]:
    return sorted(p.stem for p in (REPO_ROOT / "conf" / "scale").glob("*.yaml"))


# ---------------------------------------------------------------- memory

def _proc_status_kib(key: str) -> Optional[int]:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def _release_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        return
    try:  # hand freed heap back to the OS, so the next run's RSS starts low
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class PeakMemory:
    """The peak memory a block allocates on ``device``, in bytes.

    GPU: ``torch.cuda.max_memory_allocated`` above what was allocated before. CPU: the growth of the
    process's peak RSS (VmHWM, reset through ``/proc/self/clear_refs``; where that cannot be reset,
    ``getrusage``'s ``ru_maxrss``, which only sees peaks above earlier ones).
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.method = "torch.cuda.max_memory_allocated" if device.type == "cuda" else "peak RSS growth"

    def __enter__(self) -> "PeakMemory":
        _release_memory(self.device)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
            return self
        self.resettable = True
        try:
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:
            self.resettable = False
        self.base = (_proc_status_kib("VmRSS") or 0) * 1024
        return self

    def peak(self) -> int:
        if self.device.type == "cuda":
            return max(torch.cuda.max_memory_allocated(self.device) - self.base, 0)
        if self.resettable and _proc_status_kib("VmHWM") is not None:
            return max(_proc_status_kib("VmHWM") * 1024 - self.base, 0)
        import resource
        return max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - self.base, 0)

    def __exit__(self, *exc) -> None:
        return None


def device_memory(device: torch.device) -> int:
    """Bytes of memory one device has: the GPU's, or this machine's RAM (a cgroup limit if lower)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit.isdigit():
            total = min(total, int(limit))
    except OSError:
        pass
    return total


def _is_out_of_memory(err: BaseException) -> bool:
    if isinstance(err, (torch.cuda.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(err, RuntimeError) and ("out of memory" in str(err) or "can't allocate memory" in str(err))


# ---------------------------------------------------------------- the data a scale trains on

def _standins(params: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The smoke scale's ``smoke`` section (the sizes of the stand-in inputs the pipeline generates) and their root."""
    from vcarepro.params.runs import SMOKE_INPUTS

    section = params.get("smoke")
    return {**section, "root": str(SMOKE_INPUTS)} if isinstance(section, dict) else None


def expected_classes(params: Dict[str, Any]) -> int:
    prep = params["prepare_cls"]
    if prep["source"] == "digits":
        return 10
    standins = _standins(params)
    if standins and str(prep["imagenet_root"]).startswith(str(standins["root"])):
        return int(standins["classes"])
    if prep.get("subset_classes"):
        return len(prep["subset_classes"])
    return prep.get("subset_count") or 1000


def known_train_images(params: Dict[str, Any], scale: str) -> tuple[int, str]:
    """(training images, where the number comes from) when the dataset is not prepared here."""
    prep = params["prepare_cls"]
    if prep["source"] == "digits":  # train_test_split puts ceil(fraction x n) into val
        return DIGITS - math.ceil(prep["val_fraction"] * DIGITS), "the digits' split (1,797 images)"
    standins = _standins(params)
    if standins and str(prep["imagenet_root"]).startswith(str(standins["root"])):
        return int(standins["classes"]) * int(standins["train_per_class"]), "the stand-in ImageNet's size (smoke)"
    if scale in KNOWN_TRAIN_IMAGES:
        name = "ImageNet-1K" if scale == "paper" else "ImageNet-100"
        return KNOWN_TRAIN_IMAGES[scale], f"{name}'s known count"
    k = expected_classes(params)
    return round(KNOWN_TRAIN_IMAGES["paper"] * k / 1000), f"estimated: {k} of ImageNet-1K's 1000 classes"


@dataclass
class Dataset:
    branch: str
    prepared: bool
    train_images: int
    source: str          # a sentence: where the count comes from


def cls_dataset(params: Dict[str, Any], scale: str, root: Path = CLS_DATA) -> Dataset:
    from vcarepro.data.folders import read_classes, read_manifest

    if (root / "classes.json").is_file() and (root / "manifest.csv").is_file():
        classes = len(read_classes(root))
        if classes == expected_classes(params):
            n = len(read_manifest(root, "train"))
            return Dataset("cls", True, n, f"{root} prepared ({classes} classes, {n:,} training images)")
        note = f"{root} holds another scale's data ({classes} classes, not {expected_classes(params)})"
    else:
        note = f"{root} is not prepared (dvc repro prepare_cls makes it)"
    n, origin = known_train_images(params, scale)
    return Dataset("cls", False, n, f"{note}; {n:,} training images from {origin}")


def gen_dataset(params: Dict[str, Any], scale: str, root: Path = GEN_DATA) -> Dataset:
    import json

    meta_path = root / "meta.json"
    if meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        kind = "pixels" if params["prepare_gen"]["source"] == "pixels" else "vae_latents"
        if meta.get("kind") == kind and meta.get("num_classes") == expected_classes(params):
            n = int(meta["num_images"])
            return Dataset("gen", True, n, f"{root} prepared ({meta['kind']}, {n:,} training examples)")
        note = f"{root} holds another scale's data ({meta.get('kind')}, {meta.get('num_classes')} classes)"
    else:
        note = f"{root} is not prepared (dvc repro prepare_gen makes it)"
    n, origin = known_train_images(params, scale)
    return Dataset("gen", False, n, f"{note}; {n:,} training examples from {origin}")


@dataclass
class Input:
    name: str
    param: str
    path: str
    present: bool
    fix: str = ""              # what to do; {param} stands for the param(s) naming this input
    generated: bool = False    # a stand-in the pipeline makes itself (smoke scale): missing is not a problem
    stages: Tuple[str, ...] = ()   # the stages that read it
    runs: int = 0              # how many of the selected runs need it
    where: str = ""            # where it was looked for, when not simply at its path

    def line(self) -> str:
        return input_line([self])


def _and(items: Sequence[str]) -> str:
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def group_inputs(inputs: Sequence[Input]) -> List[List[Input]]:
    """The inputs by what they are (name and path): the SD-VAE that prepare_gen.vae and sampling.vae_decoder both
    name is one input, read twice."""
    groups: Dict[tuple, List[Input]] = {}
    for entry in inputs:
        groups.setdefault((entry.name, str(entry.path)), []).append(entry)
    return list(groups.values())


def input_line(group: Sequence[Input]) -> str:
    first = group[0]
    state = "present" if first.present else (
        "not generated yet (dvc repro smoke_inputs makes it)" if first.generated else "MISSING")
    return f"{first.name} ({_and([i.param for i in group])} = {first.path}): {state}"


def missing_input_sentence(group: Sequence[Input]) -> str:
    """One sentence for a missing input, however many params name it: what, who reads it, where it was looked for,
    and the fix."""
    first = group[0]
    params = _and([i.param for i in group])
    stages = _and(list(dict.fromkeys(stage for i in group for stage in i.stages)))
    runs = max(i.runs for i in group)
    label = f"{first.name} {first.path}" if first.where else first.name
    where = first.where or f"at {first.path}"
    needed = f", read by {stages}" if stages else ""
    needed += f"; {runs} selected run{'s' if runs != 1 else ''} need{'s' if runs == 1 else ''} it" if runs else ""
    return f"{label} ({params}{needed}): not found {where}; fix: {first.fix.format(param=params)}."


def missing_inputs(inputs: Sequence[Input]) -> List[str]:
    return [missing_input_sentence(group) for group in group_inputs(inputs)
            if not group[0].present and not group[0].generated]


def check_inputs(params: Dict[str, Any], *, cls_runs: int, gen_runs: int, cls_prepared: bool) -> List[Input]:
    """The files from outside the repository that the selected runs (``cls_runs`` and ``gen_runs`` of each branch)
    need, as params name them: one entry per param, so an input two params name comes twice (see
    :func:`group_inputs`)."""
    from vcarepro.data.latents import _local_vae_folder
    from vcarepro.metrics.digit_features import INCEPTION_WEIGHTS_FILENAME

    inputs: List[Input] = []
    prep = params["prepare_cls"]
    if prep["source"] == "imagenet" and not cls_prepared and (cls_runs or gen_runs):
        root = prep["imagenet_root"]
        # prepare_gen makes its latents or pixels from data/cls, so every generation run needs ImageNet too
        inputs.append(Input("ImageNet root", "prepare_cls.imagenet_root", root, Path(root).is_dir(),
                            "set prepare_cls.imagenet_root to the folder holding ILSVRC2012_img_train.tar or "
                            "train/ (dvc exp run -S prepare_cls.imagenet_root=/path)",
                            stages=("prepare_cls", "prepare_gen") if gen_runs else ("prepare_cls",),
                            runs=cls_runs + gen_runs))
    if not gen_runs:
        return inputs
    gen = params["prepare_gen"]
    vaes = {}
    if gen["source"] == "vae_latents":
        vaes[("prepare_gen.vae", "prepare_gen")] = gen["vae"]
        vaes[("sampling.vae_decoder", "sample_gen")] = params["sampling"]["vae_decoder"]
    if vaes:
        from huggingface_hub.constants import HF_HUB_CACHE
    for (param, stage), name in vaes.items():
        inputs.append(Input("SD-VAE", param, name, _local_vae_folder(name) is not None,
                            f"on a machine with internet run `huggingface-cli download {name} --local-dir "
                            f"weights/{name.rstrip('/').split('/')[-1]}`, copy the folder here and point {{param}} "
                            f"at it", stages=(stage,), runs=gen_runs,
                            where=f"as a folder or in the Hugging Face cache ({HF_HUB_CACHE})"))
    if gen["fid_extractor"] == "inception":
        path = gen["inception_weights"]
        inputs.append(Input("Inception weights", "prepare_gen.inception_weights", path, Path(path).is_file(),
                            f"copy {INCEPTION_WEIGHTS_FILENAME} (torch-fidelity's v0.2.0 GitHub release) there",
                            stages=("fid_reference", "eval_gen"), runs=gen_runs))
    adm = params["fid_reference"].get("adm_npz")
    if adm:
        inputs.append(Input("ADM reference batch", "fid_reference.adm_npz", adm, Path(adm).is_file(),
                            "download VIRTUAL_imagenet256_labeled.npz from openai/guided-diffusion's evaluations "
                            "README on a connected machine and put it there", stages=("fid_reference",),
                            runs=gen_runs))
    standins = _standins(params)
    if standins:
        for entry in inputs:
            entry.generated = str(entry.path).startswith(str(standins["root"]))
    return inputs


# ---------------------------------------------------------------- measuring one run

@dataclass
class Measured:
    batch: int                           # the per-device batch that ran
    seconds: Optional[float] = None      # one step at that batch: the median of the timed steps
    peak_bytes: Optional[int] = None
    static_bytes: Optional[int] = None
    out_of_memory_at: Optional[int] = None
    step_seconds: List[float] = field(default_factory=list)   # each timed step, in order


TIMED_STEPS = 3    # timed steps per run after the warm-up, by default (--steps)
WARMUP_STEPS = 1   # steps run before timing: allocations, kernel selection, lazy initialisation

clock = time.perf_counter  # what steps are timed with (a test gives it known durations)


def step_times(fn: Callable[[], Any], repeats: int) -> List[float]:
    """Seconds of each of ``repeats`` calls of ``fn()`` (at least one)."""
    times: List[float] = []
    for _ in range(max(1, repeats)):
        started = clock()
        fn()
        times.append(clock() - started)
    return times


def timed(fn: Callable[[], Any], repeats: int) -> float:
    """Median seconds of ``fn()`` over ``repeats`` calls (at least one): one slow step on a busy machine does not
    become the run's time."""
    return statistics.median(step_times(fn, repeats))


def measure_step(make_step: Callable[[int], Any], batch: int, device: torch.device, *, repeats: int = TIMED_STEPS,
                 after: Optional[Callable[[Any], None]] = None) -> Measured:
    """Build the step at ``batch``, run one warm-up and ``repeats`` timed steps (median), with its peak memory.

    Out of memory, it halves the batch until a step runs (the time is still wanted) and records where
    it failed. ``after(step)`` runs on the built step before it is freed (e.g. to time sampling).
    """
    out_of_memory_at = None
    while True:
        step = None
        try:
            with PeakMemory(device) as memory:
                step = make_step(batch)
                for _ in range(WARMUP_STEPS):
                    step()
                times = step_times(step, repeats)
                peak = memory.peak()
            static = step.static_bytes()
            if after is not None:
                after(step)
            return Measured(batch, statistics.median(times), peak, static, out_of_memory_at, times)
        except Exception as err:  # noqa: BLE001 - only running out of memory is handled
            if not _is_out_of_memory(err):
                raise
            out_of_memory_at = out_of_memory_at or batch
            if batch == 1:
                return Measured(batch, out_of_memory_at=out_of_memory_at)
            batch //= 2
        finally:
            del step
            _release_memory(device)


class _CountingModel(torch.nn.Module):
    """A stand-in DiT for counting the sampler's forward passes: zeros of the real output's shape."""

    def __init__(self, out_channels: int, num_classes: int):
        super().__init__()
        self.out_channels, self.num_classes = out_channels, num_classes
        self.calls: List[int] = []

    def forward(self, x, t, y):
        self.calls.append(len(x))
        return torch.zeros(len(x), self.out_channels, *x.shape[2:])

    def forward_with_cfg(self, x, t, y, cfg_scale):
        return self.forward(x, t, y)


def sampler_passes(model: torch.nn.Module, objective: str, sampling: Dict[str, Any], flow_path: str,
                   input_shape) -> tuple[int, float]:
    """(forward passes per sampling batch, images per pass per sample), counted on the real sampler.

    Guidance doubles the images of a pass. An adaptive ODE solver's count on a stand-in is a lower bound.
    """
    from vcarepro.train.generation import generate_batches

    stub = _CountingModel(model.out_channels, model.num_classes)
    for _ in generate_batches(stub, objective, dict(sampling, batch_size=1), num_samples=1,
                              num_classes=model.num_classes, input_shape=input_shape, seed=0,
                              device=torch.device("cpu"), flow_path=flow_path):
        pass
    return len(stub.calls), sum(stub.calls) / max(len(stub.calls), 1)


@torch.no_grad()
def forward_seconds(model: torch.nn.Module, batch: int, input_shape, device: torch.device,
                    repeats: int = 3) -> float:
    """One sampling forward pass (fp32, eval mode, as sample_gen runs it) at ``batch``: median after a warm-up."""
    was_training = model.training
    model.eval()
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # sample_gen's process never switches TF32 on
    try:
        x = torch.randn(batch, *input_shape, device=device)
        t = torch.randint(0, 1000, (batch,), device=device)
        y = torch.randint(0, model.num_classes, (batch,), device=device)
        def forward():
            model(x, t, y)
            if device.type == "cuda":
                torch.cuda.synchronize(device)

        forward()  # warm-up
        return timed(forward, repeats)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        model.train(was_training)


@dataclass
class RunCost:
    run: str
    branch: str                            # cls or gen
    model: str
    recipe: str                            # classification recipe, or the generation objective
    precision: str
    seeds: int
    devices: int
    accum_steps: int
    global_batch: int
    recipe_batch: int                      # per device: global / (devices x accum_steps)
    batch_run: Optional[int] = None        # what ran; below recipe_batch the time is scaled linearly
    steps: int = 0                         # optimizer steps of one seed
    step_seconds: Optional[float] = None   # one optimizer step at the recipe's batch (accum micro-steps), median
    step_seconds_measured: List[float] = field(default_factory=list)  # each timed step at the batch run
    train_gpu_hours: Optional[float] = None
    sample_gpu_hours: float = 0.0
    gpu_hours: Optional[float] = None
    peak_bytes_measured: Optional[int] = None
    peak_bytes: Optional[int] = None       # per device at the recipe batch (projected when capped)
    peak_projected: bool = False
    device_memory: int = 0
    fits: Optional[bool] = None            # the peak at the recipe's batch within device_memory (None: not measured)
    fit_note: str = ""                     # why not, when it does not fit
    out_of_memory_at: Optional[int] = None
    step_images_per_s: Optional[float] = None
    loader_images_per_s: Optional[float] = None
    sampling: Optional[Dict[str, Any]] = None
    problems: List[str] = field(default_factory=list)

    @property
    def scaled(self) -> bool:
        return self.batch_run is not None and self.batch_run < self.recipe_batch


def _fill_costs(cost: RunCost, measured: Measured) -> None:
    cost.batch_run = measured.batch
    cost.out_of_memory_at = measured.out_of_memory_at
    cost.peak_bytes_measured = measured.peak_bytes
    cost.step_seconds_measured = list(measured.step_seconds)
    if measured.seconds is not None:
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


def cls_cost(run, *, dataset: Dataset, num_classes: int, devices: int, cap: Optional[int], device: torch.device,
             repeats: int) -> RunCost:
    from vcarepro.tools.bench.train_step import classification_step
    from vcarepro.train.classification import recipe_steps

    recipe = run.recipe
    accum, global_batch = recipe["accum_steps"], recipe["batch_size"]
    cost = RunCost(run.name, "cls", run.model["arch"] + "/" + run.model["attention"], run.recipe_name,
                   recipe["precision"], len(run.seeds), devices, accum, global_batch,
                   global_batch // (devices * accum), device_memory=device_memory(device))
    cost.steps = recipe_steps(recipe, dataset.train_images)
    if cost.recipe_batch < 1:
        cost.problems.append(f"{run.name}: batch_size={global_batch} is smaller than {devices} device(s) x "
                             f"accum_steps={accum}; raise batch_size or lower accum_steps.")
        return cost
    if dataset.train_images < global_batch:
        cost.problems.append(f"{run.name}: the training split has {dataset.train_images:,} images, fewer than one "
                             f"global batch of {global_batch}, so no step would run; lower batch_size.")
    if (recipe["mixup"] > 0 or recipe["cutmix"] > 0) and cost.recipe_batch % 2:
        cost.problems.append(f"{run.name}: the per-device batch {cost.recipe_batch} is odd and recipe "
                             f"{run.recipe_name} mixes images (mixup/cutmix), which timm's Mixup refuses; choose "
                             f"a device count that leaves an even per-device batch.")
    batch = min(cost.recipe_batch, cap) if cap else cost.recipe_batch
    measured = measure_step(lambda b: classification_step(run, batch=b, device=str(device),
                                                          num_classes=num_classes), batch, device, repeats=repeats)
    _fill_costs(cost, measured)
    return cost


def gen_cost(run, *, dataset: Dataset, devices: int, cap: Optional[int], device: torch.device,
             repeats: int) -> RunCost:
    from vcarepro.tools.bench.train_step import generation_step

    recipe, sampling = run.recipe, run.sampling
    global_batch = recipe["batch_size"]
    cost = RunCost(run.name, "gen", run.model["arch"] + "/" + run.model["attention"], run.objective,
                   recipe["precision"], len(run.seeds), devices, 1, global_batch, global_batch // devices,
                   steps=recipe["steps"], device_memory=device_memory(device))
    if cost.recipe_batch < 1 or cost.recipe_batch > dataset.train_images // devices:
        cost.problems.append(f"{run.name}: gen_recipe.batch_size={global_batch} cannot be filled by {devices} "
                             f"device(s) from {dataset.train_images:,} training examples; choose a batch between "
                             f"the device count and the dataset size.")
        if cost.recipe_batch < 1:
            return cost
    sample = {}

    def time_sampling(step) -> None:
        model = step.model
        passes, images_per_pass = sampler_passes(model, run.objective, sampling, recipe["flow_path"],
                                                 step.input_shape)
        size = sampling["batch_size"]
        run_batch = min(size, cap) if cap else size
        call_batch = max(1, round(run_batch * images_per_pass))
        seconds = forward_seconds(model, call_batch, step.input_shape, device, repeats) * size / run_batch
        batches = math.ceil(sampling["num_samples"] / size)
        sample.update(num_samples=sampling["num_samples"], batch_size=size, batch_run=run_batch,
                      passes_per_batch=passes, images_per_pass_per_sample=images_per_pass, batches=batches,
                      forward_seconds=seconds, adaptive=run.objective == "flow" and sampling["flow_sampler"] == "ode",
                      gpu_hours=cost.seeds * batches * passes * seconds / 3600.0)

    batch = min(cost.recipe_batch, cap) if cap else cost.recipe_batch
    measured = measure_step(lambda b: generation_step(run, batch=b, device=str(device)), batch, device,
                            repeats=repeats, after=time_sampling)
    if sample:
        cost.sampling = sample
        cost.sample_gpu_hours = sample["gpu_hours"]
    _fill_costs(cost, measured)
    return cost


# ---------------------------------------------------------------- data-loader throughput

def loader_rates(runs, *, dataset: Dataset, seconds: float, log: Callable[[str], None]) -> Dict[str, Dict[str, Any]]:
    """Images/s of each distinct (training transform, workers) among the classification runs, keyed by run.

    A transform that raises (a bad augmentation level, an unreadable image) is a problem, not a crash.
    """
    from vcarepro.data.folders import ManifestDataset
    from vcarepro.train.classification import build_transforms

    by_key: Dict[tuple, Dict[str, Any]] = {}
    per_run: Dict[str, Dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="preflight-jpegs-") as tmp:
        generated = None
        for run in runs:
            transform = build_transforms(run.recipe, training=True)
            key = (repr(transform), run.recipe["workers"])
            if key not in by_key:
                if dataset.prepared:
                    root, source = CLS_DATA, f"the prepared {CLS_DATA}"
                else:
                    if generated is None:
                        from vcarepro.tools.bench.loader import write_imagenet_like_jpegs
                        generated = write_imagenet_like_jpegs(Path(tmp) / "jpegs")
                    root, source = generated, "64 generated 500 x 375 JPEGs (no dataset prepared)"
                workers = run.recipe["workers"]
                log(f"timing the loader of recipe {run.recipe_name} ({workers} workers)")
                entry = {"recipes": [], "workers": workers, "source": source, "transform": repr(transform)}
                try:
                    from vcarepro.tools.bench.loader import loader_throughput
                    data = ManifestDataset(root, "train", transform)
                    entry.update(loader_throughput(data, workers=workers, seconds=seconds,
                                                   batch=min(LOADER_BATCH, max(1, run.recipe["batch_size"])),
                                                   min_batches=workers))
                except UserError:
                    raise
                except Exception as err:  # noqa: BLE001 - the transform's own failure is the finding
                    first = (str(err).strip().splitlines() or [""])[-1]
                    entry["error"] = (f"the training transform of recipe {run.recipe_name} failed on {source}: "
                                      f"{type(err).__name__}: {first}")
                by_key[key] = entry
            if run.recipe_name not in by_key[key]["recipes"]:
                by_key[key]["recipes"].append(run.recipe_name)
            per_run[run.name] = by_key[key]
    return per_run


# ---------------------------------------------------------------- output

def fmt(x: Optional[float], digits: int = 4) -> str:
    """``digits`` significant digits, never in exponent form (the table is read by people and by tests)."""
    if x is None:
        return "-"
    if x == 0:
        return "0"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(x))))
    return f"{x:.{decimals}f}"


def table(costs: Sequence[RunCost], cpu: bool) -> str:
    hours = "CPU-h" if cpu else "GPU-h"
    head = ["run", "model", "recipe", "precision", "batch run/recipe", "step s", "seeds", "steps", "devices",
            f"train {hours}", f"sample {hours}", f"{hours}", "peak GiB/device", "fits", "step/loader img/s"]
    rows = []
    for c in costs:
        batch = f"{c.batch_run if c.batch_run is not None else '-'}/{c.recipe_batch}" + ("*" if c.scaled else "")
        peak = "-" if c.peak_bytes is None else fmt(c.peak_bytes / GIB, 3) + ("~" if c.peak_projected else "")
        fits = {True: "yes", False: "no", None: "-"}[c.fits]
        if c.out_of_memory_at is not None:
            fits = f"no (OOM at {c.out_of_memory_at})"
        rates = f"{fmt(c.step_images_per_s, 3)}/{fmt(c.loader_images_per_s, 3)}" if c.branch == "cls" \
            else f"{fmt(c.step_images_per_s, 3)}/in memory"
        rows.append([c.run, c.model, c.recipe, c.precision, batch, fmt(c.step_seconds), str(c.seeds), str(c.steps),
                     str(c.devices), fmt(c.train_gpu_hours), fmt(c.sample_gpu_hours), fmt(c.gpu_hours), peak, fits,
                     rates])
    total = lambda attr: sum(getattr(c, attr) or 0.0 for c in costs)  # noqa: E731
    rows.append(["total", "", "", "", "", "", "", "", "", fmt(total("train_gpu_hours")),
                 fmt(total("sample_gpu_hours")), fmt(total("gpu_hours")), "", "", ""])
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def fit_summary(costs: Sequence[RunCost], memory: int, cpu: bool) -> Optional[str]:
    """One sentence for every run whose per-device batch does not fit this device (None when all fit)."""
    misfits = [c for c in costs if c.fits is False]
    if not misfits:
        return None
    where = f"this machine's {memory / GIB:.1f} GiB of RAM" if cpu else f"this GPU's {memory / GIB:.1f} GiB"
    names = f" ({', '.join(c.run for c in misfits)})" if len(misfits) <= 5 else ""
    oom = sum(c.out_of_memory_at is not None for c in misfits)
    detail = f"it {misfits[0].fit_note}" if len(misfits) == 1 else \
        "fits = no in the table" + (f"; {oom} ran out of memory" if oom else "")
    fix = "raise the device count (--devices K here, distributed.nproc_per_node when training)"
    if any(c.branch == "cls" for c in misfits):
        fix += " or, for a classification run, its recipe's accum_steps"
    if cpu:
        fix += "; for GPU memory, run this preflight on the GPU machine the runs will train on"
    runs = f"{len(misfits)} of {len(costs)} run{'s' if len(costs) != 1 else ''}{names}"
    return (f"{runs} do{'es' if len(misfits) == 1 else ''} not fit the recipe's per-device batch in {where} "
            f"({detail}): {fix}.")


# ---------------------------------------------------------------- progress and logs

def _stepping_progress(params, total: int, verbose: bool, now: List[str]):
    """The preflight's progress through :mod:`vcarepro.core.progress`, as every long loop reports: on a terminal a bar
    on stderr (``now[0]``, what it is doing, "stepping deit_tiny-vca", beside it); in a log a line on stderr every
    ``progress.interval_s``, the table on stdout left clean; ``--verbose`` a line at every run."""
    from vcarepro.core import progress as reporting

    reporting.configure(params, "preflight", interval_s=0.0 if verbose else None)
    on_terminal = not verbose and _isatty(sys.stderr)
    return reporting.Progress(None, total, unit="run", figures=lambda: dict([now[0].partition(" ")[::2]]),
                              bar=on_terminal,
                              stream=None if on_terminal else sys.stderr)


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class _NoCudaRuntimeNote(logging.Filter):
    """Drops torch's "No CUDA runtime is found, using CUDA_HOME=..." (logged by ``torch.utils.cpp_extension`` when
    ``torch.utils.benchmark``, which :mod:`vcarepro.tools.bench` uses, imports it on a machine with a CUDA folder and no
    GPU): a note for building CUDA extensions, which the preflight never does. Every other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("No CUDA runtime is found")


def _quiet_cuda_note() -> None:
    logger = logging.getLogger("torch.utils.cpp_extension")
    if not any(isinstance(f, _NoCudaRuntimeNote) for f in logger.filters):
        logger.addFilter(_NoCudaRuntimeNote())


_quiet_cuda_note()  # before anything imports vcarepro.tools.bench


def _throw_away_step(build, run, device: torch.device) -> None:
    """The process's first step pays one-time costs (thread pools, lazy imports, allocator arenas) that would count as
    the first run's memory and time: one step of each branch at batch 1, before its runs are measured."""
    warm = None
    try:
        warm = build(run, batch=1, device=str(device))
        warm()
    except Exception:  # noqa: BLE001 - the measurement itself reports what fails
        pass
    finally:
        del warm
        _release_memory(device)


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m vcarepro.tools.preflight", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", help="the scale to check (default: the scale of ./params.yaml)")
    parser.add_argument("--runs", action="append", default=[],
                        help="comma-separated cls_runs / gen_runs entries (default: every run of the scale)")
    parser.add_argument("--batch", type=int, help="cap on the per-device batch actually run (default on a CPU: "
                                                  f"{DEFAULT_CPU_BATCH}; on a GPU: none); the time is scaled linearly")
    parser.add_argument("--devices", type=int, help="devices the runs will train on (default: visible GPUs, or 1)")
    parser.add_argument("--device", help="where to step the models (default: cuda if visible, else cpu)")
    parser.add_argument("--steps", "--repeats", dest="steps", type=int, default=TIMED_STEPS,
                        help=f"timed steps per run after {WARMUP_STEPS} warm-up step; the table shows their median "
                             f"(default {TIMED_STEPS})")
    parser.add_argument("--loader-seconds", type=float, default=3.0,
                        help="seconds of data-loader timing per distinct training transform")
    parser.add_argument("--json", help="also write everything to this JSON file")
    parser.add_argument("--verbose", action="store_true",
                        help="a progress line at each run stepped (default: a bar on a terminal, a line every "
                             "progress.interval_s seconds in a log)")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="Hydra overrides after scale=<scale>, as dvc exp run -S takes them "
                             "(e.g. prepare_cls.imagenet_root=/data/imagenet)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    known = scales()
    scale = args.scale or (load_params("params.yaml").get("scale") if Path("params.yaml").is_file() else None) \
        or "embedded"
    if scale not in known:
        raise UnknownName(f"no scale {scale!r} under conf/scale/; choose one of {', '.join(known)}.")
    try:
        params = compose([f"scale={scale}", *args.overrides])
    except Exception as err:  # noqa: BLE001 - Hydra's override errors are the user's to fix
        if type(err).__module__.split(".")[0] not in ("hydra", "omegaconf"):
            raise
        raise BadInput(f"the overrides {' '.join(args.overrides)} do not apply to conf/: "
                       f"{str(err).strip().splitlines()[0]}") from None
    from vcarepro.params.schema import ParamsError, validate
    try:
        validate(params, f"the scale={scale} composition")
    except ParamsError as err:
        raise BadInput(str(err)) from None

    every = [*params["cls_runs"], *params["gen_runs"]]
    chosen = [name.strip() for arg in args.runs for name in arg.split(",") if name.strip()] or every
    unknown = [name for name in chosen if name not in every]
    if unknown:
        raise UnknownName(f"no run {', '.join(map(repr, unknown))} at scale {scale}; choose from {', '.join(every)}.")
    if args.steps < 1:
        raise BadInput(f"--steps {args.steps}: time at least one step.")
    from vcarepro.tools.bench.train_step import classification_step, generation_step
    cls_runs = [cls_run(params, name) for name in chosen if name in params["cls_runs"]]
    gen_runs = [gen_run(params, name) for name in chosen if name in params["gen_runs"]]

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise BadInput("--device cuda was asked for but no GPU is visible; drop --device or use --device cpu.")
    cpu = device.type == "cpu"
    devices = args.devices or (torch.cuda.device_count() if torch.cuda.is_available() else 1)
    if devices < 1:
        raise BadInput(f"--devices {devices}: give at least one device.")
    cap = args.batch if args.batch is not None else (DEFAULT_CPU_BATCH if cpu else None)
    if cap is not None and cap < 1:
        raise BadInput(f"--batch {cap}: give a positive per-device batch.")

    load_before = os.getloadavg()[0]
    cls_data = cls_dataset(params, scale)
    gen_data = gen_dataset(params, scale)
    inputs = check_inputs(params, cls_runs=len(cls_runs), gen_runs=len(gen_runs), cls_prepared=cls_data.prepared)
    # What to fix first, before the minutes of stepping: each missing input once, however many params name it.
    missing = missing_inputs(inputs)
    for sentence in missing:
        print(f"error: {sentence}", file=sys.stderr, flush=True)

    costs: List[RunCost] = []
    run_problems: List[str] = []
    failures: List[str] = []  # unexpected errors (bugs), not the user's to fix
    measure = dict(devices=devices, cap=cap, device=device, repeats=args.steps)
    branches = ((cls_runs, classification_step, lambda run: cls_cost(
                    run, dataset=cls_data, num_classes=expected_classes(params), **measure)),
                (gen_runs, generation_step, lambda run: gen_cost(run, dataset=gen_data, **measure)))
    done, selected = 0, len(cls_runs) + len(gen_runs)
    now = ["stepping"]
    progress = _stepping_progress(params, selected, args.verbose, now)

    def at(text: str) -> None:
        now[0] = text
        progress.update(progress.n)

    with progress:
        for runs, build, cost_of in branches:
            if runs:
                _throw_away_step(build, runs[0], device)
            for run in runs:
                at(f"stepping {run.name}")
                try:
                    costs.append(cost_of(run))
                except UserError as err:  # an unknown arch or attention, a bad option: the run cannot be built
                    run_problems.append(f"{run.name}: {err}")
                except Exception as err:  # noqa: BLE001 - a bug: its traceback, and the other runs still measured
                    traceback.print_exc()
                    failures.append(f"{run.name}: {type(err).__name__}: {err}")
                done += 1
                progress.update(done)
        loaders = loader_rates(cls_runs, dataset=cls_data, seconds=args.loader_seconds, log=at) if cls_runs else {}
    for cost in costs:
        cost.loader_images_per_s = loaders.get(cost.run, {}).get("images_per_s")
    run_problems += [p for c in costs for p in c.problems]
    run_problems += sorted({e["error"] for e in loaders.values() if "error" in e})
    memory = device_memory(device)
    summary = fit_summary(costs, memory, cpu)
    problems = missing + run_problems + ([summary] if summary else [])

    from vcarepro.tools.bench import describe_machine
    machine = describe_machine()
    where = f"{device.type}" + (f" ({torch.cuda.get_device_name(device)})" if not cpu else f" ({machine['cpu']})")
    print(f"preflight, scale {scale}, {len(costs)} run(s), stepped on {where}, projected for {devices} device(s) "
          f"of {fmt(memory / GIB, 3)} GiB each")
    if cpu:
        print("These are CPU times: the hours columns are a CPU projection (CPU-hours on this machine), "
              "not GPU-hours.")
    load = (load_before, os.getloadavg()[0])
    cores = os.cpu_count() or 1
    busy = "; the machine was busier than its cores, so these times are inflated" if max(load) > cores else ""
    print(f"load average (1 min) {load[0]:.1f} at the start, {load[1]:.1f} at the end, on {cores} cores{busy}.")
    print(table(costs, cpu))
    print(f"step s: the median of {args.steps} timed optimizer step{'s' if args.steps != 1 else ''} after "
          f"{WARMUP_STEPS} warm-up step, at the recipe's per-device batch (global batch / (devices x accum_steps)); "
          f"* measured at the smaller batch shown and scaled linearly to the recipe's. "
          f"{'CPU' if cpu else 'GPU'}-h = seeds x steps x step s x devices / 3600 (training) + sampling "
          f"(seeds x sampling batches x sampler passes x one pass at the sampling batch / 3600, one device, "
          f"VAE decoding not included). Peak memory: "
          f"{PeakMemory(device).method}; ~ projected to the recipe's batch; fits: that peak is within the "
          f"{fmt(memory / GIB, 3)} GiB of this device. Loader: images/s of one training "
          f"process's loader at the recipe's workers.")
    print("\ninputs")
    print(f"  classification data: {cls_data.source}" if cls_runs else "  classification: no run selected")
    print(f"  generation data: {gen_data.source}" if gen_runs else "  generation: no run selected")
    for entry in {id(e): e for e in loaders.values()}.values():
        rate = f"{fmt(entry['images_per_s'], 3)} images/s" if "images_per_s" in entry else "FAILED"
        print(f"  loader ({', '.join(entry['recipes'])}; {entry['workers']} workers) on {entry['source']}: {rate}")
    for group in group_inputs(inputs):
        print(f"  {input_line(group)}")
    if not inputs:
        print("  no file from outside the repository is needed")
    sys.stdout.flush()  # the table before the sentences below, where stdout and stderr go to one place

    if args.json:
        from vcarepro.core.io import write_json
        write_json(args.json, {
            "scale": scale, "device": device.type, "cpu_projection": cpu, "devices": devices, "batch_cap": cap,
            "warmup_steps": WARMUP_STEPS, "timed_steps": args.steps,
            "machine": machine, "device_memory_bytes": memory, "load_average": load,
            "datasets": {"cls": asdict(cls_data), "gen": asdict(gen_data)},
            "inputs": [asdict(i) for i in inputs], "missing_inputs": missing,
            "loaders": [{k: v for k, v in e.items()} for e in {id(e): e for e in loaders.values()}.values()],
            "runs": [dict(asdict(c), scaled=c.scaled) for c in costs],
            "total": {k: sum(getattr(c, k) or 0.0 for c in costs)
                      for k in ("train_gpu_hours", "sample_gpu_hours", "gpu_hours")},
            "do_not_fit": [c.run for c in costs if c.fits is False],
            "problems": problems, "failures": failures,
        })
    for problem in run_problems + ([summary] if summary else []):
        print(f"error: {problem}", file=sys.stderr, flush=True)
    for failure in failures:
        print(f"failed (a bug, traceback above): {failure}", file=sys.stderr, flush=True)
    return 1 if failures else USER_ERROR_STATUS if problems else 0


if __name__ == "__main__":
    status = [0]
    run_stage(lambda: status.__setitem__(0, main()))
    raise SystemExit(status[0])
