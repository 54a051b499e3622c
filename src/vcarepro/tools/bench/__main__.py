"""python -m vcarepro.tools.bench [all] [--quick] [--json bench.json]   every benchmark, one table each
python -m vcarepro.tools.bench attention [--batch 8] [--layers vca agent ...] [--no-compile] [--json out.json]
python -m vcarepro.tools.bench train-step --run dit_s2-vca [--batch 32] [--device cuda] [--precision bf16]
python -m vcarepro.tools.bench loader [--root DIR] [--recipe lab_deit_tiny] [--device cuda] [--json out.json]
python -m vcarepro.tools.bench imagenet-scale [--scratch DIR] [--workers 2] [--json out.json]"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import asdict

import torch

from vcarepro.core.errors import run_stage
from vcarepro.core.io import write_json
from vcarepro.tools.bench.attention_cost import BENCH_LAYERS, bench_attention, family_speed_table, speed_targets
from vcarepro.tools.bench.timing import describe_machine


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m vcarepro.tools.bench", description=__doc__)
    sub = parser.add_subparsers(dest="suite")
    every = sub.add_parser("all", help="every benchmark on this machine (the default)")
    every.add_argument("--quick", action="store_true", help="shorter timings and sizes (a smoke run)")
    every.add_argument("--json", default="bench.json", help="write every figure and the machine here")
    _attention_options(sub)
    step = sub.add_parser("train-step", help="a paper-scale DiT/SiT training step, and the GPU-hours of a full run")
    step.add_argument("--run", default="dit_s2-vca", help="a gen_runs or cls_runs entry of --scale")
    step.add_argument("--scale", default="paper", choices=["paper", "proxy"])
    step.add_argument("--batch", type=int, default=32, help="images per device (DiT: 256 over 8 GPUs)")
    step.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    step.add_argument("--precision", default="bf16", choices=["fp32", "bf16", "fp16"])
    step.add_argument("--min-run-time", type=float, default=2.0, help="seconds of timed steps, after one warm-up")
    step.add_argument("--json", help="also write the figures and the machine to this JSON file")
    load = sub.add_parser(
        "loader",
        help="the training input path per image: the PIL path and the fast path's CPU side per core, its device side, "
        "and the decode-only ceiling, on the same files",
    )
    load.add_argument("--root", help="a prepared layout or any folder of images (default: generated photographs)")
    load.add_argument("--images", type=int, default=64, help="images generated, or taken from --root")
    load.add_argument("--recipe", default="lab_deit_tiny", help="the paper-scale classification recipe")
    load.add_argument("--seconds", type=float, default=6.0, help="seconds of timing per path")
    load.add_argument("--device", help="where the device side runs (default: cuda if visible, else cpu)")
    load.add_argument(
        "--batch", type=int, help="the device side's batch (default: the recipe's per-GPU batch on 8 GPUs)"
    )
    load.add_argument(
        "--workers", type=int, help="DataLoader workers for the through-the-loader figures (default: cores)"
    )
    load.add_argument("--json", help="also write the figures and the machine to this JSON file")
    scale = sub.add_parser(
        "imagenet-scale",
        help="ImageNet-1K's file count (generated archives of tiny JPEGs) through the paper scale's preparation and "
        "DVC, before and after, and the fast path's CPU rate from an archive against files",
    )
    scale.add_argument("--scratch", help="where the archives (about 2.5 GB) and repositories go (default: $TMPDIR)")
    scale.add_argument("--workers", type=int, default=os.cpu_count(), help="the preparation's processes")
    scale.add_argument("--before-files", type=int, default=20_000, help="extracted images the old layout is timed on")
    scale.add_argument("--images", type=int, default=256, help="photographs the fast path's two reads are timed on")
    scale.add_argument("--seconds", type=float, default=6.0, help="seconds of timing per read")
    scale.add_argument("--json", help="also write the figures and the machine to this JSON file")
    return parser


def _attention_options(sub) -> None:
    att = sub.add_parser(
        "attention",
        help="every attention of the family at DeiT-T width, N = 196, 784, 3136, "
        "eager and compiled, and the speed targets",
    )
    att.add_argument("--sides", type=int, nargs="+", default=[14, 28, 56], help="patch-grid sides (N = side^2)")
    att.add_argument("--batch", type=int, default=8)
    att.add_argument("--dim", type=int, default=192)
    att.add_argument("--heads", type=int, default=3)
    att.add_argument(
        "--contrast-tokens",
        type=int,
        default=49,
        help="pooled tokens of every layer that pools (VCA's contrast tokens, Agent's agent tokens)",
    )
    att.add_argument(
        "--layers",
        nargs="+",
        default=list(BENCH_LAYERS),
        choices=BENCH_LAYERS,
        metavar="LAYER",
        help=f"the layers to measure (default every one: {' '.join(BENCH_LAYERS)})",
    )
    att.add_argument(
        "--no-compile",
        dest="compile",
        action="store_false",
        help="skip torch.compile timings (on a CPU each layer and N compiles for seconds)",
    )
    att.add_argument("--min-run-time", type=float, default=1.0, help="seconds of timing per measurement")
    att.add_argument("--device", default="cpu")
    att.add_argument("--json", help="also write the figures and the machine to this JSON file")


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] not in ("all", "attention", "train-step", "loader", "imagenet-scale", "-h", "--help"):
        argv = ["all", *argv]  # the whole suite is the default
    args = _parser().parse_args(argv)

    machine = describe_machine()
    if args.suite == "all":
        from vcarepro.tools.bench.run_all import run_all

        run_all(machine, quick=args.quick, json_path=args.json)
        return
    if args.suite == "train-step":  # a step is timed as training runs it, on every thread
        machine["timed_threads"] = torch.get_num_threads()
    print("machine: " + ", ".join(f"{k}={v}" for k, v in machine.items()))
    suite = {"loader": _loader, "imagenet-scale": _imagenet_scale, "train-step": _train_step, "attention": _attention}
    figures = suite[args.suite](args)
    if args.json:
        write_json(args.json, {"machine": machine, **figures}, sort_keys=False, end="")


def _loader(args) -> dict:
    from vcarepro.tools.bench.loader import bench_loader, loader_table

    figures = bench_loader(
        root=args.root,
        recipe_name=args.recipe,
        seconds=args.seconds,
        device=args.device,
        batch=args.batch,
        workers=args.workers,
        images=args.images,
    )
    print(f"{figures['recipe']}'s augmentation at 224 px, on {figures['files']} files: {figures['source']}")
    print(loader_table(figures))
    return {"loader": figures}


def _imagenet_scale(args) -> dict:
    from vcarepro.tools.bench.imagenet_scale import bench_imagenet_scale, imagenet_scale_table

    figures = bench_imagenet_scale(
        args.scratch, workers=args.workers, before_files=args.before_files, images=args.images, seconds=args.seconds
    )
    print(imagenet_scale_table(figures))
    return {"imagenet_scale": figures}


def _train_step(args) -> dict:
    from vcarepro.tools.bench.train_step import bench_train_step

    row = bench_train_step(
        args.run,
        scale=args.scale,
        batch=args.batch,
        device=args.device,
        precision=args.precision,
        min_run_time=args.min_run_time,
    )
    print(
        f"{row['run']} ({row['objective']}), {row['precision']} on {row['device']}, "
        f"batch {row['batch_per_device']}: "
        f"{row['ms_per_step']:.1f} ms/step, {row['images_per_second']:.1f} images/s, "
        f"peak {row['peak_bytes'] / 2**30:.2f} GiB"
        + (f" (out of memory at batch {row['out_of_memory_at']})" if row["out_of_memory_at"] else "")
    )
    if row["under_load"]:
        print(f"not a figure to trust: {row['under_load']}; run it again when nothing else runs here")
    print(
        f"projected: {row['recipe_steps']} steps at global batch {row['global_batch']} = "
        f"{row['projected_device_hours']:.1f} device-hours (compute only; an estimate, not a measurement "
        f"of a full run)"
    )
    return {"train_step": row}


def _attention(args) -> dict:
    rows = bench_attention(
        args.sides,
        dim=args.dim,
        heads=args.heads,
        batch=args.batch,
        contrast_tokens=args.contrast_tokens,
        layers=args.layers,
        compile=args.compile,
        min_run_time=args.min_run_time,
        device=args.device,
        log=lambda line: print(f"  {line}", file=sys.stderr, flush=True),
    )
    print(
        f"attention layer, width {args.dim}, {args.heads} heads, batch {args.batch}, "
        f"{args.contrast_tokens} pooled tokens, no prefix tokens, median wall time (ms)"
        + ("" if args.compile else "; torch.compile skipped (--no-compile)")
    )
    print(family_speed_table(rows))
    targets = speed_targets(rows)
    print("\n".join(targets))
    failed = [f"{r.layer} N={r.tokens}: {r.compile_error}" for r in rows if r.compile_error]
    if failed:
        print("torch.compile failed for: " + "; ".join(failed))
    return {"config": vars(args), "attention": [asdict(r) for r in rows], "targets": targets}


if __name__ == "__main__":
    run_stage(main, what="the benchmark")
