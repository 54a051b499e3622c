"""What the preflight prints: numbers to a few significant digits, the table of runs and its legend, the inputs it
looked at, the disk and DVC bill, and the one sentence for the runs that do not fit."""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

from vcarepro.tools.bench.timing import GIB, WARMUP_STEPS
from vcarepro.tools.preflight.cost import ESTIMATE, ROUGHLY, RunCost
from vcarepro.tools.preflight.inputs import Input, group_inputs, input_line


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
    head = [
        "run",
        "model",
        "recipe",
        "precision",
        "batch run/recipe",
        "step s",
        "seeds",
        "steps",
        "devices",
        f"train {hours}",
        f"sample {hours}",
        f"{hours}",
        "peak GiB/device",
        "fits",
        "step/loader img/s",
    ]
    rows = []
    for c in costs:
        batch = f"{c.batch_run if c.batch_run is not None else '-'}/{c.recipe_batch}" + ("*" if c.scaled else "")
        peak = "-" if c.peak_bytes is None else fmt(c.peak_bytes / GIB, 3) + ("~" if c.peak_projected else "")
        fits = {True: "yes", False: "no", None: "-"}[c.fits]
        if c.out_of_memory_at is not None:
            fits = f"no (OOM at {c.out_of_memory_at})"
        rates = (
            f"{fmt(c.step_images_per_s, 3)}/{fmt(c.loader_images_per_s, 3)}"
            if c.branch == "cls"
            else f"{fmt(c.step_images_per_s, 3)}/in memory"
        )
        rows.append(
            [
                c.run,
                c.model,
                c.recipe,
                c.precision,
                batch,
                fmt(c.step_seconds),
                str(c.seeds),
                str(c.steps),
                str(c.devices),
                fmt(c.train_gpu_hours),
                fmt(c.sample_gpu_hours),
                fmt(c.gpu_hours),
                peak,
                fits,
                rates,
            ]
        )
    total = lambda attr: sum(getattr(c, attr) or 0.0 for c in costs)  # noqa: E731
    rows.append(
        [
            "total",
            "",
            "",
            "",
            "",
            "",
            "",
            "",
            "",
            fmt(total("train_gpu_hours")),
            fmt(total("sample_gpu_hours")),
            fmt(total("gpu_hours")),
            "",
            "",
            "",
        ]
    )
    return markdown(head, rows)


def markdown(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
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
    detail = (
        f"it {misfits[0].fit_note}"
        if len(misfits) == 1
        else "fits = no in the table" + (f"; {oom} ran out of memory" if oom else "")
    )
    fix = "raise the device count (--devices K here, distributed.nproc_per_node when training)"
    if any(c.branch == "cls" for c in misfits):
        fix += " or, for a classification run, its recipe's accum_steps"
    if cpu:
        fix += "; for GPU memory, run this preflight on the GPU machine the runs will train on"
    runs = f"{len(misfits)} of {len(costs)} run{'s' if len(costs) != 1 else ''}{names}"
    return (
        f"{runs} do{'es' if len(misfits) == 1 else ''} not fit the recipe's per-device batch in {where} "
        f"({detail}): {fix}."
    )


def legend(steps: int, cpu: bool, peak_method: str, memory: int, cores: float) -> str:
    """What the table's columns hold and how the hours are computed, printed under it."""
    return (
        f"step s: the median of {steps} timed optimizer step{'s' if steps != 1 else ''} after "
        f"{WARMUP_STEPS} warm-up step, at the recipe's per-device batch (global batch / (devices x accum_steps)); "
        f"* measured at the smaller batch shown and scaled linearly to the recipe's. "
        f"{'CPU' if cpu else 'GPU'}-h = seeds x steps x step s x devices / 3600 (training) + sampling "
        f"(seeds x sampling batches x sampler passes x one pass at the sampling batch / 3600, one device, "
        f"VAE decoding not included). Peak memory: "
        f"{peak_method}; ~ projected to the recipe's batch; fits: that peak is within the "
        f"{fmt(memory / GIB, 3)} GiB of this device. Loader: the images/s the recipe's loader workers feed a device "
        f"on the run's input path (one core's rate, timed here, x its workers, at most --cores-per-device {cores:g} "
        f"less one for the training process)."
    )


def inputs_section(branches: Sequence[Any], loaders: Sequence[Dict[str, Any]], inputs: Sequence[Input]) -> str:
    """What the runs read: each branch's data, each loader timed, and each input from outside the repository once."""
    lines = ["", "inputs"]
    lines += [f"  {b.title} data: {b.dataset.source}" if b.runs else f"  {b.title}: no run selected" for b in branches]
    for entry in loaders:
        rate = f"{fmt(entry['images_per_s'], 3)} images/s a core" if "images_per_s" in entry else "FAILED"
        for batch, ms in entry.get("device_side", {}).items():
            rate += f", device side {fmt(ms, 3)} ms an image at batch {batch} on {entry['device_name']}"
        timed = f"{', '.join(entry['recipes'])}; {'PIL' if entry['input_path'] == 'pil' else 'fast'} path"
        lines.append(f"  loader ({timed}) on {entry['source']}: {rate}")
    lines += [f"  {input_line(group)}" for group in group_inputs(inputs)]
    if not inputs:
        lines.append("  no file from outside the repository is needed")
    return "\n".join(lines)


def header(
    scale: str, runs: int, where: str, devices: int, memory: int, cpu: bool, load: Tuple[float, float], cores: int
) -> str:
    """What was stepped where, for how many devices of how much memory, and how busy the machine was meanwhile."""
    lines = [
        f"preflight, scale {scale}, {runs} run(s), stepped on {where}, projected for {devices} device(s) "
        f"of {fmt(memory / GIB, 3)} GiB each"
    ]
    if cpu:
        lines.append(
            "These are CPU times: the hours columns are a CPU projection (CPU-hours on this machine), not GPU-hours."
        )
    busy = "; the machine was busier than its cores, so these times are inflated" if max(load) > cores else ""
    lines.append(f"load average (1 min) {load[0]:.1f} at the start, {load[1]:.1f} at the end, on {cores} cores{busy}.")
    return "\n".join(lines)


def _span(values: Sequence[int]) -> str:
    if not values:
        return "-"
    return str(min(values)) if min(values) == max(values) else f"{min(values)}-{max(values)}"


def _family_row(family: Any) -> List[str]:
    readers = [o.readers for o in family.outputs] if family.hash_s is not None else []  # DVC's outputs only
    return [
        family.name,
        family.where,
        fmt(family.bytes / GIB) + ("~" if family.estimated else ""),
        str(family.files),
        _span(readers),
        fmt(family.hash_s, 3),
        fmt(family.status_s, 3),
        family.cache,
        fmt(family.free / GIB),
    ]


def disk_legend(bill: Any) -> str:
    """How the DVC times are derived (rate x count, the rates timed here), what the cache column and ~ mean."""
    rates = bill.rates
    estimated = "".join(f" ~ {f.where} {f.estimated}." for f in bill.families if f.estimated)
    return (
        f"DVC hash s = files x {fmt(rates.hash_file_s * 1e3, 3)} ms + bytes / {fmt(rates.md5_bytes_per_s / 1e6, 3)} "
        f"MB/s (md5); DVC status s = files x (1 + stages reading) x {fmt(rates.check_file_s * 1e6, 3)} us, per "
        f"no-change dvc status; the rates timed here (dvc-data's build() on {rates.files} files in {rates.where}, "
        f"hashlib.md5). cache: copy holds a second copy, reflink and hardlink none, symlink the bytes on the cache's "
        f"filesystem; the cache's files are its objects, each file and each folder's .dir.{estimated}"
    )


def disk_section(bill: Any) -> str:
    """The disk and DVC bill (:class:`~.dvc_bill.Bill`): a row per output family, DVC's cache and the total, the
    free space where each lands, and the legend."""
    total = bill.total()
    head = ["output", "where", "GiB", "files DVC tracks", "stages reading", "DVC hash s", "DVC status s", "cache"]
    rows = [_family_row(f) for f in [*bill.families, bill.cache]]
    rows.append(["total", "", fmt(total["bytes"] / GIB), str(total["files"]), "", fmt(total["hash_s"], 3)])
    rows[-1] += [fmt(total["status_s"], 3), "", ""]
    title = f"disk and DVC (cache.type {','.join(bill.cache_types)})"
    return "\n".join(["", title, markdown([*head, "free GiB there"], rows), disk_legend(bill)])


# ----------------------------------------------------------------------------- --estimate-for: a GPU not here


def estimate_header(gpu: str, scale: str, runs: int) -> str:
    """What the numbers below are: an estimate, how it is made, and how rough it is."""
    return "\n".join(
        [
            f"preflight --estimate-for {gpu}, scale {scale}, {runs} run(s): an ESTIMATE, not a measurement (no {gpu} "
            f"ran these runs, and nothing was stepped here).",
            f"Estimate ({ESTIMATE}): GPU-h = images trained / (a reference model's published training images/s per "
            f"{gpu} x its training FLOPs per image / the run's) / 3600; the sources are listed below the table.",
            ROUGHLY,
        ]
    )


def estimate_table(estimates: Sequence[Any]) -> str:
    """One row per run (cost.RunEstimate) and the total: the hours, the GPUs the training job asks for, the batch."""
    gpu = estimates[0].gpu if estimates else "GPU"
    head = [
        "run",
        "model",
        "precision",
        "reference (images/s per GPU)",
        "GFLOPs/image",
        "images trained",
        f"est. images/s per {gpu}",
        "GPUs (nodes x per node)",
        "batch global/per GPU",
        f"est. {gpu} GPU-h",
        "est. wall h",
    ]
    rows = []
    for e in estimates:
        where = f"{e.nodes} x {e.gpus_per_node}" if e.gpus_from == "params" else e.gpus_from
        per_gpu = e.per_gpu_batch if e.per_gpu_batch >= 1 else "-"
        rows.append(
            [
                e.run,
                e.model,
                e.precision,
                f"{e.reference} ({fmt(e.reference_per_gpu, 4)})",
                fmt(e.flops / 1e9, 4),
                f"{e.images:,}",
                fmt(e.images_per_s, 4),
                f"{e.gpus} ({where})",
                f"{e.global_batch}/{per_gpu}" + (f" x {e.accum_steps} accum" if e.accum_steps > 1 else ""),
                fmt(e.gpu_hours, 4),
                fmt(e.wall_hours, 4),
            ]
        )
    total = estimate_total(estimates)
    rows.append(["total", "", "", "", "", f"{total['images']:,}", "", "", ""])
    rows[-1] += [fmt(total["gpu_hours"], 4), fmt(total["wall_hours"], 4)]
    return markdown(head, rows)


def estimate_total(estimates: Sequence[Any]) -> Dict[str, float]:
    """The table's total row: the sums of the runs' images, GPU-hours and wall hours (the runs one after another)."""
    return {
        "images": sum(e.images for e in estimates),
        "gpu_hours": sum(e.gpu_hours for e in estimates),
        "wall_hours": sum(e.wall_hours for e in estimates),
    }


def estimate_legend(dataset: Any, sampling: Optional[Dict[str, Any]]) -> str:
    """What the estimate's columns hold, and what it leaves out."""
    lines = [
        "GFLOPs/image: one training image, forward and backward, counted by the complexity stage's counter "
        "(metrics/complexity.py, math SDPA) on the meta device, for the run's model and the reference's alike. "
        "images trained: seeds x epochs x training images (classification"
        + (f": {dataset.source.rpartition('; ')[2]}" if dataset is not None else "")
        + "), seeds x steps x global batch (generation). The reference serves a run of its branch and kind of "
        "precision: fp16 and bf16 runs take the mixed-precision figure, fp32 and tf32 runs the other.",
        "GPUs: a training job's nodes x GPUs per node as `python -m vcarepro.tools.cluster run` asks SLURM for them "
        "(distributed.nnodes x distributed.nproc_per_node; cluster.nodes and cluster.gpus_per_node where those say "
        "env or gpu), or --devices K; per GPU batch: global / (GPUs x accum_steps). GPU-h do not depend on the GPU "
        "count here; wall h = GPU-h / GPUs, as if throughput grew linearly with the GPUs, the runs one after another.",
    ]
    left_out = "evaluation, data preparation (ImageNet's index, the SD-VAE latents) and whether the CPU loader keeps up"
    if sampling:
        left_out = (
            f"sampling ({sampling['num_samples']:,} samples a seed, the sampler's steps each, in fp32) and FID, "
            + left_out
        )
    lines.append(
        f"Not estimated: {left_out}; the preflight without --estimate-for, on that GPU, measures the steps, the "
        "sampling and the loader."
    )
    return "\n".join(lines)


def sources_section(rows: Sequence[Any], flops: Dict[Any, int]) -> str:
    """Each published figure the estimate used: the reference, its precision, its images/s as published (or as derived
    for a GPU no source covers, and from what) and per GPU, its training FLOPs per image, where it was published and
    how its setting differs from ours."""
    lines = ["", "sources (published training throughputs; every figure above is scaled from one of these)"]
    derived = []
    for row in rows:
        on = f"{fmt(row.images_per_s, 4)} images/s on {row.gpus} {row.gpu}"
        if row.gpus > 1:
            on += f" ({fmt(row.per_gpu, 4)} per GPU)"
        if row.derived:
            derived.append(row.derived)
            on += f", derived from the A100's published {fmt(row.images_per_s / row.ratio, 4)}"
        lines.append(
            f"  {row.gpu} {row.branch}: {row.reference}, {row.precision}: {on}; {fmt(flops[row] / 1e9, 4)} training "
            f"GFLOPs an image here. {row.where} ({row.source})" + (f"; {row.note}" if row.note else "") + "."
        )
    for how in dict.fromkeys(derived):
        lines.append(f"  {rows[0].gpu} figures: {how}.")
    return "\n".join(lines)


def seeds_section(seeds: Dict[str, int], tolerances: Dict[str, float], scale: str) -> str:
    """How many seeds each run trains, and what that lets the report say: one seed gives no error bar, so a
    difference between two runs has no interval and a cell is judged against the paper's single number within the
    report's tolerance only."""
    from vcarepro.metrics.intervals import ONE_SEED
    from vcarepro.report.verdicts import BETTER, REPRODUCED, SHORT

    counts = sorted(set(seeds.values()))
    if counts == [1]:
        return (
            f"\nseeds: every run of scale {scale} trains one seed, as the paper reports one training per row. "
            f"A single seed has no error bar: the report gives a difference between two runs no interval "
            f'("{ONE_SEED}"), and judges each number only against the paper\'s single number, within '
            f"report.reproduce_tolerance_top1 {tolerances['top1']:g} points of top-1 or reproduce_tolerance_fid "
            f'{tolerances["fid"]:g} of FID ("{REPRODUCED}", "{BETTER}", "{SHORT}"). Each seed more adds a run\'s '
            "hours once more (its seeds in cls_runs or gen_runs)."
        )
    many = ", ".join(str(n) for n in counts)
    return (
        f"\nseeds: the runs of scale {scale} train {many} seed(s) each; a difference between two runs of two seeds or "
        "more carries a 95% Welch interval in the report, and every seed adds its hours (counted above)."
    )
