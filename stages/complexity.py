"""DVC stage `complexity`: parameters, GMACs and throughput of every model at its paper shape."""
from __future__ import annotations

import argparse
import json
import os

from vcarepro.config import load_params, section
from vcarepro.metrics.complexity import classifier_complexity


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--out", default="metrics/complexity.json")
    args = parser.parse_args()

    params = load_params(args.params)
    settings = section(params, "complexity")
    results = {}
    for name, spec in section(params, "models").items():
        results[name] = classifier_complexity(
            spec["arch"], spec["attention"], spec.get("vca"),
            img_size=settings["img_size"], num_classes=settings["num_classes"],
            throughput_batch=settings["throughput_batch"],
        )
        print(f"{name:32s} " + "  ".join(f"{k}={v:.3f}" for k, v in results[name].items()), flush=True)

    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(results, f, indent=2)
    os.replace(tmp, args.out)  # atomic: a killed stage leaves no finished-looking file


if __name__ == "__main__":
    main()
