"""python -m vcarepro.bench attention [--batch 8] [--json out.json]"""
from __future__ import annotations

import argparse
from dataclasses import asdict

from . import attention_table, bench_attention, describe_machine, write_json


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m vcarepro.bench", description=__doc__)
    sub = parser.add_subparsers(dest="suite", required=True)
    att = sub.add_parser("attention", help="VCA vs timm's fused MHSA at DeiT-T width, N = 196, 784, 3136")
    att.add_argument("--sides", type=int, nargs="+", default=[14, 28, 56], help="patch-grid sides (N = side^2)")
    att.add_argument("--batch", type=int, default=8)
    att.add_argument("--dim", type=int, default=192)
    att.add_argument("--heads", type=int, default=3)
    att.add_argument("--contrast-tokens", type=int, default=49)
    att.add_argument("--min-run-time", type=float, default=1.0, help="seconds of timing per measurement")
    att.add_argument("--device", default="cpu")
    att.add_argument("--json", help="also write the figures and the machine to this JSON file")
    args = parser.parse_args(argv)

    machine = describe_machine()
    print("machine: " + ", ".join(f"{k}={v}" for k, v in machine.items()))
    rows = bench_attention(args.sides, dim=args.dim, heads=args.heads, batch=args.batch,
                           contrast_tokens=args.contrast_tokens, min_run_time=args.min_run_time,
                           device=args.device)
    print(f"attention layer, width {args.dim}, {args.heads} heads, batch {args.batch}, "
          f"{args.contrast_tokens} contrast tokens, median wall time")
    print(attention_table(rows))
    if args.json:
        write_json(args.json, {"machine": machine, "config": vars(args), "attention": [asdict(r) for r in rows]})


if __name__ == "__main__":
    main()
