"""DVC stage `sample_gen@RUN`: class-balanced samples from every seed's EMA weights, plus a preview grid."""
from __future__ import annotations

import argparse
import json

import torch
from safetensors.torch import save_file
from torchvision.utils import save_image

from vcarepro.config import load_params
from vcarepro.io import atomic_directory
from vcarepro.pipeline import GEN_DATA, gen_run
from vcarepro.train.generation import GeneratorSpec, generate, load_generator, pixels_to_uint8


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--run", required=True)
    args = parser.parse_args()
    run = gen_run(load_params(), args.run)
    meta = json.loads((GEN_DATA / "meta.json").read_text())
    if meta["kind"] != "pixels":
        raise SystemExit("decoding VAE latents to images is not implemented yet (issue 5); use scale=embedded.")
    spec = GeneratorSpec(run.model["arch"], run.model["attention"], run.model.get("vca") or {}, run.shape)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shape = (meta["channels"], meta["image_size"], meta["image_size"])
    with atomic_directory(run.paths.root / "samples") as tmp:
        for seed in run.seeds:
            model = load_generator(spec, run.paths.seed_dir(seed) / "model_ema.safetensors", run.recipe)
            out = generate(model, run.objective, run.sampling, num_samples=run.sampling["num_samples"],
                           num_classes=meta["num_classes"], input_shape=shape, seed=seed, device=device)
            images = pixels_to_uint8(out["samples"])
            save_file({"images": images.contiguous(), "labels": out["labels"]}, str(tmp / f"seed_{seed}.safetensors"))
            # one row per class, the first eight samples of each
            order = torch.cat([torch.nonzero(out["labels"] == c).flatten()[:8] for c in range(meta["num_classes"])])
            save_image(images[order].float() / 255.0, str(tmp / f"grid_seed_{seed}.png"), nrow=8, padding=1)
            print(f"sample_gen {args.run} seed {seed}: {len(images)} samples")


if __name__ == "__main__":
    main()
