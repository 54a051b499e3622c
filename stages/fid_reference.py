"""DVC stage `fid_reference`: the real-image side of every FID (data/fid_reference).

Statistics and reference features in eval_gen's feature space: at paper scale ADM's reference batch
(``fid_reference.adm_npz``) and, with ``own_statistics``, our own over ImageNet train (docs/paper-scale.md);
at embedded scale the digit classifier's features over every training digit.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from vcarepro.core import progress
from vcarepro.core.errors import MissingInput
from vcarepro.core.integrity import prepared
from vcarepro.core.io import atomic_directory, write_json
from vcarepro.core.stage import run_stage
from vcarepro.metrics.extractors import make_extractor
from vcarepro.metrics.fid_reference import write_reference
from vcarepro.metrics.own_reference import own_reference
from vcarepro.params.config import stage_params
from vcarepro.params.runs import CLS_DATA, FID_REFERENCE, GEN_DATA

ADM_URL = (
    "https://openaipublic.blob.core.windows.net/diffusion/jul-2021/ref_batches/imagenet/256/"
    "VIRTUAL_imagenet256_labeled.npz"
)


def main() -> None:
    params = stage_params()
    progress.configure(params, "fid_reference")
    p = params["fid_reference"]
    adm = Path(p["adm_npz"]) if p["adm_npz"] else None
    if adm is not None and not adm.is_file():  # before any work: one sentence, no output
        raise MissingInput(
            f"fid_reference: ADM's reference batch {adm} is missing; download it on a connected machine "
            f"({ADM_URL}, listed in openai/guided-diffusion evaluations/README.md) and put it at {adm}, "
            f"or set fid_reference.adm_npz=null to use our own statistics (not comparable with the paper)."
        )
    meta = json.loads((prepared(GEN_DATA, "prepare_gen", without=("latents/",)) / "meta.json").read_text())
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        extractor, name = make_extractor(meta, params["prepare_gen"], device, batch_size=p["batch_size"])
    except FileNotFoundError as err:
        raise MissingInput(f"fid_reference: {err}") from None
    own = (
        (lambda: own_reference(meta, p, extractor, gen_data=GEN_DATA, cls_data=CLS_DATA))
        if p["own_statistics"] or adm is None
        else None
    )
    with atomic_directory(FID_REFERENCE, digests=True) as tmp:
        info = write_reference(tmp, extractor, adm_npz=adm, own=own, batch_size=p["batch_size"])
        write_json(tmp / "meta.json", {**info, "extractor": name})
    between = info.get("fid_between_references")
    print(
        f"fid_reference: {info['reference']} reference, {info['num_images']} images ({info['source']}), "
        f"{info['num_features_kept']} features kept -> {FID_REFERENCE}"
        + (f"; FID between ADM's and our own statistics {between:.3f}" if between is not None else "")
    )


if __name__ == "__main__":
    run_stage(main)
