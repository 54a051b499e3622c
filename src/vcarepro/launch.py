"""Launch a training stage on one or several processes.

    python -m vcarepro.launch --nnodes 1 --nproc-per-node 1 --node-rank 0 --rdzv-endpoint file \
        stages/train_cls.py --run deit_tiny-vca

* one process in all: runs the script in this process (no process group);
* several processes on one node with ``--rdzv-endpoint file``: starts them here with a
  shared file store (gloo over loopback on CPUs), so nothing listens on the network;
* otherwise: ``torchrun`` with a c10d rendezvous at ``--rdzv-endpoint host:port``. Note
  that torch's TCP store listens on every interface of the rendezvous host, as
  multi-node training needs.
"""
from __future__ import annotations

import argparse
import os
import runpy
import subprocess
import sys
import tempfile


def parse(argv):
    p = argparse.ArgumentParser(prog="python -m vcarepro.launch", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--nproc-per-node", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--rdzv-endpoint", default="file")
    p.add_argument("script")
    p.add_argument("script_args", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    if args.nnodes < 1 or args.nproc_per_node < 1:
        p.error("--nnodes and --nproc-per-node must be at least 1")
    if args.rdzv_endpoint == "file" and args.nnodes > 1:
        p.error("a file rendezvous works on one node only; give --rdzv-endpoint host:port for several nodes")
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


def main(argv=None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    if args.nnodes * args.nproc_per_node == 1:
        sys.argv = [args.script, *args.script_args]
        runpy.run_path(args.script, run_name="__main__")
        return 0
    if args.rdzv_endpoint == "file":
        return run_local(args.script, args.script_args, args.nproc_per_node)
    return subprocess.call(torchrun_command(args))


def torchrun_command(args) -> list:
    return ["torchrun", f"--nnodes={args.nnodes}", f"--nproc-per-node={args.nproc_per_node}",
            f"--node-rank={args.node_rank}", "--rdzv-backend=c10d", f"--rdzv-endpoint={args.rdzv_endpoint}",
            args.script, *args.script_args]


if __name__ == "__main__":
    sys.exit(main())
