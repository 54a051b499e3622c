"""DVC stage `eval_gen@RUN`: FID, sFID, KID, Inception Score and precision/recall of every seed's samples.

Against data/fid_reference, in the extractor's feature space: Inception at paper scale
(ADM's evaluation of FID-50K against its reference batch), the digit classifier at
embedded scale. metrics.json also records the protocol the number followed: the one
sample_gen recorded beside the samples (``protocol.json``: the sampler and its steps, the
guidance, the labels, the VAE decoder and the training precision), copied, and the reference
(``adm`` or ``own`` statistics).
"""

from __future__ import annotations

import argparse
import json

import torch

from vcarepro.core import progress
from vcarepro.core.errors import BadInput, UserError
from vcarepro.core.integrity import prepared
from vcarepro.core.io import write_json
from vcarepro.core.stage import run_stage
from vcarepro.metrics.aggregate import aggregate_seeds, headline
from vcarepro.metrics.evaluator import evaluate_samples, evaluator_options
from vcarepro.metrics.extractors import make_extractor
from vcarepro.metrics.fid_reference import load_reference_set
from vcarepro.metrics.protocol import measured_protocol, read_protocol
from vcarepro.params.config import stage_params
from vcarepro.params.provenance import write_provenance
from vcarepro.params.runs import FID_REFERENCE, GEN_DATA, gen_run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--run", required=True)
    args = parser.parse_args()
    params = stage_params()
    progress.configure(params, "eval_gen", args.run)
    run = gen_run(params, args.run)
    e = params["eval_gen"]
    meta = json.loads((prepared(GEN_DATA, "prepare_gen", without=("latents/",)) / "meta.json").read_text())
    samples = prepared(run.paths.root / "samples", f"sample_gen@{args.run}")  # the samples sample_gen wrote
    reference_meta = json.loads((FID_REFERENCE / "meta.json").read_text())
    references = load_reference_set(FID_REFERENCE)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    extractor, name = make_extractor(
        meta, params["prepare_gen"], device, batch_size=params["fid_reference"]["batch_size"]
    )
    per_seed = {}
    for seed in run.seeds:
        try:
            per_seed[seed] = evaluate_samples(
                run.paths.samples(seed), extractor=extractor, **references, **evaluator_options(e), seed=seed
            )
        except UserError as err:  # one sentence and exit status 2 (run_stage), naming the run and seed
            raise BadInput(f"eval_gen {args.run} seed {seed}: {err}") from None
        print(
            f"eval_gen {args.run} seed {seed}: "
            + ", ".join(f"{k}={v:.4g}" for k, v in per_seed[seed].items() if k != "num_samples")
            + f" ({name})"
        )
    keys = [
        k
        for k in ("fid", "sfid", "fid_own", "sfid_own", "kid_mean", "inception_score", "precision", "recall")
        if k in per_seed[run.seeds[0]]
    ]
    metrics = aggregate_seeds(per_seed, keys)
    metrics.update(measured_protocol(read_protocol(samples, f"sample_gen@{args.run}"), reference_meta))
    # fid_feature_dims: FID / sFID over that many feature coordinates (fewer than the extractor's at smoke scale)
    metrics.update(
        {
            "num_samples": per_seed[run.seeds[0]]["num_samples"],
            "fid_feature_dims": per_seed[run.seeds[0]]["fid_feature_dims"],
            "weights": "ema",
            "extractor": name,
            "reference_source": reference_meta["source"],
            "reference_images": reference_meta["num_images"],
        }
    )
    write_json(run.paths.metrics, metrics)
    write_json(run.paths.headline, headline(args.run, "gen", metrics))  # the run's DVC metric
    write_provenance(params, "gen", args.run)  # what produced these numbers, last


if __name__ == "__main__":
    run_stage(main)
