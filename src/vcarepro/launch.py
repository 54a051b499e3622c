"""Launch a training stage on one or several processes, on one node or many.

    python -m vcarepro.launch --nnodes 1 --nproc-per-node 1 --node-rank 0 --rdzv-endpoint file \
        --launcher torchrun stages/train_cls.py --run deit_tiny-vca

* one process in all: runs the script in this process (no process group);
* several processes on one node with ``--rdzv-endpoint file``: starts them here with a
  shared file store (gloo over loopback on CPUs), so nothing listens on the network;
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
"""
from __future__ import annotations

import argparse
import os
import runpy
import subprocess
import sys
import tempfile
from typing import Callable, List, Mapping, Optional

from vcarepro.errors import BadInput

DEFAULT_PORT = 29500


class LaunchError(BadInput):
    pass


def parse(argv):
    p = argparse.ArgumentParser(prog="python -m vcarepro.launch", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nnodes", default="1", help="an integer, or env (SLURM_NNODES / NNODES)")
    p.add_argument("--nproc-per-node", default="1", help="an integer, or gpu (every visible GPU)")
    p.add_argument("--node-rank", default="0", help="an integer, or env (SLURM_NODEID / NODE_RANK)")
    p.add_argument("--rdzv-endpoint", default="file", help="file, host:port, or env")
    p.add_argument("--launcher", default="torchrun", choices=["torchrun", "srun"])
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
            raise LaunchError(f"--{name} env needs one of {', '.join(keys)} in the environment; "
                              f"run inside a SLURM allocation or give --{name} a number.")
        value = env[found[0]]
    try:
        number = int(value)
    except ValueError:
        raise LaunchError(f"--{name} {value!r} is not an integer; give a number"
                          f"{' or env' if keys else ''}.") from None
    if number < minimum:
        raise LaunchError(f"--{name} is {number}; it must be at least {minimum}.")
    return number


def resolve(args, env: Optional[Mapping[str, str]] = None, gpu_count: Optional[Callable[[], int]] = None,
            slurm_host: Callable[[str], str] = first_slurm_host):
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
    if args.node_rank >= args.nnodes:
        raise LaunchError(f"--node-rank {args.node_rank} does not exist among {args.nnodes} node(s); "
                          "node ranks count from 0.")
    if args.rdzv_endpoint == "env":
        if env.get("MASTER_ADDR"):
            host = env["MASTER_ADDR"]
        elif env.get("SLURM_JOB_NODELIST"):
            host = slurm_host(env["SLURM_JOB_NODELIST"])
        else:
            raise LaunchError("--rdzv-endpoint env needs MASTER_ADDR or a SLURM allocation (SLURM_JOB_NODELIST); "
                              "give host:port instead.")
        args.rdzv_endpoint = f"{host}:{env.get('MASTER_PORT') or DEFAULT_PORT}"
    if args.rdzv_endpoint == "file" and (args.nnodes > 1 or args.launcher == "srun"):
        raise LaunchError("a file rendezvous works on one node started here only; give --rdzv-endpoint "
                          "host:port (or env) for torchrun across nodes or under srun.")
    if args.launcher == "srun" and not env.get("SLURM_JOB_ID"):
        raise LaunchError("--launcher srun must run inside a SLURM allocation (no SLURM_JOB_ID); start "
                          "dvc repro under salloc or sbatch, or use --launcher torchrun.")
    return args


def run_local(script: str, script_args, nproc: int) -> int:
    """Start ``nproc`` ranks of ``script`` here, rendezvousing through a file store."""
    with tempfile.TemporaryDirectory(prefix="vcarepro-dist-") as tmp:
        procs = []
        for rank in range(nproc):
            env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc),
                       LOCAL_WORLD_SIZE=str(nproc), VCAREPRO_DIST_INIT=f"file://{tmp}/store",
                       GLOO_SOCKET_IFNAME=os.environ.get("GLOO_SOCKET_IFNAME", "lo"))
            procs.append(subprocess.Popen([sys.executable, script, *script_args], env=env))
        codes = [p.wait() for p in procs]
    failed = [(rank, code) for rank, code in enumerate(codes) if code != 0]
    if failed:
        print(f"launch: rank(s) {', '.join(str(r) for r, _ in failed)} failed; see their errors above.",
              file=sys.stderr)
        return failed[0][1] or 1
    return 0


def torchrun_command(args) -> list:
    """This node's torchrun (``--launcher torchrun``)."""
    return ["torchrun", f"--nnodes={args.nnodes}", f"--nproc-per-node={args.nproc_per_node}",
            f"--node-rank={args.node_rank}", "--rdzv-backend=c10d", f"--rdzv-endpoint={args.rdzv_endpoint}",
            args.script, *args.script_args]


def srun_command(args, env: Optional[Mapping[str, str]] = None) -> list:
    """One torchrun per node of the allocation; c10d assigns node ranks, the job id names the rendezvous."""
    env = os.environ if env is None else env
    return ["srun", f"--nodes={args.nnodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=1",
            "torchrun", f"--nnodes={args.nnodes}", f"--nproc-per-node={args.nproc_per_node}",
            "--rdzv-backend=c10d", f"--rdzv-id={env['SLURM_JOB_ID']}", f"--rdzv-endpoint={args.rdzv_endpoint}",
            args.script, *args.script_args]


def main(argv=None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    try:
        resolve(args)
    except LaunchError as err:
        print(f"launch: {err}", file=sys.stderr)
        return 2
    if args.launcher == "srun":
        return subprocess.call(srun_command(args))
    if args.nnodes * args.nproc_per_node == 1:
        sys.argv = [args.script, *args.script_args]
        runpy.run_path(args.script, run_name="__main__")
        return 0
    if args.rdzv_endpoint == "file":
        return run_local(args.script, args.script_args, args.nproc_per_node)
    return subprocess.call(torchrun_command(args))


if __name__ == "__main__":
    sys.exit(main())
