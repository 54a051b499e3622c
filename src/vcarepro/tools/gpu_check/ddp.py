"""One DDP step through torchrun on one device (part ``ddp``), with the command the project's launcher builds.

torchrun runs as ``python -m torch.distributed.run`` with this interpreter, so the step uses the check's
Python and torch. On a CPU it starts before the first part (:func:`launch`) so its imports overlap the
others; on a GPU it runs in its turn, so nothing shares the device with what is timed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List

from vcarepro.core.io import write_text
from vcarepro.tools.gpu_check.parts import FAIL, PASS, Check, Outcome

WORKER = Path(__file__).with_name("ddp_worker.py")
SRC = Path(__file__).resolve().parents[3]  # the folder that holds vcarepro/, for the worker's imports
GPU_BATCH = 8


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(script_args: List[str], port: int, timeout_s: float) -> List[str]:
    """The launcher's torchrun command for one process on this node, run as this interpreter's module."""
    from vcarepro.train.launch import torchrun_command

    args = argparse.Namespace(
        nnodes=1,
        nproc_per_node=1,
        node_rank=0,
        rdzv_endpoint=f"127.0.0.1:{port}",
        rdzv_timeout=max(int(timeout_s), 1),
        script=str(WORKER),
        script_args=script_args,
    )
    command = torchrun_command(args)
    assert command[0] == "torchrun"
    return [sys.executable, "-m", "torch.distributed.run", *command[1:]]


def ddp_spec(check: Check) -> Dict[str, Any]:
    """What the worker builds: the smoke matrix's first VCA classification run at the paper scale."""
    from vcarepro.tools.gpu_check.steps import TINY_BATCH, TINY_CLASSES, composed, smoke_runs, tiny

    runs = smoke_runs(composed("smoke"), composed("paper"))
    branch, run = next(((b, r) for b, r in runs if b == "cls" and r.model["attention"] == "vca"))
    if check.tiny:
        run = tiny(run, branch)
    return {
        "name": run.name,
        "model": run.model,
        "shape": run.shape,
        "recipe": run.recipe.model_copy(update={"compile": None}).model_dump(),
        "recipe_name": run.recipe_name,
        "batch": TINY_BATCH if check.tiny else GPU_BATCH,
        "num_classes": TINY_CLASSES if check.tiny else 1000,
    }


@dataclass(eq=False)  # one launch is itself, not any with equal fields
class Launched:
    """torchrun, started: its process, where its rank writes, the row it will fill."""

    process: subprocess.Popen
    folder: Path  # the spec, the result and the output, removed when it is read
    spec: Dict[str, Any]
    row: Dict[str, Any]


def launch(check: Check, timeout_s: float) -> Launched:
    """Start torchrun with the worker (its output to a file, so that nothing waits on a full pipe)."""
    spec = ddp_spec(check)
    expected = "nccl" if check.device.type == "cuda" else "gloo"
    folder = Path(tempfile.mkdtemp(prefix="vcarepro-gpu-check-ddp-"))
    write_text(folder / "spec.json", json.dumps(spec))
    script_args = ["--spec", str(folder / "spec.json"), "--result", str(folder / "result.json")]
    command = torchrun(script_args, free_port(), timeout_s)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), *filter(None, [os.environ.get("PYTHONPATH")])]))
    if check.device.type != "cuda":
        env["CUDA_VISIBLE_DEVICES"] = ""  # the worker picks its device as training does: a GPU when it sees one
    row: Dict[str, Any] = {"id": f"torchrun, 1 process, {expected}", "run": spec["name"], "expected": expected}
    row["command"] = " ".join(["torchrun", *command[3:]])
    check.log(f"ddp: {row['command']}")
    with open(folder / "output.txt", "w") as output:
        process = subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
        launched = Launched(process, folder, spec, row)
        with _RUNNING_LOCK:
            RUNNING.append(launched)
    return launched


def ddp_part(check: Check, outcome: Outcome) -> None:
    """The step torchrun was started for before the parts (at tiny sizes), or starts now; its verdict."""
    launched = check.options.pop("ddp_launched", None) or launch(check, check.left())
    try:
        finish(launched, check, outcome)
    finally:
        stop(launched)  # interrupted (Ctrl-C) while it waited: torchrun and its rank go too
        shutil.rmtree(launched.folder, ignore_errors=True)


RUNNING: List[Launched] = []  # every torchrun started and not yet stopped, whichever thread waits for it
_RUNNING_LOCK = threading.Lock()


def stop_all() -> None:
    """Every torchrun still running, with its ranks: the command's last act when it leaves a part's thread behind
    (Ctrl-C, SIGTERM, an abandoned part), since that thread's own ``finally`` never runs then."""
    with _RUNNING_LOCK:
        left = list(RUNNING)
    for launched in left:
        stop(launched)
        shutil.rmtree(launched.folder, ignore_errors=True)


def stop(launched: Launched) -> None:
    """torchrun and every process under it, at once (SIGKILL), then reaped; nothing when it has ended.

    torchrun runs in a session of its own (a terminal's Ctrl-C misses it), and torch's elastic agent starts each
    rank in a session of its own too: SIGKILL to torchrun's group alone left the rank running (seen: a
    ddp_worker.py stepping on after Ctrl-C). The tree is taken before anything is signalled."""
    import psutil

    from vcarepro.core import supervise

    process = launched.process
    # a second Ctrl-C or SIGTERM must not cut this short (main thread only; elsewhere signals are left alone)
    with supervise.forwarding(lambda signum: None):
        if process.poll() is None:
            try:
                tree = psutil.Process(process.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                tree = []
            supervise.send(process, signal.SIGKILL, group=True)
            supervise.send(tree, signal.SIGKILL, gone=(psutil.NoSuchProcess,))
            process.wait()
        with _RUNNING_LOCK:  # only once it has ended: stop_all must still see one whose stop was cut short
            if launched in RUNNING:
                RUNNING.remove(launched)


def finish(launched: Launched, check: Check, outcome: Outcome) -> None:
    process, row = launched.process, launched.row
    try:
        process.wait(timeout=max(check.left(), 1.0))
    except subprocess.TimeoutExpired:
        stop(launched)
        outcome.out_of_time = True
        outcome.summary = f"torchrun did not finish within the {outcome.share_s:.0f} s share; stopped"
        row.update(status=FAIL, reason=outcome.summary, output_tail=_tail(launched))
        outcome.rows.append(row)
        return
    row["exit_status"] = process.returncode
    result_path = launched.folder / "result.json"
    row.update(json.loads(result_path.read_text()) if result_path.is_file() else {})
    problems = ddp_problems(row, row["expected"], process.returncode)
    if problems:
        row["output_tail"] = _tail(launched)
    row["status"] = FAIL if problems else PASS
    row["reason"] = "; ".join(problems) or (
        f"{row['backend']} step of {launched.spec['name']} in {row['precision']}, all-reduce {row['all_reduce']:g}"
    )
    outcome.rows.append(row)
    outcome.summary = row["reason"]


def _tail(launched: Launched) -> str:
    path = launched.folder / "output.txt"
    return path.read_text(errors="replace")[-2000:] if path.is_file() else ""


def ddp_problems(row: Dict[str, Any], expected: str, status: int) -> List[str]:
    if status != 0 or "backend" not in row:
        last = (row.get("error") or f"torchrun exited with status {status}").strip()
        return [last.splitlines()[-1] if last else f"torchrun exited with status {status}"]
    problems = []
    if row["backend"] != expected:
        problems.append(f"the process group runs {row['backend']}, not {expected}")
    if not row.get("torchelastic"):
        problems.append("the rank did not run under torchrun (no TORCHELASTIC_RUN_ID)")
    if row.get("all_reduce") != row.get("world_size"):
        problems.append(f"an all-reduce of ones gave {row.get('all_reduce')}, not {row.get('world_size')}")
    if not (isinstance(row.get("loss"), float) and math.isfinite(row["loss"])):
        problems.append(f"the loss is {row.get('loss')}")
    if not row.get("ddp_wrapped"):
        problems.append("the model was not wrapped in DistributedDataParallel")
    return problems
