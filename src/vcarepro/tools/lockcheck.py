"""Does this machine's `dvc repro` reproduce the committed dvc.lock bit for bit?

``python -m vcarepro.tools.lockcheck stale``
    before ``dvc repro``: fails when ``dvc status`` reports anything but missing outputs, i.e. when a
    git-tracked dependency, a parameter or a command changed after dvc.lock was recorded (a stale lock:
    it no longer describes what the code produces).
``python -m vcarepro.tools.lockcheck verify``
    after ``dvc repro`` or ``dvc pull``: hashes every output file on disk (DVC's md5; a directory output file by
    file into its ``.dir`` hash) and fails when any differs from the committed lock (``git show HEAD:dvc.lock``),
    naming the outputs, their files, the machine that recorded the lock and this one.
``python -m vcarepro.tools.lockcheck compare-locks``
    the workspace's dvc.lock against the committed one, hashing no file: a check of what ``dvc repro`` recorded,
    not of the bytes on disk (after ``dvc pull`` the two locks are the same file).
``python -m vcarepro.tools.lockcheck record``
    writes dvc.lock.machine.json, the machine that recorded dvc.lock (CPU, ISA flags, libraries, numerics
    profile as a stage's process sees them, through ``stages/run.py -m vcarepro.core.numerics``); commit it
    with the lock.
``python -m vcarepro.tools.lockcheck drift [--move NAME==VERSION] [--keep]``
    by hand: the embedded pipeline in a fresh clone under the newest releases pyproject.toml allows, each output
    compared with the committed lock (:mod:`vcarepro.tools.drift`).
``python -m vcarepro.tools.lockcheck fingerprint [--out F] [--compare G]``
    hashes of what each op and each layer of the embedded models computes (forward and backward), of the
    digit extractor's training step, FID's matrix square root and the logistic-regression reference,
    under this process's numerics. Recorded on one machine and compared on another, it names the first
    op that differs when a lock does not reproduce. ``tests/test_numerics.py`` compares it natively and
    on an emulated AMD EPYC (qemu-user) on every CI run.

``stale`` and ``verify`` first name, in one line, the packages installed here at other versions than the ones
dvc.lock was recorded under (dvc.lock.machine.json's ``packages``; :mod:`vcarepro.core.environment`).

Every hash in dvc.lock is a result: the outputs that held wall times now write them to timings/, and the
report's page is a record beside its results.json (dvc.yaml). Exit status 1 on a difference, 2 on bad use.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import yaml

from vcarepro.core import environment
from vcarepro.core.environment import MACHINE_RECORD
from vcarepro.core.errors import refused
from vcarepro.core.io import write_bytes

LOCK = "dvc.lock"


def lock_outputs(lock: dict) -> Dict[Tuple[str, str], str]:
    """{(stage, output path): its hash} of a parsed dvc.lock."""
    out = {}
    for stage, entry in (lock.get("stages") or {}).items():
        for item in entry.get("outs") or []:
            digest = item.get("md5") or item.get("hash") or item.get("etag") or ""
            out[(stage, item["path"])] = digest
    return out


def compare_locks(recorded: dict, here: dict) -> List[str]:
    """One line per output whose hash differs (or that one lock has and the other lacks)."""
    a, b = lock_outputs(recorded), lock_outputs(here)
    lines = []
    for key in sorted(set(a) | set(b)):
        stage, path = key
        if key not in b:
            lines.append(f"{path} ({stage}): in the committed lock, not produced here")
        elif key not in a:
            lines.append(f"{path} ({stage}): produced here, not in the committed lock")
        elif a[key] != b[key]:
            lines.append(f"{path} ({stage}): {b[key][:12]} here, {a[key][:12]} in the committed lock")
    return lines


def describe(machine: Optional[dict]) -> str:
    if not machine:
        return f"unknown (no {MACHINE_RECORD})"
    profile = machine.get("profile") or {}
    caches = machine.get("caches") or {}
    return (
        f"{machine.get('cpu')} ({machine.get('vendor')} family/model/stepping {machine.get('family_model', '?')}, "
        f"caches {', '.join(f'{k} {v}' for k, v in caches.items()) or '?'}, ISA {' '.join(machine.get('isa') or [])}; "
        f"{machine.get('libc')}; ATen {machine.get('aten_capability')}, "
        f"numerics.cpu={profile.get('cpu')}, {machine.get('threads')} threads, "
        f"torch {(machine.get('libraries') or {}).get('torch')})"
    )


def _cache_object(root: Path, digest: str) -> Path:
    return root / ".dvc" / "cache" / "files" / "md5" / digest[:2] / digest[2:]


def _dir_listing(root: Path, digest: str) -> Optional[Dict[str, str]]:
    """{relative path: md5} of a directory output, from the ``.dir`` object in this workspace's DVC cache."""
    if not digest.endswith(".dir"):
        return None
    path = _cache_object(root, digest)
    try:
        return {entry["relpath"]: entry["md5"] for entry in json.loads(path.read_text())}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def output_files(root: Path, lock: dict) -> Dict[str, Dict[str, str]]:
    """{directory output: {file: md5}} for every directory output of ``lock`` whose listing this cache holds."""
    listings = {}
    for (_, path), digest in lock_outputs(lock).items():
        listing = _dir_listing(root, digest)
        if listing is not None:
            listings[path] = listing
    return listings


def file_differences(recorded: Optional[Dict[str, str]], here: Optional[Dict[str, str]]) -> str:
    """Which files of a directory output differ, as a clause (empty when either listing is unknown)."""
    if recorded is None or here is None:
        return ""
    names = sorted(n for n in set(recorded) | set(here) if recorded.get(n) != here.get(n))
    shown = ", ".join(
        f"{n} ({'only here' if n not in recorded else 'only recorded' if n not in here else 'differs'})"
        for n in names[:8]
    )
    return (
        f"; files: {shown}{', ...' if len(names) > 8 else ''}"
        if names
        else f"; every file hashes as {MACHINE_RECORD} lists it (a listing recorded with another lock)"
    )


def this_machine(root: Path) -> dict:
    """The machine and numerics a stage's process sees here: ``stages/run.py -m vcarepro.core.numerics``."""
    done = subprocess.run(
        [sys.executable, "stages/run.py", "-m", "vcarepro.core.numerics"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        raise SystemExit(
            f"error: `python stages/run.py -m vcarepro.core.numerics` failed: {done.stderr.strip()[-500:]}"
        )
    return json.loads(done.stdout)


def committed_lock(root: Path) -> dict:
    done = subprocess.run(["git", "show", f"HEAD:{LOCK}"], cwd=root, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        print(
            f"error: no committed {LOCK} to compare with ({done.stderr.strip()}); run this in a git clone.",
            file=sys.stderr,
        )
        raise SystemExit(2)
    return yaml.safe_load(done.stdout) or {}


def stale_entries(status: dict, outputs: List[str] = ()) -> List[str]:
    """What `dvc status --json` reports besides missing outputs: a dep that is, holds or lies inside one of
    ``outputs`` (every stage's, from dvc.lock) changes with them (the report's `runs`), so it says nothing."""

    def derived(path: str) -> bool:
        return any(
            path == o or o.startswith(path.rstrip("/") + "/") or path.startswith(o.rstrip("/") + "/") for o in outputs
        )

    lines = []
    for stage, changes in status.items():
        for change in changes:
            if not isinstance(change, dict):  # "changed checksum", "always changed"
                lines.append(f"{stage}: {change}")
                continue
            for kind, detail in change.items():
                if kind in ("changed outs", "changed deps") and isinstance(detail, dict):
                    bad = {
                        p: s
                        for p, s in detail.items()
                        if s not in ("deleted", "not in cache") and not (kind == "changed deps" and derived(p))
                    }
                    lines += [f"{stage}: {kind[8:-1]} {p} {s}" for p, s in bad.items()]
                else:
                    lines.append(f"{stage}: {kind} {detail if not isinstance(detail, dict) else ', '.join(detail)}")
    return lines


def software(root: Path) -> None:
    """First, before any hash: the packages installed here at other versions than dvc.lock was recorded under."""
    line = environment.moved_line(root)
    if line:
        print(f"lockcheck: {line}", file=sys.stderr, flush=True)


def cmd_stale(root: Path) -> int:
    software(root)
    done = subprocess.run(
        [sys.executable, "-m", "dvc", "status", "--json"], cwd=root, capture_output=True, text=True, timeout=1800
    )
    if done.returncode != 0:
        print(f"error: dvc status failed: {done.stderr.strip()[-500:]}", file=sys.stderr)
        return 2
    lock = yaml.safe_load((root / LOCK).read_text()) if (root / LOCK).is_file() else {}
    lines = stale_entries(json.loads(done.stdout or "{}"), [path for _, path in lock_outputs(lock or {})])
    if lines:
        print(
            f"dvc.lock is stale: {len(lines)} change(s) since it was recorded, so it no longer describes what "
            "the code produces; re-record it (README command 1 on a fresh clone, then commit its dvc.lock and "
            f"`python -m vcarepro.tools.lockcheck record`'s {MACHINE_RECORD}):",
            file=sys.stderr,
        )
        for line in lines:
            print(f"  {line}", file=sys.stderr)
        return 1
    print("lockcheck: dvc status reports only missing outputs; dvc.lock describes this code")
    return 0


def _md5(path: Path) -> str:
    from dvc_data.hashfile.hash import file_md5

    return file_md5(str(path))


def hash_on_disk(path: Path) -> Tuple[Optional[str], Optional[Dict[str, str]], int, int]:
    """(DVC's md5 of ``path``, {file: md5} when it is a directory, files hashed, bytes hashed); no md5 when absent."""
    if path.is_file():
        return _md5(path), None, 1, path.stat().st_size
    if not path.is_dir():
        return None, None, 0, 0
    from dvc_data.hashfile.hash_info import HashInfo
    from dvc_data.hashfile.tree import Tree

    files = sorted(f for f in path.rglob("*") if f.is_file())
    listing = {f.relative_to(path).as_posix(): _md5(f) for f in files}
    tree = Tree()
    for name, digest in listing.items():
        tree.add(tuple(name.split("/")), None, HashInfo("md5", digest))
    tree.digest()
    return tree.hash_info.value, listing, len(files), sum(f.stat().st_size for f in files)


def cache_restores(root: Path, digest: str, recorded: Optional[Dict[str, str]], here: Optional[Dict[str, str]]) -> bool:
    """Whether this workspace's cache holds, intact, the committed bytes of every file of an output that differs
    here: then the damage is the workspace's alone, and `dvc checkout --force` puts the lock's bytes back."""
    if not digest.endswith(".dir"):
        wanted = [digest]
    elif recorded is None:
        return False
    else:
        wanted = [md5 for name, md5 in recorded.items() if (here or {}).get(name) != md5]
    return all(_cache_object(root, md5).is_file() and _md5(_cache_object(root, md5)) == md5 for md5 in wanted)


def disk_differences(root: Path, lock: dict, recorded_files: Dict[str, Dict[str, str]]) -> Tuple[List[str], int, int]:
    """One line per output of ``lock`` whose bytes on disk hash otherwise, naming a directory's files; and how many
    files and bytes were hashed."""
    lines, files, size = [], 0, 0
    for (stage, path), digest in sorted(lock_outputs(lock).items(), key=lambda item: item[0][1]):
        here, listing, n, b = hash_on_disk(root / path)
        files, size = files + n, size + b
        if here == digest:
            continue
        cached = _dir_listing(root, digest)
        if here is None:
            restore = cache_restores(root, digest, cached, {})
            lines.append(
                f"{path} ({stage}): in the committed lock, missing on disk"
                + (f"; `dvc checkout --force {path}` restores it from DVC's cache" if restore else "")
            )
        else:
            recorded = cached or recorded_files.get(path)
            lines.append(
                f"{path} ({stage}): {here[:12]} on disk, {digest[:12]} in the committed lock"
                + file_differences(recorded, listing)
                + (
                    f"; DVC's cache holds the committed bytes, so `dvc checkout --force {path}` restores them"
                    if cache_restores(root, digest, cached, listing)
                    else ""
                )
            )
    return lines, files, size


def _machine(root: Path) -> Optional[dict]:
    return json.loads((root / MACHINE_RECORD).read_text()) if (root / MACHINE_RECORD).is_file() else None


def cmd_verify(root: Path) -> int:
    software(root)
    recorded = committed_lock(root)
    machine = _machine(root)
    lines, files, size = disk_differences(root, recorded, (machine or {}).get("files") or {})
    hashed = f"{files} files, {size / 1e6:.1f} MB hashed"
    if lines:
        print(
            f"the outputs on disk differ from the committed dvc.lock in {len(lines)} output(s) ({hashed}): if "
            f"`dvc repro` wrote them, this machine does not reproduce the lock (recorded on {describe(machine)}; "
            f"this machine: {describe(this_machine(root))}; compare `python stages/run.py -m vcarepro.tools.lockcheck "
            "fingerprint` on both to find the op); if `dvc pull` fetched them, the remote holds other bytes than the "
            "lock names (pull again after `dvc remote modify <remote> verify true`, which refuses them); where a line "
            "names `dvc checkout --force`, only the workspace's copy changed:",
            file=sys.stderr,
        )
        for line in lines:
            print(f"  {line}", file=sys.stderr)
        return 1
    print(
        f"lockcheck: all {len(lock_outputs(recorded))} outputs on disk hash as in the committed dvc.lock ({hashed}; "
        f"recorded on {describe(machine)}; verified on {describe(this_machine(root))})"
    )
    return 0


def cmd_compare_locks(root: Path) -> int:
    software(root)
    recorded = committed_lock(root)
    here = yaml.safe_load((root / LOCK).read_text()) or {}
    lines = compare_locks(recorded, here)
    if lines:
        recorded_files = (_machine(root) or {}).get("files") or {}
        here_files = output_files(root, here)
        print(
            f"the workspace's dvc.lock names other hashes than the committed one for {len(lines)} output(s) (lock "
            "against lock; `lockcheck verify` hashes the files):",
            file=sys.stderr,
        )
        for line in lines:
            path = line.split(" (", 1)[0]
            print(f"  {line}{file_differences(recorded_files.get(path), here_files.get(path))}", file=sys.stderr)
        return 1
    print(
        f"lockcheck: the workspace's dvc.lock names the committed hash of all {len(lock_outputs(here))} outputs "
        "(lock against lock; no file hashed)"
    )
    return 0


def cmd_record(root: Path) -> int:
    machine = this_machine(root)
    lock = yaml.safe_load((root / LOCK).read_text()) or {}
    machine["files"] = output_files(root, lock)  # so that a verify elsewhere names the file that differs
    missing = sorted(
        path
        for (_, path), digest in lock_outputs(lock).items()
        if digest.endswith(".dir") and path not in machine["files"]
    )
    if missing:
        print(
            f"error: the DVC cache here lacks the listing of {', '.join(missing)}; run `dvc repro` (README "
            f"command 1) in this workspace before recording.",
            file=sys.stderr,
        )
        return 2
    write_bytes(root / MACHINE_RECORD, (json.dumps(machine, indent=1, sort_keys=True) + "\n").encode())
    print(f"lockcheck: {MACHINE_RECORD} written: {describe(machine)}")
    return 0


# -- the fingerprint: what each op and layer computes here -------------------------------------------------------


def _digest(value) -> str:
    import numpy as np
    import torch

    if isinstance(value, torch.Tensor):
        value = value.detach().contiguous().cpu().numpy()
    return hashlib.sha256(np.ascontiguousarray(value).tobytes()).hexdigest()[:16]


def fingerprint(params_path: str = "params.yaml") -> Dict[str, str]:
    """{name: hash} of ops, of every layer's output of the embedded DeiT-T and DiT-S/2 (MHSA and VCA) and their
    parameters' gradients, of two steps of the digit extractor's training, of FID's sqrtm and of a
    logistic-regression fit. Names sort in the order they are computed within each family; one generator draws
    every input, in that order."""
    import torch

    import vcarepro.models  # noqa: F401 (registers the models)
    from vcarepro.core import numerics

    numerics.enter()  # the in-process part of the profile the environment names, as every stage's run_stage does
    from vcarepro.params.config import load_params

    out: Dict[str, str] = {}
    g = torch.Generator().manual_seed(0)
    _op_digests(out, g)
    _model_digests(out, load_params(params_path), g)
    _fit_digests(out, g)
    return out


def _op_digests(out: Dict[str, str], g) -> None:
    import torch
    import torch.nn.functional as F

    a, b = torch.randn(257, 193, generator=g), torch.randn(193, 131, generator=g)
    x = torch.randn(16, 3, 16, 16, generator=g)
    ops = {
        "randn": a,
        "matmul": a @ b,
        "softmax": F.softmax(a, -1),
        "gelu": F.gelu(a),
        "exp": a.exp(),
        "layer_norm": F.layer_norm(a, (193,)),
        "sum": a.sum(0),
        "conv2d": F.conv2d(x, torch.randn(8, 3, 3, 3, generator=g), padding=1),
        "depthwise_conv2d": F.conv2d(x, torch.randn(3, 1, 3, 3, generator=g), padding=1, groups=3),
        "sdpa": F.scaled_dot_product_attention(*(torch.randn(2, 2, 49, 32, generator=g) for _ in range(3))),
        # oneMKL's vector math where ATen uses it (numerics.VML_OPS), as AdamW, torch-fidelity's precision /
        # recall (cdist) and Inception Score (float64 log) call it
        "sqrt": (a.abs() + 1e-3).sqrt(),
        "log_float64": (a.abs() + 1e-3).double().log(),
        "atan": a.atan(),
        "cdist": torch.cdist(a[:40], a[40:90]),
        # and what DiT's timestep embedding, GELU's tanh form, SiT's GVP path and the losses call
        "sin": a.sin(),
        "cos": a.cos(),
        "tanh": a.tanh(),
        "erf": a.erf(),
        "log2": (a.abs() + 1e-3).log2(),
        "erfinv": (a / 10).clamp(-0.99, 0.99).erfinv(),
        "log": (a.abs() + 1e-3).log(),
    }
    for name, value in ops.items():
        out[f"op.{name}"] = _digest(value)


def _trace(out: Dict[str, str], prefix: str, model, *inputs) -> None:
    """Every module's output of one forward of ``model``, then every parameter's gradient of its mean square."""
    hooks = [
        module.register_forward_hook(
            lambda m, i, o, name=name: out.__setitem__(f"{prefix}.fwd.{name or '(model)'}", _digest(o))
        )
        for name, module in model.named_modules()
    ]
    try:
        y = model(*inputs)
    finally:
        for hook in hooks:
            hook.remove()
    y.float().square().mean().backward()
    for name, p in model.named_parameters():
        if p.grad is not None:
            out[f"{prefix}.grad.{name}"] = _digest(p.grad)


def _model_digests(out: Dict[str, str], params, g) -> None:
    import torch

    from vcarepro.params.runs import cls_run, gen_run
    from vcarepro.train.classification import ClassifierSpec
    from vcarepro.train.generation import GeneratorSpec

    for run in ("deit_tiny-mhsa", "deit_tiny-vca"):
        if run not in params["cls_runs"]:
            continue
        torch.manual_seed(0)
        model = ClassifierSpec.for_run(cls_run(params, run)).create(num_classes=10)
        size = cls_run(params, run).recipe.img_size
        _trace(out, f"cls.{run}", model, torch.randn(4, 3, size, size, generator=g))
    for run in ("dit_s2-mhsa", "dit_s2-vca"):
        if run not in params["gen_runs"]:
            continue
        torch.manual_seed(0)
        model = GeneratorSpec.for_run(gen_run(params, run)).create()
        shape = params["gen_shape"]
        side = shape.get("input_size", 32)
        xs = torch.randn(4, shape.get("in_channels", 4), side, side, generator=g)
        _trace(out, f"gen.{run}", model, xs, torch.tensor([1.0, 10.0, 100.0, 500.0]), torch.tensor([0, 1, 2, 3]))


def _fit_digests(out: Dict[str, str], g) -> None:
    """The digit extractor's training, FID's sqrtm and the logistic regression of cls_reference."""
    import numpy as np
    import scipy.linalg
    import torch
    from sklearn.linear_model import LogisticRegression

    from vcarepro.metrics.digit_features import train_feature_net

    images = torch.randint(0, 256, (64, 1, 8, 8), generator=g, dtype=torch.uint8)  # one step of 64 (oneDNN's JIT
    labels = torch.randint(0, 10, (64,), generator=g)  # is slow under emulation)
    net, _ = train_feature_net(images, labels, epochs=1, seed=0, num_classes=10)
    for name, p in net.state_dict().items():
        out[f"digits.{name}"] = _digest(p)
    m = np.random.default_rng(0).standard_normal((300, 64))
    cov = m.T @ m / 300
    out["fid.cov"] = _digest(cov)
    out["fid.sqrtm"] = _digest(scipy.linalg.sqrtm(cov @ (cov + np.eye(64))).real)
    fit = LogisticRegression(max_iter=200).fit(m, (m[:, 0] + m[:, 1] > 0).astype(int))
    out["cls_reference.logreg"] = _digest(fit.coef_)


def compare_fingerprints(recorded: Dict[str, str], here: Dict[str, str]) -> List[str]:
    return [
        f"{name}: {here.get(name)} here, {recorded.get(name)} recorded"
        for name in recorded
        if recorded.get(name) != here.get(name)
    ]


def cmd_fingerprint(args) -> int:
    prints = fingerprint(args.params)
    if args.out:
        write_bytes(args.out, (json.dumps(prints, indent=1) + "\n").encode())
    if args.compare:
        recorded = json.loads(Path(args.compare).read_text())
        lines = compare_fingerprints(recorded, prints)
        if lines:
            print(
                f"{len(lines)} of {len(recorded)} differ; the first computed is where the numerics part:",
                file=sys.stderr,
            )
            for line in lines:
                print(f"  {line}", file=sys.stderr)
            return 1
        print(f"lockcheck: all {len(recorded)} fingerprints agree")
    elif not args.out:
        json.dump(prints, sys.stdout, indent=1)
        print()
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vcarepro.tools.lockcheck", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("stale", help="before dvc repro: dvc status reports only missing outputs")
    sub.add_parser("verify", help="after dvc repro or pull: every output file on disk hashes as the committed dvc.lock")
    sub.add_parser("compare-locks", help="the workspace's dvc.lock against the committed one, no file hashed")
    sub.add_parser("record", help=f"write {MACHINE_RECORD} for this machine")
    drift = sub.add_parser(
        "drift", help="by hand: dvc repro under the newest releases pyproject.toml allows, against the committed lock"
    )
    drift.add_argument(
        "--move", action="append", default=[], metavar="NAME==VERSION", help="hold a package at another release"
    )
    drift.add_argument("--keep", action="store_true", help="keep the temporary clone and its venv")
    fp = sub.add_parser("fingerprint", help="hashes of ops and layers under this process's numerics")
    fp.add_argument("--params", default="params.yaml")
    fp.add_argument("--out")
    fp.add_argument("--compare")
    args = parser.parse_args(argv)
    try:
        return _run(args, Path.cwd())
    except Exception as err:  # a user error or a full disk: one line
        return refused(err)


def _run(args, root: Path) -> int:
    if args.command == "fingerprint":
        return cmd_fingerprint(args)
    if args.command == "drift":
        from vcarepro.tools import drift as drift_check

        try:
            return drift_check.run(root, args.move, args.keep)
        except drift_check.DriftError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    commands = {"stale": cmd_stale, "verify": cmd_verify, "compare-locks": cmd_compare_locks, "record": cmd_record}
    return commands[args.command](root)


if __name__ == "__main__":
    raise SystemExit(main())
