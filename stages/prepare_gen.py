"""DVC stage `prepare_gen`: the generation training set and the FID reference (data/gen)."""

from __future__ import annotations

from vcarepro.core import progress
from vcarepro.core.errors import BadInput
from vcarepro.core.io import atomic_directory, safetensors_bytes, write_bytes, write_json
from vcarepro.core.stage import run_stage
from vcarepro.data.pixels import load_split_pixels
from vcarepro.metrics.digit_features import DIGITS_EXTRACTOR, save_feature_net, train_feature_net
from vcarepro.params.config import section, stage_params
from vcarepro.params.runs import CLS_DATA, GEN_DATA


def prepare_latents(p) -> dict:
    """Paper scale: ImageNet train (the prepared classification layout) through the VAE, both mirror variants."""
    import torch

    from vcarepro.data.folders import read_classes, read_manifest
    from vcarepro.data.latents import encode_to_shards, load_vae

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    vae = load_vae(p["vae"], device)  # fails here, before any output, when the weights are absent
    items = read_manifest(CLS_DATA, "train")
    with (
        atomic_directory(GEN_DATA, digests=True) as tmp,
        progress.Progress("encoding", len(items), unit="image") as encoded,
    ):
        index = encode_to_shards(
            items,
            tmp / "latents",
            vae,
            image_size=p["image_size"],
            batch_size=p["vae_batch_size"],
            shard_size=p["shard_size"],
            device=device,
            progress=lambda done, total: encoded.update(done),
        )
        meta = {
            "kind": "vae_latents",
            "image_size": p["image_size"],
            "vae": p["vae"],
            "latent_shape": index["latent_shape"],
            "scaling_factor": index["scaling_factor"],
            "num_classes": len(read_classes(CLS_DATA)),
            "num_images": index["num_images"],
            "fid_extractor": p["fid_extractor"],
        }
        write_json(tmp / "meta.json", meta)
    return meta


def prepare_pixels(p) -> dict:
    """Embedded scale: the digits themselves, and the digit classifier FID measures with."""
    data = load_split_pixels(CLS_DATA, "train", p["image_size"])
    with atomic_directory(GEN_DATA, digests=True) as tmp:
        write_bytes(tmp / "train.safetensors", safetensors_bytes(data))
        meta = {
            "kind": "pixels",
            "image_size": p["image_size"],
            "channels": int(data["images"].shape[1]),
            "num_classes": int(data["num_classes"]),
            "num_images": int(len(data["labels"])),
            "fid_extractor": p["fid_extractor"],
        }
        if p["fid_extractor"] == "digits":
            net, accuracy = train_feature_net(
                data["images"],
                data["labels"],
                epochs=p["extractor_epochs"],
                seed=p["seed"],
                num_classes=meta["num_classes"],
            )
            save_feature_net(net, tmp / "fid_extractor.safetensors")
            meta.update(fid_extractor_name=DIGITS_EXTRACTOR, fid_extractor_train_accuracy=accuracy)
        write_json(tmp / "meta.json", meta)
    return meta


def main() -> None:
    params = stage_params()
    progress.configure(params, "prepare_gen")
    p = section(params, "prepare_gen")
    if p["source"] == "pixels":
        meta = prepare_pixels(p)
    elif p["source"] == "vae_latents":
        meta = prepare_latents(p)
    else:
        raise BadInput(f"prepare_gen.source={p['source']!r} is unknown; use 'vae_latents' or 'pixels'.")
    print(f"prepare_gen: {meta['num_images']} {meta['kind']} at {p['image_size']} px -> {GEN_DATA}")


if __name__ == "__main__":
    run_stage(main)
