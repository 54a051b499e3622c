"""Launch a training stage on one or several processes, on one node or many.

    python -m vcarepro.train.launch --nnodes 1 --nproc-per-node 1 --node-rank 0 --rdzv-endpoint file \
        --launcher torchrun stages/train_cls.py --run deit_tiny-vca

* one process in all: runs the script in this process (no process group);
* several processes on one node with ``--rdzv-endpoint file``: starts them here with a
  shared file store (gloo over loopback on CPUs), so nothing listens on the network. The
  launcher watches every rank: when one exits non-zero it sends the others SIGTERM (a
  training rank checkpoints and exits 143), SIGKILL after ``--grace`` seconds, says which
  rank ended how in one sentence and exits with that rank's status (128 + the signal for a
  rank killed by one; a rank that stopped on a user error, status 2, is the one named even
  where a rank whose collective it broke exited first). SIGINT, SIGTERM and SIGHUP reaching
  the launcher are passed on to every rank. The store's temporary folder is removed on every
  way out but the launcher's own SIGKILL;
* ``--launcher torchrun``: ``torchrun`` for this node's processes with a c10d rendezvous at
  ``--rdzv-endpoint host:port``; on several nodes the same command runs on each node;
* ``--launcher srun``: run once inside a SLURM allocation (``salloc`` / ``sbatch``);
  ``srun`` starts one ``torchrun`` per node of the allocation. This is how a single
  ``dvc repro`` drives a multi-node stage, since DVC holds one repository lock.

``--nnodes env`` reads SLURM_NNODES (or NNODES), ``--node-rank env`` reads SLURM_NODEID
(or NODE_RANK), ``--rdzv-endpoint env`` reads MASTER_ADDR:MASTER_PORT, or else takes the
allocation's first host (``scontrol show hostnames``) and port 29500, and
``--nproc-per-node gpu`` counts the visible GPUs. torch's TCP store listens on every
interface of the rendezvous host, as multi-node training needs.

``--rdzv-timeout`` (seconds; VCAREPRO_RDZV_TIMEOUT, else 600) bounds the rendezvous: the
ranks get it as VCAREPRO_RDZV_TIMEOUT (:func:`vcarepro.train.distributed.rendezvous`; a rank
still missing then is named in one sentence and the waiting ranks exit 2), and torchrun as
``--rdzv-conf join_timeout=...`` for its agents' rendezvous.
"""

from __future__ import annotations

import argparse
import os
import runpy
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Callable, List, Mapping, Optional

from vcarepro.core import supervise
from vcarepro.core.errors import USER_ERROR_STATUS, BadInput

DEFAULT_PORT = 29500
RDZV_TIMEOUT_ENV = "VCAREPRO_RDZV_TIMEOUT"  # read by the ranks (vcarepro.train.distributed)
DEFAULT_RDZV_TIMEOUT = 600  # seconds, as torchrun's join_timeout
DEFAULT_GRACE = 30  # seconds between SIGTERM and SIGKILL for the ranks left when one fails
POLL = 0.2  # seconds between looks at the ranks


class LaunchError(BadInput):
    pass


def parse(argv):
    p = argparse.ArgumentParser(
        prog="python -m vcarepro.train.launch",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--nnodes", default="1", help="an integer, or env (SLURM_NNODES / NNODES)")
    p.add_argument("--nproc-per-node", default="1", help="an integer, or gpu (every visible GPU)")
    p.add_argument("--node-rank", default="0", help="an integer, or env (SLURM_NODEID / NODE_RANK)")
    p.add_argument("--rdzv-endpoint", default="file", help="file, host:port, or env")
    p.add_argument("--launcher", default="torchrun", choices=["torchrun", "srun"])
    p.add_argument(
        "--rdzv-timeout",
        default=None,
        help=f"seconds every rank waits for the others to arrive (default: ${RDZV_TIMEOUT_ENV}, "
        f"else {DEFAULT_RDZV_TIMEOUT})",
    )
    p.add_argument(
        "--grace",
        default=str(DEFAULT_GRACE),
        help=f"seconds the other ranks get to stop after one fails, before SIGKILL (default {DEFAULT_GRACE})",
    )
    p.add_argument("script")
    p.add_argument("script_args", nargs=argparse.REMAINDER)
    return p.parse_args(argv)


def first_slurm_host(nodelist: str) -> str:
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True)
    return out.stdout.split()[0]


def _integer(value: str, name: str, env: Mapping[str, str], keys: List[str], minimum: int) -> int:
    if value == "env":
        found = [k for k in keys if env.get(k)]
        if not found:
            raise LaunchError(
                f"--{name} env needs one of {', '.join(keys)} in the environment; "
                f"run inside a SLURM allocation or give --{name} a number."
            )
        value = env[found[0]]
    try:
        number = int(value)
    except ValueError:
        raise LaunchError(f"--{name} {value!r} is not an integer; give a number{' or env' if keys else ''}.") from None
    if number < minimum:
        raise LaunchError(f"--{name} is {number}; it must be at least {minimum}.")
    return number


def _seconds(value: str, name: str, minimum: int) -> int:
    try:
        number = int(value)
    except ValueError:
        raise LaunchError(f"--{name} {value!r} is not a whole number of seconds; give one.") from None
    if number < minimum:
        raise LaunchError(f"--{name} is {number}; it must be at least {minimum} second(s).")
    return number


def resolve(
    args,
    env: Optional[Mapping[str, str]] = None,
    gpu_count: Optional[Callable[[], int]] = None,
    slurm_host: Callable[[str], str] = first_slurm_host,
):
    """Replace ``env`` / ``gpu`` values in ``args`` with numbers and an endpoint; check they fit together."""
    env = os.environ if env is None else env
    args.nnodes = _integer(args.nnodes, "nnodes", env, ["SLURM_NNODES", "NNODES"], 1)
    args.node_rank = _integer(args.node_rank, "node-rank", env, ["SLURM_NODEID", "NODE_RANK"], 0)
    if args.nproc_per_node == "gpu":
        if gpu_count is None:
            import torch

            gpu_count = torch.cuda.device_count
        args.nproc_per_node = gpu_count()
        if args.nproc_per_node < 1:
            raise LaunchError("--nproc-per-node gpu found no visible GPU; give a number of processes instead.")
    else:
        args.nproc_per_node = _integer(args.nproc_per_node, "nproc-per-node", env, [], 1)
    args.rdzv_timeout = _seconds(
        args.rdzv_timeout or env.get(RDZV_TIMEOUT_ENV) or str(DEFAULT_RDZV_TIMEOUT), "rdzv-timeout", 1
    )
    args.grace = _seconds(args.grace, "grace", 0)
    if args.node_rank >= args.nnodes:
        raise LaunchError(
            f"--node-rank {args.node_rank} does not exist among {args.nnodes} node(s); node ranks count from 0."
        )
    if args.rdzv_endpoint == "env":
        if env.get("MASTER_ADDR"):
            host = env["MASTER_ADDR"]
        elif env.get("SLURM_JOB_NODELIST"):
            host = slurm_host(env["SLURM_JOB_NODELIST"])
        else:
            raise LaunchError(
                "--rdzv-endpoint env needs MASTER_ADDR or a SLURM allocation (SLURM_JOB_NODELIST); "
                "give host:port instead."
            )
        args.rdzv_endpoint = f"{host}:{env.get('MASTER_PORT') or DEFAULT_PORT}"
    if args.rdzv_endpoint == "file" and (args.nnodes > 1 or args.launcher == "srun"):
        raise LaunchError(
            "a file rendezvous works on one node started here only; give --rdzv-endpoint "
            "host:port (or env) for torchrun across nodes or under srun."
        )
    if args.launcher == "srun" and not env.get("SLURM_JOB_ID"):
        raise LaunchError(
            "--launcher srun must run inside a SLURM allocation (no SLURM_JOB_ID); start "
            "dvc repro under salloc or sbatch, or use --launcher torchrun."
        )
    return args


def run_local(
    script: str, script_args, nproc: int, rdzv_timeout: int = DEFAULT_RDZV_TIMEOUT, grace: float = DEFAULT_GRACE
) -> int:
    """Start ``nproc`` ranks of ``script`` here, rendezvousing through a file store; watch them all."""
    received: List[int] = []  # signals that reached the launcher (SIGINT, SIGTERM, SIGHUP), passed on by _watch
    with supervise.forwarding(received.append):
        # Removed on every way out of here. A SIGKILL of the launcher itself cannot be caught: the folder (a
        # few bytes) then stays in the temporary directory, and the ranks live on unless the kill took its
        # whole process group (the warm client's does), since they share the launcher's group.
        tmp = tempfile.mkdtemp(prefix="vcarepro-dist-")
        procs: List[subprocess.Popen] = []
        try:
            for rank in range(nproc):
                if received:
                    break
                env = dict(
                    os.environ,
                    RANK=str(rank),
                    LOCAL_RANK=str(rank),
                    WORLD_SIZE=str(nproc),
                    LOCAL_WORLD_SIZE=str(nproc),
                    VCAREPRO_DIST_INIT=f"file://{tmp}/store",
                    GLOO_SOCKET_IFNAME=os.environ.get("GLOO_SOCKET_IFNAME", "lo"),
                    **{RDZV_TIMEOUT_ENV: str(rdzv_timeout)},
                )
                procs.append(subprocess.Popen([sys.executable, script, *script_args], env=env))
            return _watch(procs, received, grace)
        finally:  # only after an error in the launcher itself is any still running
            supervise.stop(procs, 0, signals=(signal.SIGKILL,), poll_s=POLL)
            shutil.rmtree(tmp, ignore_errors=True)


def _watch(procs: List[subprocess.Popen], received: List[int], grace: float) -> int:
    """Wait for every rank; the first to fail (or a signal to the launcher) stops the rest. The exit status."""
    failed = None  # (rank, status) of the first rank that exited non-zero while the others ran
    while True:
        codes = [proc.poll() for proc in procs]
        running = [rank for rank, code in enumerate(codes) if code is None]
        if received:  # passed on to every rank still running, which stops them
            break
        failed = next(((rank, code) for rank, code in enumerate(codes) if code not in (None, 0)), None)
        if failed is not None or not running:  # the others get SIGTERM
            break
        time.sleep(POLL)
    stopped = running  # ranks still running when the stop began
    killed = False
    if stopped:
        # A signal to the launcher goes to every rank still running, also while they stop. One sent to the whole
        # process group (Ctrl-C, the warm client's forwarding) reaches a rank twice: harmless for SIGTERM, a flag
        # in training.
        seen = len(received)

        def pending() -> List[int]:
            nonlocal seen
            new = received[seen:]
            seen += len(new)
            return new

        killed = supervise.stop(
            [procs[rank] for rank in stopped],
            grace,
            signals=received[:seen] if seen else (signal.SIGTERM,),
            pending=pending,
            poll_s=POLL,
        ).killed
    if failed is not None and failed[1] != USER_ERROR_STATUS:  # the first to exit may have failed because of one
        said = next((rank for rank, proc in enumerate(procs) if proc.returncode == USER_ERROR_STATUS), None)
        if said is not None:  # that stopped with its one-sentence error (a damaged image): the sentence names it
            stopped = sorted(set(stopped) - {said} | {failed[0]})
            failed = (said, USER_ERROR_STATUS)
    how = f" (SIGKILL after {grace:g} s)" if killed else ""
    others = f"stopped {_ranks(stopped)}{how}" if stopped else "the other ranks had finished"
    if failed is not None:  # what came first is what the sentence names
        rank, code = failed
        status = f"{code} (killed by {supervise.signal_name(-code)})" if code < 0 else str(code)
        print(
            f"launch: rank {rank} exited with status {status}; {others}; see the ranks' output above.",
            file=sys.stderr,
            flush=True,
        )
        return supervise.exit_status(code)
    if received:
        print(
            f"launch: stopped by {supervise.signal_name(received[0])}, passed on to "
            f"{_ranks(stopped) if stopped else 'no rank'}{how}.",
            file=sys.stderr,
            flush=True,
        )
        return 128 + received[0]
    return 0


def _ranks(ranks: List[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def torchrun_command(args) -> list:
    """This node's torchrun (``--launcher torchrun``).

    ``--`` ends torchrun's own options: its parser takes abbreviations, so the script's ``--run``
    would otherwise be refused as an ambiguous ``--run-path`` before the script is reached.
    """
    return [
        "torchrun",
        f"--nnodes={args.nnodes}",
        f"--nproc-per-node={args.nproc_per_node}",
        f"--node-rank={args.node_rank}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={args.rdzv_endpoint}",
        f"--rdzv-conf=join_timeout={args.rdzv_timeout}",
        "--",
        args.script,
        *args.script_args,
    ]


# What srun starts on each node: torchrun under a relay that turns SIGUSR1 into the SIGTERM that stops the ranks
# at a step. srun kills its step on SIGTERM / SIGINT / SIGHUP but passes SIGUSR1 on to every task (slurm-wlm 22.05),
# so the launcher stops srun with SIGUSR1. SLURM's USR2 warning (docs/cluster.md) reaches every step and would kill
# torchrun and the ranks at once, so they ignore it; the job answers it with a SIGTERM of its own.
RELAY = """
import signal, subprocess, sys
# ignored by torchrun and the ranks (inherited): srun's USR1 and SLURM's USR2 reach every process of the step
signal.signal(signal.SIGUSR1, signal.SIG_IGN)
signal.signal(signal.SIGUSR2, signal.SIG_IGN)
child = subprocess.Popen(sys.argv[1:])
def stop(signum, frame):
    child.send_signal(signal.SIGTERM)
for signum in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
    signal.signal(signum, stop)
code = child.wait()
sys.exit(128 - code if code < 0 else code)
"""
RELAYED = [sys.executable, "-c", RELAY]
SRUN_STOP = {signal.SIGTERM: signal.SIGUSR1, signal.SIGINT: signal.SIGUSR1, signal.SIGHUP: signal.SIGUSR1}


def srun_command(args, env: Optional[Mapping[str, str]] = None) -> list:
    """One torchrun per node of the allocation; c10d assigns node ranks, the job id names the rendezvous."""
    env = os.environ if env is None else env
    # Inside a job step (a job of python -m vcarepro.tools.cluster runs the stage in one), the new step shares
    # the step's CPUs, memory and GPUs (srun --overlap, Slurm >= 20.11) instead of waiting for them.
    overlap = ["--overlap"] if "SLURM_STEP_ID" in env else []
    return [
        "srun",
        f"--nodes={args.nnodes}",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=1",
        *overlap,
        *RELAYED,
        "torchrun",
        f"--nnodes={args.nnodes}",
        f"--nproc-per-node={args.nproc_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-id={env['SLURM_JOB_ID']}",
        f"--rdzv-endpoint={args.rdzv_endpoint}",
        f"--rdzv-conf=join_timeout={args.rdzv_timeout}",
        "--",
        args.script,
        *args.script_args,
    ]


def main(argv=None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    try:
        resolve(args)
    except LaunchError as err:
        print(f"launch: {err}", file=sys.stderr)
        return 2
    ranks_env = dict(os.environ, **{RDZV_TIMEOUT_ENV: str(args.rdzv_timeout)})
    if args.launcher == "srun":
        return call_forwarding(srun_command(args), ranks_env, translate=SRUN_STOP)
    if args.nnodes * args.nproc_per_node == 1:
        sys.argv = [args.script, *args.script_args]
        runpy.run_path(args.script, run_name="__main__")
        return 0
    if args.rdzv_endpoint == "file":
        return run_local(args.script, args.script_args, args.nproc_per_node, args.rdzv_timeout, args.grace)
    return call_forwarding(torchrun_command(args), ranks_env)


def call_forwarding(command: List[str], env: Mapping[str, str], translate: Optional[Mapping[int, int]] = None) -> int:
    """Run torchrun / srun, passing SIGINT, SIGTERM and SIGHUP on to it (as ``translate`` maps them: srun
    gets SIGUSR1); its status as a shell gives it.

    torchrun stops its workers on SIGTERM itself; a signal sent to the launcher alone must reach
    them, or they would be orphaned. A status from a signal is 128 + its number (143 for SIGTERM).
    """
    process = subprocess.Popen(command, env=dict(env))
    translate = translate or {}
    with supervise.forwarding(lambda signum: supervise.send(process, translate.get(signum, signum))):
        code = process.wait()
    return supervise.exit_status(code)


if __name__ == "__main__":
    sys.exit(main())
