"""``python -m vcarepro.tools.lockcheck drift``: would the newest releases pyproject.toml allows reproduce dvc.lock?

docs/reproducibility.md#drift says what it runs and its exit statuses. uv is the resolver and installer
because README command 1 installs with it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from vcarepro.core import environment, errors, supervise
from vcarepro.core.io import write_text

# what requirements/compile resolves for: the project's machines (CPython 3.11, Linux x86_64)
TARGET = ["--python-version", "3.11", "--python-platform", "x86_64-manylinux_2_28"]
MOVE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9.+!_-]+$")
STEP_S = {"compile": 600, "install": 1800, "repro": 7200, "verify": 1800}


class DriftError(Exception):
    """Bad use or a missing tool: one sentence, exit status 2."""


def find_uv() -> str:
    """README command 1's uv: beside this interpreter (the venv's bin/) or on PATH."""
    beside = Path(sys.executable).parent / "uv"
    found = str(beside) if beside.is_file() else shutil.which("uv")
    if not found:
        raise DriftError("the drift check needs uv, which README command 1 installs: python3 -m pip install uv")
    return found


def pip_constraints() -> List[str]:
    """The constraint files pip itself applies here (a capped torch, say), so the newest is one pip would install."""
    files = os.environ.get("PIP_CONSTRAINT", "").split()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired:
        raise DriftError("`pip config list` did not answer in 60 s; set PIP_CONSTRAINT and run again") from None
    for line in done.stdout.splitlines() if done.returncode == 0 else ():
        match = re.match(r"^[^=]*\.constraint='(.*)'$", line.strip())
        if match:
            files += match.group(1).split()
    return [f for i, f in enumerate(files) if f not in files[:i] and Path(f).is_file()]


def moved_packages(locked: Dict[str, str], newest: Dict[str, str]) -> List[str]:
    """``scikit-learn 1.9.1 -> 1.8.0`` for each package the resolution moves, ``+ name version`` / ``- name
    version`` for one it adds or drops, in name order."""
    lines = []
    for name in sorted(set(locked) | set(newest)):
        was, now = locked.get(name), newest.get(name)
        if was == now:
            continue
        lines.append(
            f"+ {name} {now}" if was is None else f"- {name} {was}" if now is None else f"{name} {was} -> {now}"
        )
    return lines


class StepFailed(Exception):
    """A step that timed out or could not start: the run failed (exit status 1), its folder is kept."""


def _step(what: str, argv: Sequence[str], *, cwd: Path, env: Optional[dict] = None, log: Optional[Path] = None):
    """One bounded step in a session of its own, so that a timeout or Ctrl-C stops everything it started (DVC's
    stages too, not only ``dvc``); its output goes to ``log`` when given, else is kept for the failure's line."""
    out = open(log, "w") if log else subprocess.PIPE  # noqa: SIM115  (a log stream, closed below)
    started = None
    try:  # one block from the start: a signal that comes as soon as the step runs still stops it
        try:
            started = subprocess.Popen(
                list(argv), cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, text=True, start_new_session=True
            )
        except OSError as err:
            raise StepFailed(f"could not start {argv[0]} for the {what} step: {err.strerror or err}") from None
        finally:
            if log:
                out.close()
        stdout, _ = started.communicate(timeout=STEP_S[what])
    except (subprocess.TimeoutExpired, KeyboardInterrupt, supervise.Terminated) as err:
        if started is not None:
            with supervise.forwarding(lambda signum: None):  # a second signal must not cut the stop short
                supervise.stop(started, 10, group=True, reap_s=30)
        if not isinstance(err, subprocess.TimeoutExpired):
            raise
        raise StepFailed(
            f"the {what} step ran past {STEP_S[what]} s and was stopped: {' '.join(argv[:4])} ..."
        ) from None
    return subprocess.CompletedProcess(started.args, started.returncode, stdout or "", None)


def run(root: Path, moves: Sequence[str] = (), keep: bool = False) -> int:
    root = Path(root).resolve()
    for move in moves:
        if not MOVE.match(move):
            raise DriftError(f"--move {move!r} is not name==version; give one exact release, e.g. --move numpy==2.3.5")
    lock_file = root / environment.LOCK_FILE
    if not lock_file.is_file():
        raise DriftError(f"no {environment.LOCK_FILE} in {root}; run the drift check in the project's checkout")
    uv = find_uv()
    locked = environment.pins(lock_file.read_text())
    work = Path(tempfile.mkdtemp(prefix="vcarepro-drift-"))  # about 6 GB of venv and the pipeline: TMPDIR places it
    try:
        with supervise.terminated_raises():
            return _run(root, uv, locked, work, moves)
    except StepFailed as err:
        keep = True
        print(f"drift: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        keep = True
        print(errors.interrupted_line("the drift check", "the same command"), file=sys.stderr)
        return errors.INTERRUPTED_STATUS
    except supervise.Terminated as err:  # `timeout`, a scheduler's cancel: the step's session goes too
        keep = True
        print(err.line("the drift check"), file=sys.stderr)
        return err.status
    finally:
        if keep:
            print(f"drift: kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


def _run(root: Path, uv: str, locked: Dict[str, str], work: Path, moves: Sequence[str]) -> int:
    constraints = pip_constraints()
    if moves:
        write_text(work / "moves.txt", "".join(f"{m}\n" for m in moves))
        constraints.append(str(work / "moves.txt"))
    newest_file = work / "newest.txt"
    argv = [uv, "pip", "compile", "pyproject.toml", "--extra", "test", *TARGET, "--quiet", "-o", str(newest_file)]
    for c in constraints:
        argv += ["-c", c]
    done = _step("compile", argv, cwd=root)
    if done.returncode != 0:
        raise DriftError(f"uv could not resolve pyproject.toml's newest releases: {done.stdout.strip()[-400:]}")
    moved = moved_packages(locked, environment.pins(newest_file.read_text()))
    held = f" (held: {', '.join(moves)})" if moves else ""
    if constraints[: len(constraints) - bool(moves)]:
        held += f" under pip's constraints here ({', '.join(constraints[: len(constraints) - bool(moves)])})"
    if not moved:
        print(
            f"drift: the newest releases pyproject.toml allows{held} are the ones {environment.LOCK_FILE} pins: "
            "no package moves, so no output can (CI's lockcheck verify checks the locked environment)"
        )
        return 0
    print(f"drift: {len(moved)} package(s) move from {environment.LOCK_FILE}{held}: {', '.join(moved)}", flush=True)
    clone = work / "clone"
    if _step("install", ["git", "clone", "-q", str(root), str(clone)], cwd=work).returncode != 0:
        raise DriftError(f"git clone {root} failed; run the drift check in the project's git checkout")
    venv = clone / ".venv"
    if _step("install", [sys.executable, "-m", "venv", str(venv)], cwd=work).returncode != 0:
        raise StepFailed(f"python -m venv {venv} failed")
    for argv in (
        [uv, "pip", "sync", "-q", "--compile-bytecode", "-p", str(venv), str(newest_file)],
        [uv, "pip", "install", "-q", "-p", str(venv), "--no-deps", "-e", str(clone)],
    ):
        done = _step("install", argv, cwd=clone)
        if done.returncode != 0:
            raise StepFailed(f"installing the newest releases failed: {done.stdout.strip()[-600:]}")
    env = {**os.environ, "VIRTUAL_ENV": str(venv), "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    env.pop("PYTHONPATH", None)
    log = work / "repro.log"
    print(f"drift: dvc repro in {clone} (log: {log}) ...", flush=True)
    if _step("repro", [str(venv / "bin" / "dvc"), "repro"], cwd=clone, env=env, log=log).returncode != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-5:]
        raise StepFailed("dvc repro failed under the newest releases:\n  " + "\n  ".join(tail))
    verify = _step(
        "verify", [str(venv / "bin" / "python"), "-m", "vcarepro.tools.lockcheck", "verify"], cwd=clone, env=env
    )
    print(verify.stdout.rstrip())
    if verify.returncode == 0:
        print("drift: no output moved; the lock still holds under these releases (re-record it to adopt them)")
        return 0
    print(
        "drift: outputs moved under these releases (listed above); to adopt them, upgrade in requirements/lock.txt "
        "and re-record dvc.lock (docs/reproducibility.md#upgrading-a-package)"
    )
    return 1
