"""DVC stage `sample_gen@RUN`: samples from every seed's EMA weights, plus a preview grid.

Samples go to ``runs/gen/<run>/samples/seed_<s>.npz`` in the ADM evaluator's format
(``arr_0`` uint8 N x H x W x 3, ``arr_1`` labels; grayscale digits are repeated to RGB),
with labels drawn as ``sampling.labels`` says. At paper scale the model samples VAE
latents, decoded with ``sampling.vae_decoder`` batch by batch. Unfinished work lives in
``checkpoints/gen/<run>/seed_<s>/samples`` and a killed
stage resumes there at the first unfinished batch.
"""
from __future__ import annotations

import argparse
import json

import torch
from torchvision.utils import save_image

from vcarepro.errors import run_stage
from vcarepro.config import stage_params
from vcarepro.data.samples import NpzSampleWriter, discard_work
from vcarepro.integrity import prepared
from vcarepro.io import atomic_directory
from vcarepro.pipeline import GEN_DATA, TRAINING_CODE, data_digest, fingerprint, gen_run, source_digest
from vcarepro.train.generation import GeneratorSpec, generate_batches, load_generator, pixels_to_uint8

GRID_PER_CLASS = 8
GRID_CLASSES = 10  # the preview shows the first ten classes, eight samples each


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--run", required=True)
    args = parser.parse_args()
    params = stage_params()
    run = gen_run(params, args.run)
    meta = json.loads((prepared(GEN_DATA, "prepare_gen", without=("latents/",)) / "meta.json").read_text())
    spec = GeneratorSpec.for_run(run)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if meta["kind"] == "vae_latents":
        from vcarepro.data.latents import decode_to_uint8, load_vae
        vae = load_vae(run.sampling["vae_decoder"], device)
        input_shape = tuple(meta["latent_shape"])
        to_uint8 = lambda x: decode_to_uint8(vae, x.to(device))  # noqa: E731
        image_shape = (meta["image_size"], meta["image_size"], 3)
    else:
        input_shape = (meta["channels"], meta["image_size"], meta["image_size"])
        # grayscale repeated to RGB: the ADM format holds (N, H, W, 3) images
        to_uint8 = lambda x: pixels_to_uint8(x).expand(-1, 3, -1, -1)  # noqa: E731
        image_shape = (meta["image_size"], meta["image_size"], 3)
    num = run.sampling["num_samples"]
    code = source_digest(*TRAINING_CODE)
    with atomic_directory(run.paths.root / "samples", digests=True) as tmp:
        for seed in run.seeds:
            weights = run.paths.seed_dir(seed) / "model_ema.safetensors"
            model = load_generator(spec, weights, run.recipe)
            # unfinished work resumes only for the same weights, sampler settings and code
            key = fingerprint(data_digest(weights), run.objective, run.sampling, run.recipe["flow_path"],
                              input_shape, seed, code)
            writer = NpzSampleWriter(tmp / f"seed_{seed}.npz", num, image_shape,
                                     work_dir=run.paths.ckpt_dir(seed) / "samples", key=key)
            if writer.note:
                print(f"sample_gen {args.run} seed {seed}: {writer.note}", flush=True)
            if writer.done_batches:
                print(f"sample_gen {args.run} seed {seed}: resuming after {writer.done_batches} finished batches")
            for batch, (start, samples, labels) in enumerate(generate_batches(
                    model, run.objective, run.sampling, num_samples=num, num_classes=meta["num_classes"],
                    input_shape=input_shape, seed=seed, device=device, flow_path=run.recipe["flow_path"],
                    start_batch=writer.done_batches), start=writer.done_batches):
                writer.write(batch, start, to_uint8(samples).cpu(), labels)
            # the preview, from the memory maps: the first ten classes, eight samples each
            grid = torch.from_numpy(writer.preview(GRID_PER_CLASS, min(GRID_CLASSES, meta["num_classes"])))
            writer.close()
            save_image(grid.permute(0, 3, 1, 2).float() / 255.0, str(tmp / f"grid_seed_{seed}.png"),
                       nrow=GRID_PER_CLASS, padding=1)
            print(f"sample_gen {args.run} seed {seed}: {num} samples")
    for seed in run.seeds:  # the outputs are committed: the finished work can go
        discard_work(run.paths.ckpt_dir(seed) / "samples")


if __name__ == "__main__":
    run_stage(main)
