"""Run one tiny training to completion in its own process, for the kill-and-resume tests.

    python tests/train_driver.py cls|gen WORKDIR [SEED]

WORKDIR holds the data (prepared on first use) and receives ``ckpt/`` and ``out/``.
Each run is small enough for CPU tests and long enough (a few seconds, several
checkpoints) for a signal to land mid-training.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from vcarepro.core.io import write_manifest
from vcarepro.core.recipes import GenRecipe
from vcarepro.data.embedded import export_digits
from vcarepro.params.config import compose
from vcarepro.params.runs import cls_run
from vcarepro.train.classification import ClassifierSpec, train_classifier
from vcarepro.train.distributed import DistInfo
from vcarepro.train.generation import GeneratorSpec, train_generator

CPU = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


def main(branch: str, workdir: Path, seed: int = 0) -> None:
    torch.set_num_threads(1)
    params = compose([])
    data = workdir / "cls"
    if not (data / "manifest.csv").is_file():
        export_digits(data, val_fraction=0.2, seed=0)
    common = dict(seed=seed, out_dir=workdir / "out", ckpt_dir=workdir / "ckpt", info=CPU, fingerprint="driver")
    if branch == "cls":
        spec = ClassifierSpec("deit_tiny", "vca", {}, dict(params["cls_shape"], depth=1, embed_dim=32))
        recipe = cls_run(params, "deit_tiny-vca").recipe.model_copy(
            update=dict(
                epochs=8,
                batch_size=64,
                workers=1,
                hflip=0.5,
                reprob=0.25,
                train_augment=True,
                input_path="fast",
                cache_images=False,
            )
        )  # augmented on the fast path: the workers' draws and the device side's erasing must resume
        figures = train_classifier(spec=spec, recipe=recipe, data_root=data, **common)
    else:
        from safetensors.torch import save_file

        from vcarepro.data.pixels import load_split_pixels

        gen = workdir / "gen"
        if not (gen / "meta.json").is_file():
            gen.mkdir(exist_ok=True)
            pixels = load_split_pixels(data, "train", 8)
            save_file({k: v.contiguous() for k, v in pixels.items()}, str(gen / "train.safetensors"))
            (gen / "meta.json").write_text('{"kind": "pixels"}')
            write_manifest(gen)  # as prepare_gen writes it: training checks the bytes first
        spec = GeneratorSpec("dit_s2", "vca", {}, dict(params["gen_shape"], depth=1, hidden_size=32))
        recipe = GenRecipe.model_construct(**params["gen_recipe"]).model_copy(
            update=dict(steps=600, batch_size=32, ckpt_every=25, log_every=10, hflip=True)
        )
        figures = train_generator(spec=spec, objective="flow", recipe=recipe, data_root=gen, **common)
    print("finished", figures, flush=True)


if __name__ == "__main__":
    from vcarepro.train.preemption import Preempted

    try:
        main(sys.argv[1], Path(sys.argv[2]), *map(int, sys.argv[3:]))
    except Preempted as stop:
        print(stop, file=sys.stderr, flush=True)
        raise
