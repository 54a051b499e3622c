"""A new GPU machine's acceptance check, before the first real job: every paper-scale path that has so far run only
on CPUs, run once here, each part passing or failing with a one-line reason.

    vcarepro gpu-check [--out DIR] [--budget-s 480] [--profile] [--parts steps,ddp,...] [--no-compile] [--tiny]
    python -m vcarepro.tools.gpu_check ...   (the same)

The parts, in order, each given a share of ``--budget-s`` (what one leaves goes to the next):

  steps      every distinct architecture, recipe and objective of the smoke scale, resolved at the paper scale
             (paper shape, the published recipe), stepped in its recipe's precision (fp16 with its GradScaler, tf32;
             bf16 is the proxy's, below) and with torch.compile where the recipe sets it; no recipe does, so one VCA
             classifier is also stepped compiled (inductor) as a probe
  ddp        one DistributedDataParallel step through torchrun (the launcher's command), one process, NCCL
  fid        the SD-VAE-shaped stand-in's encode and decode, and FID through the project's evaluator, Inception on
             the device (stand-in weights: the number means nothing)
  loader     the fast input path's device side at the lab DeiT-T recipe's per-device batch, a training step fed by
             it beside the same step on a ready batch, and the images/s one of this machine's cores feeds
  cost       the preflight's step time (median of the timed steps after a warm-up) and peak memory
             (torch.cuda.max_memory_allocated) of the proxy runs (one GPU) and the same runs at the paper scale
             (--paper-devices per node), at the recipe's own per-device batch, nothing scaled
  attention  one layer of each attention of the family in bf16, forward and forward+backward, at N = 196, 784 and
             3136, against timm's fused (flash) MHSA
  profile    (--profile) torch.profiler's slowest ops of VCA and of MHSA at N = 3136, also in DIR/profile.txt

It writes DIR/gpu_check.json (everything) and DIR/gpu_check.md (the same rows as tables), naming the device and the
torch, timm, CUDA and Triton versions, and prints the Markdown. Without a CUDA device it runs every part at tiny sizes
(--tiny): the code paths, and the table says "CPU, tiny sizes: not a GPU measurement".

It imports neither DVC nor dvclive. It needs diffusers and torch-fidelity (steps, fid, cost) and hydra-core with
omegaconf (the runs are composed from conf/); where a machine lacks them, carry their wheels (docs/performance.md,
"GPU check"): a part that misses one fails with one line saying so, and the others still run.

Exit status 0: every part passed. 1: a part failed or ran out of its time (its reason says which). 2: bad options
(one ``error:`` sentence).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from vcarepro.core.errors import BadInput, UnknownName
from vcarepro.tools.gpu_check.parts import PASS, SKIPPED, Check, Part, run_parts

DEFAULT_BUDGET_S = 480.0  # 8 minutes, leaving room in a device call of at most 10
JSON_FILE, MARKDOWN_FILE = "gpu_check.json", "gpu_check.md"
PACKAGES = ("torch", "timm", "triton", "diffusers", "torch-fidelity", "hydra-core", "omegaconf", "numpy")


def _parts() -> Dict[str, Part]:
    from vcarepro.tools.gpu_check import attention, ddp, fid, loader, steps

    return {
        part.name: part
        for part in (
            Part("steps", "the smoke matrix at paper shape, in each recipe's precision", 0.28, steps.steps_part),
            Part("ddp", "one DDP step through torchrun", 0.10, ddp.ddp_part),
            Part("fid", "the SD-VAE stand-in and FID on the device", 0.10, fid.fid_part),
            Part("loader", "the fast input path's device side, and a step it feeds", 0.07, loader.loader_part),
            Part("cost", "the preflight's step time and peak memory at the recipe's batch", 0.22, steps.cost_part),
            Part(
                "attention",
                "one layer of each family member vs timm's fused MHSA, bf16",
                0.18,
                attention.attention_part,
            ),
            Part("profile", "torch.profiler: VCA and MHSA at the largest N", 0.05, attention.profile_part),
        )
    }


PART_NAMES = ("steps", "ddp", "fid", "loader", "cost", "attention", "profile")
PARTS: Dict[str, Part] = {}  # filled on first use (importing the parts imports torch); a test may replace one


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="vcarepro gpu-check", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default="gpu-check", help="the folder to write into (default ./gpu-check)")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=DEFAULT_BUDGET_S,
        help=f"seconds for every part (default {DEFAULT_BUDGET_S:g})",
    )
    parser.add_argument(
        "--parts",
        default=None,
        help=f"comma-separated parts to run (default: all but profile): {', '.join(PART_NAMES)}",
    )
    parser.add_argument("--profile", action="store_true", help="add the profile part (torch.profiler, profile.txt)")
    parser.add_argument("--no-compile", dest="compile", action="store_false", help="step nothing under torch.compile")
    parser.add_argument("--tiny", action="store_true", help="tiny sizes: the code paths only (forced without CUDA)")
    parser.add_argument("--device", help="cuda (the default where one is visible) or cpu")
    parser.add_argument("--smoke-batch", type=int, help="per-device batch of the steps part (default 8; tiny 2)")
    parser.add_argument(
        "--paper-devices", type=int, default=8, help="devices a paper run trains on (its per-device batch; default 8)"
    )
    parser.add_argument("--steps", type=int, help="timed steps per run of the cost part (default 5; tiny 2)")
    return parser.parse_args(list(argv))


def chosen_parts(args: argparse.Namespace) -> List[str]:
    if args.parts is None:
        names = [n for n in PART_NAMES if n != "profile" or args.profile]
    else:
        names = [n.strip() for n in args.parts.split(",") if n.strip()]
        unknown = [n for n in names if n not in PART_NAMES]
        if unknown or not names:
            what = f"no part {', '.join(map(repr, unknown))}" if unknown else "names no part"
            raise UnknownName(f"--parts {args.parts!r}: {what}; choose from {', '.join(PART_NAMES)}.")
        if args.profile and "profile" not in names:
            names.append("profile")
    return [n for n in PART_NAMES if n in names]


def output_folder(out: str) -> Path:
    """``--out``, created if missing; a file there, or a folder that cannot be made, is one sentence."""
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise BadInput(f"--out {out} is a file, not a folder; give a folder to write the check's results into.")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise BadInput(f"--out {out} cannot be created ({err.strerror}); give a folder you can write to.") from None
    if not os.access(path, os.W_OK):
        raise BadInput(f"--out {out} is not writable; give a folder you can write to.")
    return path


def check_options(args: argparse.Namespace) -> None:
    if not args.budget_s > 0:
        raise BadInput(f"--budget-s {args.budget_s:g}: give a positive number of seconds.")
    for name in ("smoke_batch", "paper_devices", "steps"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise BadInput(f"--{name.replace('_', '-')} {value}: give a positive number.")
    if args.device not in (None, "cuda", "cpu"):
        raise BadInput(f"--device {args.device}: give cuda or cpu.")


def versions() -> Dict[str, Optional[str]]:
    """The versions the table names: the packages (read from their metadata, nothing imported), CUDA, cuDNN."""
    from importlib import metadata

    import torch

    found: Dict[str, Optional[str]] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    found["cuda"] = torch.version.cuda
    found["cudnn"] = str(torch.backends.cudnn.version()) if torch.backends.cudnn.is_available() else None
    return found


def describe(device) -> Dict[str, Any]:
    import torch

    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return {
            "type": "cuda",
            "name": torch.cuda.get_device_name(device),
            "memory_gib": props.total_memory / 1024**3,
            "capability": f"{props.major}.{props.minor}",
            "count": torch.cuda.device_count(),
        }
    from vcarepro.report.environment import cpu_name

    return {"type": "cpu", "name": cpu_name() or platform.processor() or "CPU", "cores": os.cpu_count()}


def log(line: str) -> None:
    print(f"gpu-check: {line}", file=sys.stderr, flush=True)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    out = output_folder(args.out)
    check_options(args)
    names = chosen_parts(args)

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise BadInput("--device cuda was asked for but no GPU is visible; drop --device to check this CPU (tiny).")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    tiny = args.tiny or device.type != "cuda"
    note = None
    if tiny:
        note = "CPU, tiny sizes: not a GPU measurement" if device.type == "cpu" else "tiny sizes: not a measurement"
    options = {"smoke_batch": args.smoke_batch, "paper_devices": args.paper_devices, "steps": args.steps}
    check = Check(device, tiny, compile=args.compile, profile=args.profile, out=out, options=options, log=log)
    if not PARTS:
        PARTS.update(_parts())
    started = time.time()
    log(f"{device.type}{' (tiny sizes)' if tiny else ''}: {', '.join(names)} in {args.budget_s:g} s")
    if tiny and "ddp" in names:
        early_ddp(check, args.budget_s)
    grace = min(max(0.1 * args.budget_s, 2.0), 30.0)
    try:
        parts = run_parts([PARTS[n] for n in names], check, args.budget_s, grace_s=grace)
    finally:  # Ctrl-C or an error too: torchrun runs in a session of its own, which a terminal's Ctrl-C misses
        stop_early_ddp(check)
    result = {
        "tool": "vcarepro gpu-check",
        "command": "vcarepro gpu-check" + ("" if not argv else " " + shlex.join(argv)),
        "started": datetime.datetime.fromtimestamp(started, datetime.timezone.utc).isoformat(timespec="seconds"),
        "seconds": time.time() - started,
        "budget_s": args.budget_s,
        "device": describe(device),
        "versions": versions(),
        "tiny": tiny,
        "note": note,
        "compile": args.compile,
        "parts": parts,
        "passed": all(p["status"] in (PASS, SKIPPED) for p in parts),
    }
    write(out, result)
    return 0 if result["passed"] else 1


def early_ddp(check: Check, budget_s: float) -> None:
    """At tiny sizes, torchrun starts now and its imports overlap the parts before ``ddp``; should it fail to start,
    the part starts it again in its turn and says why."""
    from vcarepro.tools.gpu_check import ddp

    try:
        check.options["ddp_launched"] = ddp.launch(check, budget_s)
    except Exception as err:  # noqa: BLE001 - the ddp part reports it, in its turn
        log(f"ddp: not started early ({err}); it starts in its turn")


def stop_early_ddp(check: Check) -> None:
    """An early torchrun that no part waited for (its part replaced, or abandoned before it) is stopped."""
    launched = check.options.pop("ddp_launched", None)
    if launched is not None:
        import shutil

        from vcarepro.tools.gpu_check import ddp

        ddp.stop(launched)
        shutil.rmtree(launched.folder, ignore_errors=True)


def write(out: Path, result: Dict[str, Any]) -> None:
    """gpu_check.json and gpu_check.md, each written whole or not at all; the Markdown also on stdout."""
    from vcarepro.core.io import write_bytes, write_json
    from vcarepro.tools.gpu_check.report import markdown

    text = markdown(result)
    write_json(out / JSON_FILE, result, sort_keys=False)
    write_bytes(out / MARKDOWN_FILE, text.encode())
    print(text, flush=True)
    log(f"wrote {out / JSON_FILE} and {out / MARKDOWN_FILE}")
