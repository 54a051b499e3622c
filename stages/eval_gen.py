"""DVC stage `eval_gen@RUN`: FID / KID of every seed's samples against the training images."""
from __future__ import annotations

import argparse
import json

from safetensors.torch import load_file

from vcarepro.config import load_params
from vcarepro.io import write_json
from vcarepro.metrics.aggregate import aggregate_seeds
from vcarepro.metrics.fid import DIGITS_EXTRACTOR, INCEPTION_EXTRACTOR, compute_generation_metrics
from vcarepro.pipeline import GEN_DATA, gen_run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--run", required=True)
    args = parser.parse_args()
    params = load_params()
    run = gen_run(params, args.run)
    meta = json.loads((GEN_DATA / "meta.json").read_text())
    if meta["fid_extractor"] == "digits":
        extractor, weights = DIGITS_EXTRACTOR, GEN_DATA / "fid_extractor.safetensors"
    else:
        extractor, weights = INCEPTION_EXTRACTOR, params["prepare_gen"]["inception_weights"]
    real = load_file(str(GEN_DATA / "train.safetensors"))["images"]
    per_seed = {}
    for seed in run.seeds:
        fake = load_file(str(run.paths.samples(seed)))["images"]
        per_seed[seed] = compute_generation_metrics(real, fake, extractor=extractor, weights_path=weights, seed=seed)
        print(f"eval_gen {args.run} seed {seed}: fid={per_seed[seed]['fid']:.3f} ({extractor})")
    metrics = aggregate_seeds(per_seed, ["fid", "kid_mean"])
    metrics["num_samples"] = per_seed[run.seeds[0]]["num_fake"]
    write_json(run.paths.metrics, metrics)


if __name__ == "__main__":
    main()
