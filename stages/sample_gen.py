"""DVC stage `sample_gen@RUN`: samples from every seed's EMA weights, plus a preview grid.

Samples go to ``runs/gen/<run>/samples/seed_<s>.npz`` in the ADM evaluator's format
(``arr_0`` uint8 N x H x W x 3, ``arr_1`` labels; grayscale digits are repeated to RGB),
with labels drawn as ``sampling.labels`` says. At paper scale the model samples VAE
latents, decoded with ``sampling.vae_decoder`` batch by batch. Unfinished work lives in
``checkpoints/gen/<run>/seed_<s>/samples`` and a killed
stage resumes there at the first unfinished batch. ``protocol.json`` records the protocol the
samples follow (vcarepro.metrics.protocol), which eval_gen copies beside its numbers.
"""

from __future__ import annotations

import argparse
import json

import torch

from vcarepro.core import progress
from vcarepro.core.integrity import prepared
from vcarepro.core.io import atomic_directory
from vcarepro.core.stage import run_stage
from vcarepro.data.samples import discard_work
from vcarepro.params.config import stage_params
from vcarepro.params.runs import GEN_DATA, gen_run
from vcarepro.params.stage_facts import digest, stage_facts
from vcarepro.train.generation import GeneratorSpec, load_generator
from vcarepro.train.sampling import sample_space, write_protocol, write_seed_samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--run", required=True)
    args = parser.parse_args()
    params = stage_params()
    progress.configure(params, "sample_gen", args.run)
    run = gen_run(params, args.run)
    meta = json.loads((prepared(GEN_DATA, "prepare_gen", without=("latents/",)) / "meta.json").read_text())
    spec = GeneratorSpec.for_run(run)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    space = sample_space(meta, run.sampling["vae_decoder"], device)
    facts = stage_facts(f"sample_gen@{args.run}")  # its weights, sampler settings, code and numerics
    with atomic_directory(run.paths.root / "samples", digests=True) as tmp:
        write_protocol(tmp, run.objective, run.sampling, space, run.recipe.precision)
        for seed in run.seeds:
            weights = run.paths.seed_dir(seed) / "model_ema.safetensors"
            model = load_generator(spec, weights, run.recipe)
            # unfinished work resumes only under the facts DVC keys this stage on
            key = digest(facts, seed)
            write_seed_samples(
                model,
                run.objective,
                run.sampling,
                space,
                tmp,
                seed,
                num_classes=meta["num_classes"],
                device=device,
                flow_path=run.recipe.flow_path,
                work_dir=run.paths.ckpt_dir(seed) / "samples",
                key=key,
                log=lambda message: print(f"sample_gen {args.run} seed {seed}: {message}", flush=True),
            )
            print(f"sample_gen {args.run} seed {seed}: {run.sampling['num_samples']} samples")
    for seed in run.seeds:  # the outputs are committed: the finished work can go
        discard_work(run.paths.ckpt_dir(seed) / "samples")


if __name__ == "__main__":
    run_stage(main)
