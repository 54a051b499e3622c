"""What every run of a scale will cost on the machine at hand, and what would stop it, before it starts.

    python -m vcarepro.tools.preflight [--scale paper] [--runs NAME,...] [--batch N] [--devices K] [--steps N]
                                 [--device cuda] [--cores-per-device K] [--json PATH] [--loader-seconds S]
                                 [--verbose] [--estimate-for A100|H100] [KEY=VALUE ...]

For every ``cls_runs`` and ``gen_runs`` entry of the scale (params composed with ``scale=<scale>`` and
any Hydra overrides given, e.g. ``prepare_cls.imagenet_root=/data/imagenet``; params.yaml is not touched)
it builds the model, EMA, optimizer, loss and precision as training does
(:mod:`vcarepro.tools.bench.train_step`) and runs one warm-up step and ``--steps`` timed steps (default 3; the
median is reported) at the recipe's per-device batch (global batch / (devices x accum_steps)), or at
``--batch`` if that is smaller, the time then scaled linearly to the recipe's batch. It records the peak
memory of those steps (``torch.cuda.max_memory_allocated`` on a GPU, the growth of the process's peak RSS
on a CPU) and, where the batch was capped, projects it to the recipe's batch (what lives between steps
stays, the rest grows with the batch). It times what one CPU core feeds on each classification run's input
path (and the fast path's device side) and says, per run, whether a node's ``--cores-per-device`` cores would
keep its device busy ("GPU-bound") or not ("loader-bound"). It measures the cost of sampling (forward passes at
the sampling batch, counted by running the real sampler on a stand-in model), and checks the files the scale
needs. Inputs that are missing do not stop the
measurement: the models run on random tensors of the right shape. Last it prints the disk and DVC bill: per output
family (data/cls, data/gen, checkpoints, trained weights, samples, DVC's cache under its cache.type) the bytes, the
files DVC tracks, the stages reading them, DVC's seconds to hash them and to check them in a no-change ``dvc status``
(rates timed here, in a second), and the free space where each lands.

What it prints leads with what to fix: first one ``error:`` sentence per missing input (an input several
params name, such as the SD-VAE, once), before any run is stepped; then the table (its ``fits`` column
says whether the recipe's per-device batch fits this device); then any problem of a single run, and one
sentence counting the runs that do not fit. Progress goes to stderr through :mod:`vcarepro.core.progress`: a bar on a
terminal, a line every ``progress.interval_s`` in a log, and a line at every run with ``--verbose``.

``--estimate-for A100`` (or ``H100``) steps nothing: for a GPU this machine need not have, it estimates each run's
GPU-hours from a published training throughput of a reference model on that GPU, scaled by the reference's training
FLOPs per image over the run's (both counted by the complexity stage's counter), times the images the recipe trains;
beside them the GPUs a training job asks for and the per-GPU batch, the seeds and what they let the report say, the
sources of every figure, and the disk bill. It says it is an estimate, not a measurement (docs/scales.md, "Planning a
GPU run").

Exit status 0: every selected run can start here. 2: at least one problem (a missing input, a run that
does not fit, a split too small for one batch, ...), each printed as an ``error: ...`` sentence; an
unknown scale or run name stops at once with one sentence, and so does a filesystem too small for what the runs put
there (unless --no-disk-check), after the disk bill and before any run is stepped or --json written. 1: a run failed
unexpectedly (a bug: its traceback is printed, the other runs are still measured).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from vcarepro.core.errors import USER_ERROR_STATUS, BadInput, UnknownName, UserError
from vcarepro.params.config import REPO_ROOT, compose, load_params, section
from vcarepro.params.runs import cls_run, gen_run
from vcarepro.tools.bench.timing import TIMED_STEPS, WARMUP_STEPS, PeakMemory, device_memory, throw_away_step
from vcarepro.tools.preflight import dvc_bill, loader
from vcarepro.tools.preflight.branches import Branch, classification, generation, run_cost
from vcarepro.tools.preflight.cost import (
    ESTIMATE,
    RunCost,
    RunEstimate,
    estimate_gpu_hours,
    gpu_named,
    reference_flops,
    reference_for,
    run_flops,
    trained_images,
)
from vcarepro.tools.preflight.inputs import Input, check_inputs, missing_inputs
from vcarepro.tools.preflight.sizing import dataset, expected_classes
from vcarepro.tools.preflight.table import (
    disk_section,
    estimate_header,
    estimate_legend,
    estimate_table,
    estimate_total,
    fit_summary,
    header,
    inputs_section,
    legend,
    seeds_section,
    sources_section,
    table,
)

DEFAULT_CPU_BATCH = 2


def scales() -> List[str]:
    return sorted(p.stem for p in (REPO_ROOT / "conf" / "scale").glob("*.yaml"))


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m vcarepro.tools.preflight",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--scale", help="the scale to check (default: the scale of ./params.yaml)")
    parser.add_argument(
        "--runs",
        action="append",
        default=[],
        help="comma-separated cls_runs / gen_runs entries (default: every run of the scale)",
    )
    parser.add_argument(
        "--batch",
        type=int,
        help="cap on the per-device batch actually run (default on a CPU: "
        f"{DEFAULT_CPU_BATCH}; on a GPU: none); the time is scaled linearly",
    )
    parser.add_argument("--devices", type=int, help="devices the runs will train on (default: visible GPUs, or 1)")
    parser.add_argument("--device", help="where to step the models (default: cuda if visible, else cpu)")
    parser.add_argument(
        "--steps",
        "--repeats",
        dest="steps",
        type=int,
        default=TIMED_STEPS,
        help=f"timed steps per run after {WARMUP_STEPS} warm-up step; the table shows their median "
        f"(default {TIMED_STEPS})",
    )
    parser.add_argument(
        "--loader-seconds",
        type=float,
        default=3.0,
        help="seconds of timing one core's loader per distinct training input",
    )
    parser.add_argument(
        "--cores-per-device",
        type=float,
        help="CPU cores a training node has per device, which its loader workers run on (default: the cores this "
        "process may use over this machine's GPUs, or all of them without one; give the node's own elsewhere)",
    )
    parser.add_argument("--json", help="also write everything to this JSON file")
    parser.add_argument(
        "--no-disk-check",
        dest="disk_check",
        action="store_false",
        help="print the disk bill, but do not stop where this machine's filesystems are too small (the outputs will "
        "land on another machine's)",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="a progress line at each run stepped (default: a bar on a terminal, a line every "
        "progress.interval_s seconds in a log)",
    )
    parser.add_argument(
        "--estimate-for",
        metavar="GPU",
        help="step nothing: estimate each run's GPU-hours on this GPU (A100 or H100) from published training "
        "throughputs scaled by the runs' FLOPs; an estimate, not a measurement, with its sources",
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="Hydra overrides after scale=<scale>, as dvc exp run -S takes them "
        "(e.g. prepare_cls.imagenet_root=/data/imagenet)",
    )
    return parser.parse_args(argv)


def composed(scale: Optional[str], overrides: Sequence[str]) -> Tuple[str, Dict[str, Any]]:
    """The scale asked for (else ./params.yaml's, else embedded) and its params composed with ``overrides``, checked."""
    known = scales()
    scale = scale or (load_params("params.yaml").get("scale") if Path("params.yaml").is_file() else None) or "embedded"
    if scale not in known:
        raise UnknownName(f"no scale {scale!r} under conf/scale/; choose one of {', '.join(known)}.")
    try:
        params = compose([f"scale={scale}", *overrides])
    except Exception as err:  # noqa: BLE001 - Hydra's override errors are the user's to fix
        if type(err).__module__.split(".")[0] not in ("hydra", "omegaconf"):
            raise
        raise BadInput(
            f"the overrides {' '.join(overrides)} do not apply to conf/: {str(err).strip().splitlines()[0]}"
        ) from None
    from vcarepro.params.schema import ParamsError, validate

    try:
        validate(params, f"the scale={scale} composition")
    except ParamsError as err:
        raise BadInput(str(err)) from None
    return scale, params


def selected(params: Dict[str, Any], scale: str, runs: Sequence[str]) -> List[str]:
    """The run names of ``--runs`` (comma-separated, repeatable), or every run of the scale."""
    every = [*params["cls_runs"], *params["gen_runs"]]
    chosen = [name.strip() for arg in runs for name in arg.split(",") if name.strip()] or every
    unknown = [name for name in chosen if name not in every]
    if unknown:
        raise UnknownName(f"no run {', '.join(map(repr, unknown))} at scale {scale}; choose from {', '.join(every)}.")
    return chosen


def hardware(args) -> Tuple[torch.device, int, Optional[int], float]:
    """(where to step, the devices to project for, the cap on the per-device batch run, CPU cores per device)."""
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise BadInput("--device cuda was asked for but no GPU is visible; drop --device or use --device cpu.")
    devices = args.devices or (torch.cuda.device_count() if torch.cuda.is_available() else 1)
    if devices < 1:
        raise BadInput(f"--devices {devices}: give at least one device.")
    cap = args.batch if args.batch is not None else (DEFAULT_CPU_BATCH if device.type == "cpu" else None)
    if cap is not None and cap < 1:
        raise BadInput(f"--batch {cap}: give a positive per-device batch.")
    cores = args.cores_per_device
    if cores is None:  # this machine's cores (those this process may use) over its GPUs
        cores = len(os.sched_getaffinity(0)) / max(torch.cuda.device_count(), 1)
    if not cores > 0:
        raise BadInput(f"--cores-per-device {args.cores_per_device}: give a positive number of cores.")
    return device, devices, cap, cores


def step_every_run(
    branches: Sequence[Branch], progress, doing: Callable[[str], None], **measure
) -> Tuple[List[RunCost], List[str], List[str]]:
    """Every selected run stepped and costed (:func:`run_cost` with ``measure``), each branch after one throw-away
    step: (the costs, the runs that cannot be built as problems, the runs that failed unexpectedly as failures)."""
    costs: List[RunCost] = []
    problems: List[str] = []
    failures: List[str] = []  # unexpected errors (bugs), not the user's to fix
    for branch in branches:
        if branch.runs:
            throw_away_step(branch.step, branch.runs[0], measure["device"])
        for run in branch.runs:
            doing(f"stepping {run.name}")
            try:
                costs.append(run_cost(branch, run, **measure))
            except UserError as err:  # an unknown arch or attention, a bad option: the run cannot be built
                problems.append(f"{run.name}: {err}")
            except Exception as err:  # noqa: BLE001 - a bug: its traceback, and the other runs still measured
                traceback.print_exc()
                failures.append(f"{run.name}: {type(err).__name__}: {err}")
            progress.advance()
    return costs, problems, failures


@dataclass
class Findings:
    """Everything one preflight found, what it prints (:func:`print_findings`) and writes with --json."""

    scale: str
    device: torch.device
    devices: int
    batch_cap: Optional[int]
    steps: int
    memory: int
    machine: Dict[str, Any]
    load: Tuple[float, float]
    cores: float
    branches: Sequence[Branch]
    inputs: Sequence[Input]
    missing: List[str]
    loaders: Dict[str, Dict[str, Any]]
    costs: Sequence[RunCost]
    bounds: Dict[str, str]
    disk: dvc_bill.Bill
    problems: List[str]
    failures: List[str]

    def as_json(self) -> Dict[str, Any]:
        return {
            "scale": self.scale,
            "device": self.device.type,
            "cpu_projection": self.device.type == "cpu",
            "devices": self.devices,
            "batch_cap": self.batch_cap,
            "warmup_steps": WARMUP_STEPS,
            "timed_steps": self.steps,
            "machine": self.machine,
            "device_memory_bytes": self.memory,
            "load_average": self.load,
            "datasets": {branch.name: asdict(branch.dataset) for branch in self.branches},
            "inputs": [asdict(i) for i in self.inputs],
            "missing_inputs": self.missing,
            "loaders": [dict(entry) for entry in loader.distinct(self.loaders)],
            "cores_per_device": self.cores,
            "bounds": self.bounds,
            "disk": self.disk.as_json(),
            "runs": [dict(asdict(c), scaled=c.scaled) for c in self.costs],
            "total": {
                k: sum(getattr(c, k) or 0.0 for c in self.costs)
                for k in ("train_gpu_hours", "sample_gpu_hours", "gpu_hours")
            },
            "do_not_fit": [c.run for c in self.costs if c.fits is False],
            "problems": self.problems,
            "failures": self.failures,
        }


def print_findings(found: Findings) -> None:
    """The header, the table and its legend, what bounds each classification step, the inputs and the disk and DVC
    bill, on stdout."""
    device, cpu = found.device, found.device.type == "cpu"
    where = f"{device.type}" + (f" ({torch.cuda.get_device_name(device)})" if not cpu else f" ({found.machine['cpu']})")
    cores = os.cpu_count() or 1
    print(header(found.scale, len(found.costs), where, found.devices, found.memory, cpu, found.load, cores))
    print(table(found.costs, cpu))
    print(legend(found.steps, cpu, PeakMemory(device).method, found.memory, found.cores))
    if found.bounds:
        print(f"\nwhat bounds each classification step, at {found.cores:g} CPU cores per device (--cores-per-device)")
        print("\n".join(f"  {line}" for line in found.bounds.values()))
    print(inputs_section(found.branches, loader.distinct(found.loaders), found.inputs))
    print(disk_section(found.disk))
    sys.stdout.flush()  # the table before the sentences below, where stdout and stderr go to one place


def loader_bounds(costs, loaders, workers: Dict[str, int], cores: float, device: torch.device) -> Dict[str, str]:
    """What the loaders feed, set on ``costs`` for ``cores`` per device, and each classification run's line (through
    :func:`.loader.what_bounds`) saying whether its device or its loader bounds a step."""
    for cost in costs:
        per_core = loaders.get(cost.run, {}).get("images_per_s")
        if per_core is not None:
            cost.loader_images_per_s = per_core * loader.feeding_workers(cores, workers[cost.run])
    return {
        c.run: line
        for c in costs
        if (line := loader.what_bounds(c, loaders.get(c.run), cores, workers.get(c.run, 0), device))
    }


def _stepping_progress(params, total: int, verbose: bool) -> Tuple[Any, Callable[[str], None]]:
    """The preflight's progress through :mod:`vcarepro.core.progress`, as every long loop reports: on a terminal a bar
    on stderr (what it is doing, "stepping deit_tiny-vca", beside it); in a log a line on stderr every
    ``progress.interval_s``, the table on stdout left clean; ``--verbose`` a line at every run. Returns the progress
    and ``doing(text)``, which says what it is doing now."""
    from vcarepro.core import progress as reporting

    reporting.configure(params, "preflight", interval_s=0.0 if verbose else None)
    on_terminal = not verbose and reporting.is_terminal(sys.stderr)
    now = ["stepping"]
    progress = reporting.Progress(
        None,
        total,
        unit="run",
        figures=lambda: dict([now[0].partition(" ")[::2]]),
        bar=on_terminal,
        stream=None if on_terminal else sys.stderr,
    )

    def doing(text: str) -> None:
        now[0] = text
        progress.update(progress.n)

    return progress, doing


def _step(args, params, branches, cls_runs, gen_runs, device, devices, cap, memory):
    """Every run stepped and costed, then the input path timed for each classification run: (costs, the runs'
    problems, failures, loader rates)."""
    progress, doing = _stepping_progress(params, len(cls_runs) + len(gen_runs), args.verbose)
    # What lives across the runs (torch, timm, the composed params) is frozen out of the garbage collector, as the GPU
    # check does: release_memory's gc.collect() around each run would otherwise walk that whole heap (0.23 s a call).
    gc.collect()
    gc.freeze()
    try:
        with progress:
            costs, run_problems, failures = step_every_run(
                branches, progress, doing, devices=devices, cap=cap, device=device, memory=memory, repeats=args.steps
            )
            batches = {c.run: c.recipe_batch for c in costs}
            loaders = (
                loader.loader_rates(
                    cls_runs,
                    dataset=branches[0].dataset,
                    seconds=args.loader_seconds,
                    device=device,
                    batches=batches,
                    log=doing,
                )  # fmt: skip
                if cls_runs
                else {}
            )
    finally:
        gc.unfreeze()
    return costs, run_problems, failures, loaders


def estimate_runs(
    params: Dict[str, Any], scale: str, names: Sequence[str], gpu: str, devices: Optional[int] = None
) -> Tuple[List[RunEstimate], Tuple[Branch, Branch]]:
    """Each of ``names`` estimated on ``gpu`` (cost.ESTIMATE): its training FLOPs per image and its reference's, the
    images it trains, and the GPUs its training job asks for (``devices`` where given); and the two branches."""
    cls_runs = [cls_run(params, name) for name in names if name in params["cls_runs"]]
    gen_runs = [gen_run(params, name) for name in names if name in params["gen_runs"]]
    classes = expected_classes(params)
    branches = (
        classification(cls_runs, dataset("cls", params, scale), num_classes=classes),
        generation(gen_runs, dataset("gen", params, scale)),
    )
    from vcarepro.tools.cluster.driver import training_gpus

    nodes, per_node = training_gpus(params)
    gpus_from = "params"
    if devices is not None:
        if devices < 1:
            raise BadInput(f"--devices {devices}: give at least one device.")
        nodes, per_node, gpus_from = 1, devices, "--devices"
    counted: Dict[Any, int] = {}  # training FLOPs per image, once a model (twins and SiT share DiT's models)
    estimates = []
    for branch in branches:
        for run in branch.runs:
            key = (branch.name, repr(run.model), repr(run.shape), getattr(run.recipe, "img_size", None))
            if key not in counted:
                counted[key] = run_flops(run, branch.name, classes)
            row = reference_for(gpu, branch.name, run.recipe.precision)
            if row not in counted:
                counted[row] = reference_flops(row)
            images = trained_images(run, branch.name, branch.dataset.train_images)
            rate, hours = estimate_gpu_hours(images, counted[key], row, counted[row])
            estimates.append(
                RunEstimate(
                    run=run.name,
                    branch=branch.name,
                    model=run.model["arch"] + "/" + run.model["attention"],
                    recipe=run.recipe_name if branch.name == "cls" else run.objective,
                    precision=run.recipe.precision,
                    seeds=len(run.seeds),
                    images=images,
                    flops=counted[key],
                    gpu=gpu,
                    reference=row.label,
                    reference_per_gpu=row.per_gpu,
                    reference_flops=counted[row],
                    images_per_s=rate,
                    gpu_hours=hours,
                    nodes=nodes,
                    gpus_per_node=per_node,
                    global_batch=run.recipe.batch_size,
                    accum_steps=getattr(run.recipe, "accum_steps", 1),
                    gpus_from=gpus_from,
                )
            )
    return estimates, branches


def estimate(args) -> int:
    """--estimate-for: every selected run estimated on the GPU named (nothing stepped), the sources, the seeds and the
    disk bill, printed (and --json); exit status 0."""
    gpu = gpu_named(args.estimate_for)
    scale, params = composed(args.scale, args.overrides)
    names = selected(params, scale, args.runs)
    estimates, branches = estimate_runs(params, scale, names, gpu, args.devices)
    rows = list(dict.fromkeys(reference_for(gpu, e.branch, e.precision) for e in estimates))
    flops = {reference_for(gpu, e.branch, e.precision): e.reference_flops for e in estimates}
    seeds = {e.run: e.seeds for e in estimates}
    report = section(params, "report")
    tolerances = {"top1": report["reproduce_tolerance_top1"], "fid": report["reproduce_tolerance_fid"]}
    sampling = branches[1].runs[0].sampling if branches[1].runs else None
    print(estimate_header(gpu, scale, len(estimates)))
    here = torch.cuda.get_device_name(0) if torch.cuda.is_available() else ""
    if gpu.lower() in here.lower():
        print(f"This machine has an {here}: the preflight without --estimate-for measures these runs on it.")
    print(estimate_table(estimates))
    print(estimate_legend(branches[0].dataset if branches[0].runs else None, sampling))
    print(sources_section(rows, flops))
    print(seeds_section(seeds, tolerances, scale))
    disk = dvc_bill.bill(params, branches)
    print(disk_section(disk))
    print("The free space is this machine's: the bill's bytes are what the runs write wherever they train.")
    sys.stdout.flush()
    if args.json:
        from vcarepro.core.io import write_json

        write_json(
            args.json,
            {
                "estimate_for": gpu,
                "method": ESTIMATE,
                "measured": False,
                "scale": scale,
                "runs": [
                    dict(asdict(e), gpus=e.gpus, per_gpu_batch=e.per_gpu_batch, wall_hours=e.wall_hours)
                    for e in estimates
                ],
                "total": estimate_total(estimates),
                "sources": [dict(asdict(row), per_gpu=row.per_gpu, training_flops=flops[row]) for row in rows],
                "seeds": seeds,
                "disk": disk.as_json(),
            },
        )
    return 0


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.estimate_for is not None:
        return estimate(args)
    scale, params = composed(args.scale, args.overrides)
    names = selected(params, scale, args.runs)
    if args.steps < 1:
        raise BadInput(f"--steps {args.steps}: time at least one step.")
    cls_runs = [cls_run(params, name) for name in names if name in params["cls_runs"]]
    gen_runs = [gen_run(params, name) for name in names if name in params["gen_runs"]]
    device, devices, cap, cores = hardware(args)

    load_before = os.getloadavg()[0]
    branches = (
        classification(cls_runs, dataset("cls", params, scale), num_classes=expected_classes(params)),
        generation(gen_runs, dataset("gen", params, scale)),
    )
    inputs = check_inputs(
        params, cls_runs=len(cls_runs), gen_runs=len(gen_runs), cls_prepared=branches[0].dataset.prepared
    )
    # What to fix first, before the minutes of stepping: each missing input once, however many params name it.
    missing = missing_inputs(inputs)
    for sentence in missing:
        print(f"error: {sentence}", file=sys.stderr, flush=True)

    # What the disk must hold, before anything is stepped or written: a filesystem too small for it ends here.
    disk = dvc_bill.bill(params, branches)
    if args.disk_check and disk.shortfalls():
        print(disk_section(disk), flush=True)
        for sentence in disk.shortfalls():
            print(f"error: {sentence}", file=sys.stderr, flush=True)
        return USER_ERROR_STATUS
    memory = device_memory(device)
    stepped = _step(args, params, branches, cls_runs, gen_runs, device, devices, cap, memory)
    costs, run_problems, failures, loaders = stepped
    bounds = loader_bounds(costs, loaders, {run.name: run.recipe.workers for run in cls_runs}, cores, device)
    run_problems += [p for c in costs for p in c.problems]
    run_problems += sorted({e["error"] for e in loaders.values() if "error" in e})
    summary = fit_summary(costs, memory, device.type == "cpu")
    problems = missing + run_problems + ([summary] if summary else [])

    from vcarepro.tools.bench import describe_machine

    found = Findings(
        scale=scale,
        device=device,
        devices=devices,
        batch_cap=cap,
        steps=args.steps,
        memory=memory,
        machine=describe_machine(),
        load=(load_before, os.getloadavg()[0]),
        cores=cores,
        branches=branches,
        inputs=inputs,
        missing=missing,
        loaders=loaders,
        costs=costs,
        bounds=bounds,
        disk=disk,
        problems=problems,
        failures=failures,
    )
    print_findings(found)
    if args.json:
        from vcarepro.core.io import write_json

        write_json(args.json, found.as_json())
    for problem in run_problems + ([summary] if summary else []):
        print(f"error: {problem}", file=sys.stderr, flush=True)
    for failure in failures:
        print(f"failed (a bug, traceback above): {failure}", file=sys.stderr, flush=True)
    return 1 if failures else USER_ERROR_STATUS if problems else 0
