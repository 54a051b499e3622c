"""DVC stage `prepare_gen`: the generation training set and the FID reference (data/gen)."""
from __future__ import annotations

from safetensors.torch import save_file

from vcarepro.config import load_params, section
from vcarepro.data.pixels import load_split_pixels
from vcarepro.io import atomic_directory, write_json
from vcarepro.metrics.fid import DIGITS_EXTRACTOR, save_feature_net, train_feature_net
from vcarepro.pipeline import CLS_DATA, GEN_DATA


def main() -> None:
    p = section(load_params(), "prepare_gen")
    if p["source"] != "pixels":
        raise SystemExit(
            f"prepare_gen.source={p['source']!r}: VAE-latent preparation (paper scale) is not implemented yet "
            f"(issue 5); use scale=embedded, whose source is 'pixels'.")
    data = load_split_pixels(CLS_DATA, "train", p["image_size"])
    with atomic_directory(GEN_DATA) as tmp:
        save_file({k: v.contiguous() for k, v in data.items()}, str(tmp / "train.safetensors"))
        meta = {"kind": "pixels", "image_size": p["image_size"], "channels": int(data["images"].shape[1]),
                "num_classes": int(data["num_classes"]), "num_images": int(len(data["labels"])),
                "fid_extractor": p["fid_extractor"]}
        if p["fid_extractor"] == "digits":
            net, accuracy = train_feature_net(data["images"], data["labels"], epochs=p["extractor_epochs"],
                                              seed=p["seed"], num_classes=meta["num_classes"])
            save_feature_net(net, tmp / "fid_extractor.safetensors")
            meta.update(fid_extractor_name=DIGITS_EXTRACTOR, fid_extractor_train_accuracy=accuracy)
        write_json(tmp / "meta.json", meta)
    print(f"prepare_gen: {meta['num_images']} images of {meta['channels']}x{p['image_size']}x{p['image_size']} "
          f"-> {GEN_DATA}")


if __name__ == "__main__":
    main()
