"""One DDP step through torchrun on one device (part ``ddp``): the command the project's launcher builds for
``--launcher torchrun`` (:func:`vcarepro.train.launch.torchrun_command`), one process, a c10d rendezvous on the
loopback, NCCL on a GPU (gloo on a CPU), the smoke matrix's first VCA classifier at paper shape (tiny on a CPU)
wrapped in ``DistributedDataParallel``, one optimizer step in its recipe's precision, and an all-reduce.

torchrun is started as ``python -m torch.distributed.run`` (what the ``torchrun`` script runs) with this
interpreter, so the step runs under the same Python and torch as the check. It is stopped, with everything it
started, when the part's share of the budget runs out.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List

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
        "recipe": {**run.recipe, "compile": None},
        "recipe_name": run.recipe_name,
        "batch": TINY_BATCH if check.tiny else GPU_BATCH,
        "num_classes": TINY_CLASSES if check.tiny else 1000,
    }


def ddp_part(check: Check, outcome: Outcome) -> None:
    spec = ddp_spec(check)
    expected = "nccl" if check.device.type == "cuda" else "gloo"
    with tempfile.TemporaryDirectory(prefix="vcarepro-gpu-check-ddp-") as tmp:
        spec_path, result_path = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        spec_path.write_text(json.dumps(spec))
        command = torchrun(["--spec", str(spec_path), "--result", str(result_path)], free_port(), check.left())
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), *filter(None, [os.environ.get("PYTHONPATH")])]))
        if check.device.type != "cuda":
            env["CUDA_VISIBLE_DEVICES"] = ""  # the worker picks its device as training does: a GPU when it sees one
        row: Dict[str, Any] = {"id": f"torchrun, 1 process, {expected}", "run": spec["name"], "expected": expected}
        row["command"] = " ".join(["torchrun", *command[3:]])
        check.log(f"ddp: {row['command']}")
        process = subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        try:
            output, _ = process.communicate(timeout=max(check.left(), 1.0))
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)  # torchrun and the rank it started: its own process group
            output, _ = process.communicate()
            outcome.out_of_time = True
            outcome.summary = f"torchrun did not finish within the {outcome.share_s:.0f} s share; stopped"
            row.update(status=FAIL, reason=outcome.summary, output_tail=output[-2000:])
            outcome.rows.append(row)
            return
        row["exit_status"] = process.returncode
        result = json.loads(result_path.read_text()) if result_path.is_file() else {}
        row.update(result)
        problems = ddp_problems(row, expected, process.returncode)
        if problems:
            row["output_tail"] = output[-2000:]
        row["status"] = FAIL if problems else PASS
        row["reason"] = (
            "; ".join(problems)
            if problems
            else (f"{row['backend']} step of {spec['name']} in {row['precision']}, all-reduce {row['all_reduce']:g}")
        )
        outcome.rows.append(row)
        outcome.summary = row["reason"]


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
