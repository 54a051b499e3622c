"""DVC stage `complexity`: parameters, GMACs and throughput of every model at its paper shape."""

from __future__ import annotations

import argparse
from pathlib import Path

from vcarepro.core.io import write_json
from vcarepro.core.stage import run_stage
from vcarepro.metrics.complexity import model_complexity
from vcarepro.params.config import section, stage_params
from vcarepro.train.seeds import run_in_workers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--out", default="metrics/complexity.json")
    parser.add_argument("--timing", default="timings/complexity.json")
    args = parser.parse_args()

    params = stage_params(args.params)
    settings = section(params, "complexity")
    models = section(params, "models")
    names = list(models)
    done = {}
    if settings["processes"] > 1 and not settings["throughput_batch"]:  # counts only: nothing timed to disturb
        done = run_in_workers(
            "complexity",
            list(range(len(names))),
            lambda i: model_complexity(models[names[i]], settings),
            settings["processes"],
            what="models",
        )
    results = {}
    for i, name in enumerate(names):
        results[name] = done.get(i) or model_complexity(models[name], settings)
        print(f"{name:32s} " + "  ".join(f"{k}={v:.3f}" for k, v in results[name].items()), flush=True)

    # images/s differ on every run: timings/ (no DVC output), the counts in the stage's output
    throughput = {name: fig.pop("throughput_img_s") for name, fig in results.items() if "throughput_img_s" in fig}
    if throughput:
        write_json(args.timing, {"throughput_img_s": throughput})
    else:  # none measured: an older file would put another configuration's images/s beside these counts
        Path(args.timing).unlink(missing_ok=True)
    write_json(args.out, results)  # atomic: a killed stage leaves no finished-looking file


if __name__ == "__main__":
    run_stage(main)
