"""DVC stage `eval_cls@RUN`: validation top-1 / top-5 of every seed of a run, aggregated.

``top1`` is the final weights' (``top1_ema`` the final EMA's, where the recipe keeps one),
evaluated here; ``top1_best`` / ``top1_ema_best`` are the best epoch's, read from the
validation the training stage ran every epoch (``history.json``), which is what the lab's
code reports (``max_accuracy``).
"""

from __future__ import annotations

import argparse

import torch

from vcarepro.core import progress
from vcarepro.core.io import write_json
from vcarepro.core.stage import run_stage
from vcarepro.data.folders import ManifestDataset, read_classes
from vcarepro.metrics.aggregate import aggregate_seeds, headline
from vcarepro.params.config import stage_params
from vcarepro.params.provenance import write_provenance
from vcarepro.params.runs import CLS_DATA, cls_run
from vcarepro.train.classification import (
    ClassifierSpec,
    best_epoch_figures,
    build_transforms,
    evaluate,
    load_classifier,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--run", required=True)
    args = parser.parse_args()
    params = stage_params()
    progress.configure(params, "eval_cls", args.run)
    run = cls_run(params, args.run)
    spec = ClassifierSpec.for_run(run)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    val = ManifestDataset(CLS_DATA, "val", build_transforms(run.recipe, training=False))
    loader = torch.utils.data.DataLoader(val, batch_size=256, num_workers=run.recipe.workers)
    num_classes = len(read_classes(CLS_DATA))
    per_seed = {}
    for seed in run.seeds:
        weights = run.paths.seed_dir(seed)
        model = load_classifier(spec, weights / "model.safetensors", num_classes).to(device)
        per_seed[seed] = evaluate(model, loader, device, report="val", seed=seed)
        if (weights / "model_ema.safetensors").is_file():  # the recipe keeps an EMA: report both
            ema = load_classifier(spec, weights / "model_ema.safetensors", num_classes).to(device)
            per_seed[seed].update(
                {f"{k}_ema": v for k, v in evaluate(ema, loader, device, report="EMA val", seed=seed).items()}
            )
        per_seed[seed].update(best_epoch_figures(weights))
        print(f"eval_cls {args.run} seed {seed}: " + ", ".join(f"{k}={v:.2f}" for k, v in per_seed[seed].items()))
    keys = ["top1", "top5", "loss", "top1_best", "best_epoch", "plateau_spread"]
    keys += [f"{k}_ema" for k in keys if f"{k}_ema" in per_seed[run.seeds[0]]]
    metrics = aggregate_seeds(per_seed, keys)
    metrics["params_m"] = sum(p.numel() for p in model.parameters()) / 1e6
    write_json(run.paths.metrics, metrics)
    write_json(run.paths.headline, headline(args.run, "cls", metrics))  # the run's DVC metric
    write_provenance(params, "cls", args.run)  # what produced these numbers, last


if __name__ == "__main__":
    run_stage(main)
