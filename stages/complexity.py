"""DVC stage `complexity`: parameters, GMACs and throughput of every model at its paper shape."""
from __future__ import annotations

import argparse

from vcarepro.errors import run_stage
from vcarepro.config import section, stage_params
from vcarepro.io import write_json
from vcarepro.metrics.complexity import model_complexity


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--out", default="metrics/complexity.json")
    args = parser.parse_args()

    params = stage_params(args.params)
    settings = section(params, "complexity")
    results = {}
    for name, spec in section(params, "models").items():
        results[name] = model_complexity(spec, settings)
        print(f"{name:32s} " + "  ".join(f"{k}={v:.3f}" for k, v in results[name].items()), flush=True)

    write_json(args.out, results)  # atomic: a killed stage leaves no finished-looking file


if __name__ == "__main__":
    run_stage(main)
