"""DVC stage `fid_reference`: the real-image side of every FID (data/fid_reference).

Statistics (mean, covariance) of the images the generators learn from, and a random
subset of their features (KID, precision/recall), in the feature space eval_gen uses:

* paper scale: Inception (torch-fidelity's ``inception-v3-compat``) over ImageNet train,
  center-cropped to 256 px the ADM way, plus sFID's spatial statistics; or, with
  ``fid_reference.adm_npz``, the ``mu``/``sigma`` (``mu_s``/``sigma_s``) and the 10,000
  images of an ADM reference batch, so numbers compare with ADM's evaluator directly;
* embedded scale: the digit classifier's features over every training digit.
"""
from __future__ import annotations

import json

import numpy as np
import torch
from safetensors.torch import load_file
from torch.utils.data import DataLoader

from vcarepro.config import stage_params
from vcarepro.data.folders import ManifestDataset
from vcarepro.data.latents import adm_center_crop
from vcarepro.io import atomic_directory, write_json
from vcarepro.metrics.extractors import make_extractor
from vcarepro.metrics.fid50k import adm_reference_features, load_adm_reference, reference_from_images
from vcarepro.pipeline import CLS_DATA, FID_REFERENCE, GEN_DATA


def _crop_to_uint8(size: int):
    def transform(image):
        return torch.from_numpy(np.asarray(adm_center_crop(image, size), dtype=np.uint8).copy()).permute(2, 0, 1)
    return transform


def imagenet_batches(image_size: int, batch_size: int, workers: int):
    """uint8 (B, 3, S, S) batches of the prepared train split, ADM-center-cropped to S."""
    dataset = ManifestDataset(CLS_DATA, "train", _crop_to_uint8(image_size))
    for images, _ in DataLoader(dataset, batch_size=batch_size, num_workers=workers, shuffle=False):
        yield images


def main() -> None:
    params = stage_params()
    p = params["fid_reference"]
    meta = json.loads((GEN_DATA / "meta.json").read_text())
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    extractor, name = make_extractor(meta, params["prepare_gen"], device, batch_size=p["batch_size"])
    spatial = None
    if p["adm_npz"]:
        stats = load_adm_reference(p["adm_npz"])
        spatial = load_adm_reference(p["adm_npz"], spatial=True)
        features = adm_reference_features(p["adm_npz"], extractor, batch_size=p["batch_size"])
        source = f"ADM reference batch {p['adm_npz']}"
    elif meta["kind"] == "pixels":
        images = load_file(str(GEN_DATA / "train.safetensors"))["images"]
        batches = (images[i:i + p["batch_size"]] for i in range(0, len(images), p["batch_size"]))
        stats, features = reference_from_images(batches, extractor, keep_features=p["keep_features"], seed=p["seed"])
        source = f"{GEN_DATA}/train.safetensors (the training digits)"
    else:
        stats, features, spatial = reference_from_images(
            imagenet_batches(meta["image_size"], p["batch_size"], p["workers"]), extractor,
            keep_features=p["keep_features"], seed=p["seed"], spatial=True)
        source = f"{CLS_DATA} train split, ADM center crop to {meta['image_size']} px"
    with atomic_directory(FID_REFERENCE) as tmp:
        stats.save(tmp / "stats.npz")
        if spatial is not None:
            spatial.save(tmp / "spatial_stats.npz")
        np.save(tmp / "features.npy", np.asarray(features, dtype=np.float32), allow_pickle=False)
        write_json(tmp / "meta.json", {"source": source, "extractor": name, "num_images": int(stats.num),
                                       "num_features_kept": int(len(features)), "feature_dim": int(stats.dim),
                                       "sfid": spatial is not None})
    print(f"fid_reference: {stats.num} images ({source}), {len(features)} features kept -> {FID_REFERENCE}")


if __name__ == "__main__":
    main()
