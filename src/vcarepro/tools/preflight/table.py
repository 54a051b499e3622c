"""What the preflight prints: numbers to a few significant digits, the table of runs and its legend, the inputs it
looked at, the disk and DVC bill, and the one sentence for the runs that do not fit."""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

from vcarepro.tools.bench.timing import GIB, WARMUP_STEPS
from vcarepro.tools.preflight.cost import RunCost
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
