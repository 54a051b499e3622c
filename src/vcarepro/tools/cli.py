"""``vcarepro``: one command for the project's tools.

    vcarepro <command> [arguments...]        vcarepro --help lists the commands

Each command runs its module as ``python -m vcarepro.<module>`` does, so help, output and exit status are
the module's own; ``vcarepro calibrate`` is this module's own (the README's calibration in one step).
Nothing of the package is imported until a command runs, so ``--help`` stays instant.
"""

from __future__ import annotations

import argparse
import difflib
import os
import runpy
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple

REPO_ROOT = Path(__file__).resolve().parents[3]  # the checkout this code runs from (src/vcarepro/<folder>/../..)
USER_ERROR_STATUS = 2  # vcarepro.core.errors' convention, repeated here so that --help imports nothing
WIDTH = 120  # explain's table fits this many columns (a long value may push its own row past it)

# command -> (the module it runs as __main__, one line for --help). Order: the order of --help.
WRAPPED: Dict[str, Tuple[str, str]] = {
    "config": ("vcarepro.params.config", "compose conf/ (with Hydra overrides, e.g. scale=paper) into params.yaml"),
    "preflight": ("vcarepro.tools.preflight", "before a GPU-hour: each run's inputs, memory and time on this machine"),
    "gpu-check": (
        "vcarepro.tools.gpu_check",
        "a new GPU machine's acceptance check: precisions, NCCL, SD-VAE and FID, step costs, attention",
    ),
    "cluster": ("vcarepro.tools.cluster", "the pipeline on SLURM, every stage a job (run / status / cancel)"),
    "lockcheck": (
        "vcarepro.tools.lockcheck",
        "does dvc repro here reproduce dvc.lock bit for bit (stale / verify / ...)",
    ),
    "bench": ("vcarepro.tools.bench", "benchmarks: the attention family, a training step, the whole suite"),
    "export": ("vcarepro.tools.export", "a trained classification run's weights for timm and the Hugging Face Hub"),
    "standins": ("vcarepro.tools.standins", "write the smoke scale's generated stand-ins for the external inputs"),
    "report-check": ("vcarepro.report.browser", "read the rendered report in Chromium and list its problems"),
    "explain": (
        "vcarepro.params.explain",
        "every resolved knob of a run: value, the conf/ file that set it, the stages that read it",
    ),
}
OWN: Dict[str, str] = {
    "calibrate": "released checkpoints through our evaluation: select them, then dvc repro calibrate_cls/gen",
}
ORDER = (
    "config",
    "explain",
    "preflight",
    "gpu-check",
    "calibrate",
    "cluster",
    "lockcheck",
    "bench",
    "export",
    "standins",
    "report-check",
)


def usage() -> str:
    lines = [
        "usage: vcarepro <command> [arguments...]",
        "",
        "The project's tools under one command. A command takes the arguments of the module it runs",
        "(`vcarepro <command> --help` shows them); `python -m vcarepro.<module>` works as before.",
        "",
        "commands:",
    ]
    for name in ORDER:
        text = OWN[name] if name in OWN else WRAPPED[name][1]
        lines.append(f"  {name:<14}{text}")
    lines += ["", "options:", "  -h, --help   this list", "  --version    the package's version"]
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print(usage(), file=sys.stderr)
        return USER_ERROR_STATUS
    command, rest = argv[0], argv[1:]
    if command in ("-h", "--help", "help"):
        print(usage())
        return 0
    if command == "--version":
        from vcarepro import __version__

        print(f"vcarepro {__version__}")
        return 0
    from vcarepro.core import errors

    errors.COMMAND = " ".join(["vcarepro", *map(shlex.quote, argv)])  # what a sentence tells the user to run again
    if command in WRAPPED:
        return run_module(WRAPPED[command][0], rest)
    if command in OWN:
        from vcarepro.core.errors import UserError

        try:
            return calibrate_main(rest)
        except UserError as err:  # the stages' convention (vcarepro.core.errors.run_stage)
            print(f"error: {err}", file=sys.stderr, flush=True)
            return USER_ERROR_STATUS
    close = difflib.get_close_matches(command, ORDER, n=1)
    print(
        f"error: vcarepro has no command {command!r}"
        + (f" (did you mean {close[0]}?)" if close else "")
        + f"; choose one of {', '.join(ORDER)} (`vcarepro --help`).",
        file=sys.stderr,
    )
    return USER_ERROR_STATUS


# ----------------------------------------------------------------------------- the wrapped modules


def run_module(module: str, args: Sequence[str]) -> int:
    """Run ``module`` as ``python -m module args...`` would: as ``__main__``, sys.argv[1:] = args, the working
    directory first on sys.path. Its SystemExit (status) passes through unchanged; so does any other exception."""
    sys.argv = [sys.argv[0], *args]  # runpy sets argv[0] to the module's file, as python -m does
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0


# ----------------------------------------------------------------------------- calibrate


def calibrate_main(argv: Sequence[str]) -> int:
    """Select released checkpoints (``calibrate.checkpoints``) at a scale and run their calibration stages."""
    parser = argparse.ArgumentParser(
        prog="vcarepro calibrate",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Released checkpoints through this project's evaluation, beside their published numbers "
        "(docs/calibration.md).\n\nComposes params.yaml with scale=SCALE and calibrate.checkpoints="
        "[ENTRY,...] (and any KEY=VALUE overrides), then runs `dvc repro` of calibrate_cls and/or "
        "calibrate_gen, as the entries need:\n\n"
        "  vcarepro calibrate deit_tiny dit_xl2_cfg15\n"
        "  == python -m vcarepro.params.config scale=paper 'calibrate.checkpoints=[deit_tiny,dit_xl2_cfg15]' "
        "&& dvc repro calibrate_cls calibrate_gen\n\n"
        "The entries are those of calibrate.classifiers and calibrate.generators in conf/config.yaml; "
        "put each file in data/released/ first. A new selection replaces the last one's rows.",
    )
    parser.add_argument(
        "entries",
        nargs="+",
        metavar="ENTRY|KEY=VALUE",
        help="entries to evaluate (e.g. deit_tiny); KEY=VALUE: a Hydra override of conf/",
    )
    parser.add_argument(
        "--scale",
        default="paper",
        help="the scale to calibrate at: paper (ImageNet; the default) or smoke (the stand-ins)",
    )
    parser.add_argument("--report", action="store_true", help="also bring the report stage up to date")
    parser.add_argument("--dry-run", action="store_true", help="print the two commands; change nothing")
    args = parser.parse_intermixed_args(argv)
    names = [e for e in args.entries if "=" not in e]
    overrides = [e for e in args.entries if "=" in e]
    if not names:
        parser.error("name at least one entry of calibrate.classifiers or calibrate.generators (e.g. deit_tiny)")

    from vcarepro.calibration import KINDS, selected
    from vcarepro.core.errors import MissingInput
    from vcarepro.params import config

    project = Path.cwd()
    if not args.dry_run and not (project / "dvc.yaml").is_file():
        raise MissingInput(f"{project} has no dvc.yaml; run `vcarepro calibrate` from the repository's root.")
    conf = config.project_root() / "conf"  # the cwd's conf/, else this checkout's (as vcarepro config)
    hydra = [f"scale={args.scale}", *overrides, f"calibrate.checkpoints=[{','.join(names)}]"]
    params = config.compose(hydra, conf)
    config.validate(params, config._conf_source(hydra, conf))
    kinds = [kind for kind in KINDS if selected(params["calibrate"], kind)]  # refuses an unknown entry
    stages = [f"calibrate_{kind}" for kind in kinds] + (["report"] if args.report else [])
    compose_cmd = ["python", "-m", "vcarepro.params.config", *hydra]
    repro_cmd = ["dvc", "repro", *stages]
    if args.dry_run:
        print(shlex.join(compose_cmd))
        print(shlex.join(repro_cmd))
        return 0
    config.write_params(hydra, out=project / "params.yaml", config_dir=conf)
    print(f"calibrate: params.yaml composed ({' '.join(hydra)}); running {shlex.join(repro_cmd)}", flush=True)
    return subprocess.call([sys.executable, "-m", "dvc", "repro", *stages], cwd=project)
