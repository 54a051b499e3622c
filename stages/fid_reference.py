"""DVC stage `fid_reference`: the real-image side of every FID (data/fid_reference).

Statistics (mean, covariance) and reference features (KID, precision/recall), in the
feature space eval_gen uses:

* paper scale: ADM's reference batch (``fid_reference.adm_npz``,
  ``VIRTUAL_imagenet256_labeled.npz``): its ``mu``/``sigma`` and ``mu_s``/``sigma_s`` over
  ImageNet train and the Inception features of its 10,000 images, the reference of DiT's,
  SiT's and ADM's FID-50K. With ``own_statistics`` (or ``adm_npz: null``) also our own
  statistics: Inception (torch-fidelity's ``inception-v3-compat``) over ImageNet train,
  center-cropped to 256 px the ADM way, with sFID's spatial statistics; when both exist,
  ``meta.json`` records the FID between them.
* embedded scale: the digit classifier's features over every training digit ("own").
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file
from torch.utils.data import DataLoader

from vcarepro.errors import MissingInput, run_stage
from vcarepro.config import stage_params
from vcarepro.data.folders import ManifestDataset
from vcarepro.data.latents import adm_center_crop
from vcarepro.integrity import prepared
from vcarepro.io import atomic_directory, write_json
from vcarepro.metrics.extractors import make_extractor
from vcarepro.metrics.fid50k import reference_from_images, write_reference
from vcarepro.pipeline import CLS_DATA, FID_REFERENCE, GEN_DATA

ADM_URL = ("https://openaipublic.blob.core.windows.net/diffusion/jul-2021/ref_batches/imagenet/256/"
           "VIRTUAL_imagenet256_labeled.npz")


def _crop_to_uint8(size: int):
    def transform(image):
        return torch.from_numpy(np.asarray(adm_center_crop(image, size), dtype=np.uint8).copy()).permute(2, 0, 1)
    return transform


def imagenet_batches(image_size: int, batch_size: int, workers: int):
    """uint8 (B, 3, S, S) batches of the prepared train split, ADM-center-cropped to S."""
    dataset = ManifestDataset(CLS_DATA, "train", _crop_to_uint8(image_size))
    for images, _ in DataLoader(dataset, batch_size=batch_size, num_workers=workers, shuffle=False):
        yield images


def own_reference(meta, p, extractor):
    """Our own statistics of the training images: (stats, kept features, spatial stats or None, source)."""
    if meta["kind"] == "pixels":
        images = load_file(str(GEN_DATA / "train.safetensors"))["images"]
        batches = (images[i:i + p["batch_size"]] for i in range(0, len(images), p["batch_size"]))
        stats, features = reference_from_images(batches, extractor, keep_features=p["keep_features"], seed=p["seed"])
        return stats, features, None, f"{GEN_DATA}/train.safetensors (the training digits)"
    stats, features, spatial = reference_from_images(
        imagenet_batches(meta["image_size"], p["batch_size"], p["workers"]), extractor,
        keep_features=p["keep_features"], seed=p["seed"], spatial=True)
    return stats, features, spatial, f"{CLS_DATA} train split, ADM center crop to {meta['image_size']} px"


def main() -> None:
    params = stage_params()
    p = params["fid_reference"]
    adm = Path(p["adm_npz"]) if p["adm_npz"] else None
    if adm is not None and not adm.is_file():  # before any work: one sentence, no output
        raise MissingInput(f"fid_reference: ADM's reference batch {adm} is missing; download it on a connected machine "
                         f"({ADM_URL}, listed in openai/guided-diffusion evaluations/README.md) and put it at {adm}, "
                         f"or set fid_reference.adm_npz=null to use our own statistics (not comparable with the paper).")
    meta = json.loads((prepared(GEN_DATA, "prepare_gen", without=("latents/",)) / "meta.json").read_text())
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        extractor, name = make_extractor(meta, params["prepare_gen"], device, batch_size=p["batch_size"])
    except FileNotFoundError as err:
        raise MissingInput(f"fid_reference: {err}") from None
    own = (lambda: own_reference(meta, p, extractor)) if p["own_statistics"] or adm is None else None
    with atomic_directory(FID_REFERENCE, digests=True) as tmp:
        info = write_reference(tmp, extractor, adm_npz=adm, own=own, batch_size=p["batch_size"])
        write_json(tmp / "meta.json", {**info, "extractor": name})
    between = info.get("fid_between_references")
    print(f"fid_reference: {info['reference']} reference, {info['num_images']} images ({info['source']}), "
          f"{info['num_features_kept']} features kept -> {FID_REFERENCE}"
          + (f"; FID between ADM's and our own statistics {between:.3f}" if between is not None else ""))


if __name__ == "__main__":
    run_stage(main)
