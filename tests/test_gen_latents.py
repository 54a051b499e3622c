"""The paper-scale generation path end to end on tiny stand-ins: images -> VAE latents -> DiT -> decoded samples."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from helpers import load_stage
from vcarepro.core.recipes import GenRecipe
from vcarepro.data.embedded import export_digits
from vcarepro.data.latents import decode_to_uint8, load_vae
from vcarepro.params.config import compose
from vcarepro.tools.standins import write_random_vae
from vcarepro.train.distributed import DistInfo
from vcarepro.train.generation import GeneratorSpec, generate_batches, load_generator, train_generator

CPU = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A prepared classification layout (the digits) and a tiny VAE saved as a local diffusers folder."""
    root = tmp_path_factory.mktemp("paper_gen")
    export_digits(root / "data" / "cls", val_fraction=0.9, seed=0)  # 179 training digits
    write_random_vae(root / "vae", seed=0, block_out_channels=(8, 16), sample_size=16)  # 2x downsampling
    return root


def test_latent_branch_prepares_trains_and_decodes(workdir, monkeypatch, one_torch_thread):
    monkeypatch.chdir(workdir)
    prepare_gen = load_stage("prepare_gen")
    p = dict(
        compose(["scale=paper"])["prepare_gen"],
        vae=str(workdir / "vae"),
        image_size=16,
        vae_batch_size=64,
        shard_size=100,
    )
    meta = prepare_gen.prepare_latents(p)
    on_disk = json.loads(Path("data/gen/meta.json").read_text())
    assert on_disk == meta and meta["kind"] == "vae_latents"
    assert (meta["latent_shape"], meta["num_images"], meta["num_classes"]) == ([4, 8, 8], 179, 10)
    assert sorted(q.name for q in Path("data/gen/latents").glob("moments_*.npy")) == [
        "moments_00000.npy",
        "moments_00001.npy",
    ]

    spec = GeneratorSpec(
        "dit_s2",
        "vca",
        {"contrast_tokens": 4},
        dict(input_size=8, in_channels=4, depth=1, hidden_size=32, num_heads=2, num_classes=10),
    )
    recipe = GenRecipe.model_construct(**compose(["scale=paper"])["gen_recipe"]).model_copy(
        update=dict(steps=2, batch_size=8, ckpt_every=2, precision="fp32")
    )
    figures = train_generator(
        spec=spec,
        objective="ddpm",
        recipe=recipe,
        data_root="data/gen",
        seed=0,
        out_dir=workdir / "out",
        ckpt_dir=workdir / "ckpt",
        info=CPU,
        fingerprint="f",
    )
    assert figures["steps"] == 2

    model = load_generator(spec, workdir / "out" / "model_ema.safetensors", recipe)
    sampling = dict(compose(["scale=paper"])["sampling"], batch_size=3, ddpm_steps=2, labels="balanced")
    batches = list(
        generate_batches(
            model,
            "ddpm",
            sampling,
            num_samples=5,
            num_classes=10,
            input_shape=tuple(meta["latent_shape"]),
            seed=0,
            device=torch.device("cpu"),
        )
    )
    assert [(start, tuple(x.shape), y.tolist()) for start, x, y in batches] == [
        (0, (3, 4, 8, 8), [0, 1, 2]),
        (3, (2, 4, 8, 8), [3, 4]),
    ]
    images = decode_to_uint8(load_vae(p["vae"], torch.device("cpu")), batches[0][1])
    assert images.shape == (3, 3, 16, 16) and images.dtype == torch.uint8


def test_a_missing_vae_stops_prepare_gen_before_any_output(workdir, monkeypatch):
    monkeypatch.chdir(workdir)
    prepare_gen = load_stage("prepare_gen")
    before = sorted(str(q) for q in Path("data").rglob("*"))
    p = dict(compose(["scale=paper"])["prepare_gen"], vae=str(workdir / "no-such-vae"))
    with pytest.raises(FileNotFoundError, match="no-such-vae"):
        prepare_gen.prepare_latents(p)
    assert sorted(str(q) for q in Path("data").rglob("*")) == before
