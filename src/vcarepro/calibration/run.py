"""Evaluate one released checkpoint through the project's own evaluation code (stages calibrate_cls / calibrate_gen)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

import torch
from torch.utils.data import DataLoader, Dataset

from vcarepro.calibration import (
    build_model,
    check_digest,
    entries,
    keymap_for,
    load_strict,
    read_released,
    require_file,
    row,
)
from vcarepro.core.errors import BadInput
from vcarepro.core.progress import Progress
from vcarepro.core.recipes import ClsRecipe

# The published protocols' sizes: ImageNet-1K val (1000 classes, 50,000 images) and FID-50K.
IMAGENET_VAL = (1000, 50_000)
FID_SAMPLES = 50_000


def load_released(model, cal: Dict[str, Any], name: str, entry: Dict[str, Any]):
    """``model`` with the released file of entry ``name`` loaded strictly; (model, path, sha256, deviations)."""
    path = require_file(cal, name, entry)
    digest = check_digest(path, entry, name)
    keymap = keymap_for(entry, name)
    container, state = read_released(path, keymap, trust_pickle=cal["trust_pickle"])
    load_strict(model, state, keymap, name, path)
    deviations = []
    released = keymap.released_container()
    if released is not None and container is not None and container != released:
        # a fallback entry of the same file, e.g. CSWin's non-EMA state_dict: the published number is the EMA's
        deviations.append(f"weights read from {container}, not {released}")
    return model, path, digest, deviations


class ImageNetLabels(Dataset):
    """A prepared split whose labels are ImageNet-1K's class indices (sorted wnids), as a released head reads them."""

    def __init__(self, dataset) -> None:
        from timm.data import ImageNetInfo

        index = {wnid: i for i, wnid in enumerate(ImageNetInfo().label_names())}
        strangers = [c.wnid for c in dataset.classes if c.wnid not in index]
        if strangers:
            raise BadInput(
                f"the prepared classes include {len(strangers)} that are not ImageNet-1K synsets "
                f"({', '.join(strangers[:3])}); a released 1000-way head needs ImageNet's classes "
                f"(prepare_cls.source=imagenet)."
            )
        self.dataset = dataset
        self.to_imagenet = {c.index: index[c.wnid] for c in dataset.classes}

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int):
        image, label = self.dataset[i]
        return image, self.to_imagenet[label]


def calibrate_classifier(params: Dict[str, Any], name: str, device: torch.device, data_root: Path) -> Dict[str, Any]:
    """Top-1 of released classifier ``name`` on data_root's val split, with the recipe its authors evaluated with."""
    from vcarepro.data.folders import ManifestDataset
    from vcarepro.train.classification import build_transforms, evaluate

    cal = params["calibrate"]
    entry = entries(cal, "cls")[name]
    model, path, digest, deviations = load_released(build_model("cls", entry), cal, name, entry)
    recipe = ClsRecipe.model_construct(**params["cls_recipes"][entry["recipe"]])  # as its authors evaluated
    split = ManifestDataset(data_root, "val", build_transforms(recipe, training=False))
    val = ImageNetLabels(split)
    if (len(split.classes), len(val)) != IMAGENET_VAL:
        deviations.append(
            f"{len(split.classes)} classes and {len(val)} val images, not ImageNet-1K val's "
            f"{IMAGENET_VAL[0]} and {IMAGENET_VAL[1]:,}"
        )
    loader = DataLoader(val, batch_size=cal["batch_size"], num_workers=cal["workers"])
    figures = evaluate(model.to(device), loader, device, report=f"{name} val")
    protocol = {
        "recipe": entry["recipe"],
        "crop_pct": recipe.crop_pct,
        "crop_mode": recipe.crop_mode,
        "interpolation": recipe.interpolation,
        "img_size": recipe.img_size,
        "val_images": len(val),
        "top5": figures["top5"],
    }
    return row(params["scale"], "cls", name, entry, figures["top1"], path, digest, protocol, deviations)


def sampling_for(params: Dict[str, Any], entry: Dict[str, Any]) -> Dict[str, Any]:
    """The project's sampling params with the released entry's sampler, steps and guidance."""
    cal = params["calibrate"]
    steps = cal["steps"] or entry["steps"]
    sampling = dict(
        params["sampling"],
        cfg_scale=entry["cfg_scale"],
        labels="random",
        batch_size=cal["sample_batch_size"],
        ddpm_steps=steps,
        flow_steps=steps,
    )
    if entry["objective"] == "flow":
        sampling["flow_sampler"] = entry["sampler"]
    return sampling


def _protocol_deviations(params: Dict[str, Any], entry: Dict[str, Any], sampling, vae_name: str) -> List[str]:
    """Where this calibration samples or evaluates otherwise than the published figure was measured."""
    cal, out = params["calibrate"], []
    if cal["num_samples"] != FID_SAMPLES:
        out.append(f"{cal['num_samples']:,} samples, not FID-50K's {FID_SAMPLES:,}")
    if sampling["ddpm_steps"] != entry["steps"]:
        out.append(f"{sampling['ddpm_steps']} sampler steps, not the published {entry['steps']}")
    if cal["vae_decoder"]:
        out.append(f"decoded by {vae_name}, not sampling.vae_decoder")
    if params["eval_gen"]["feature_dims"]:
        out.append(f"FID over {params['eval_gen']['feature_dims']} Inception coordinates, not 2048")
    return out


def calibrate_generator(
    params: Dict[str, Any], name: str, device: torch.device, work_dir: Path, fid_reference: Path
) -> Dict[str, Any]:
    """FID-50K (and the rest of ADM's evaluation) of released generator ``name``'s samples."""
    from vcarepro.data.latents import decode_to_uint8, load_vae
    from vcarepro.data.samples import NpzSampleWriter, discard_work
    from vcarepro.metrics.evaluator import evaluate_samples, evaluator_options
    from vcarepro.metrics.extractors import make_extractor
    from vcarepro.metrics.fid_reference import load_reference_set
    from vcarepro.metrics.protocol import sampler_of
    from vcarepro.params.stage_facts import digest, stage_facts
    from vcarepro.train.generation import generate_batches

    cal = params["calibrate"]
    entry = entries(cal, "gen")[name]
    model, path, weights_digest, deviations = load_released(build_model("gen", entry), cal, name, entry)
    side = entry["image_size"] // 8  # the latent grid build_model made the model for
    sampling = sampling_for(params, entry)
    vae_name = cal["vae_decoder"] or params["sampling"]["vae_decoder"]
    num = cal["num_samples"]
    deviations += _protocol_deviations(params, entry, sampling, vae_name)
    vae = load_vae(vae_name, device)
    samples = work_dir / f"{name}.npz"
    # unfinished work resumes only for the same weights and under the facts DVC keys calibrate_gen on (as
    # sample_gen's): its params (this entry's, the sampler's) and dependencies (the code, data/released)
    key = digest(weights_digest, stage_facts("calibrate_gen"))
    writer = NpzSampleWriter(
        samples, num, (entry["image_size"], entry["image_size"], 3), work_dir=work_dir / f"{name}.work", key=key
    )
    done = min(num, writer.done_batches * sampling["batch_size"])
    with Progress(f"{name} sampling", num, start=done, unit="sample") as progress:
        for batch, (start, x, labels) in enumerate(
            generate_batches(
                model,
                entry["objective"],
                sampling,
                num_samples=num,
                num_classes=1000,
                input_shape=(4, side, side),
                seed=cal["seed"],
                device=device,
                flow_path="linear",
                start_batch=writer.done_batches,
            ),
            start=writer.done_batches,
        ):
            writer.write(batch, start, decode_to_uint8(vae, x.to(device)).cpu(), labels)
            progress.update(start + len(labels))
    writer.close()
    extractor, extractor_name = make_extractor(
        {"fid_extractor": params["prepare_gen"]["fid_extractor"]},
        params["prepare_gen"],
        device,
        batch_size=params["fid_reference"]["batch_size"],
    )
    figures = evaluate_samples(
        samples,
        extractor=extractor,
        **load_reference_set(fid_reference),
        **evaluator_options(params["eval_gen"]),
        seed=cal["seed"],
    )
    # measured: the samples (10 GB at FID-50K) and their work go; a re-run samples afresh
    discard_work(work_dir / f"{name}.work")
    samples.unlink()
    sampler, steps = sampler_of(entry["objective"], sampling)  # what generate_batches followed
    protocol = {
        "sampler": sampler,
        "sampler_steps": steps,
        "cfg_scale": sampling["cfg_scale"],
        "labels": sampling["labels"],
        "decoder": vae_name,
        "num_samples": figures["num_samples"],
        "fid_feature_dims": figures["fid_feature_dims"],
        "extractor": extractor_name,
        **{k: figures[k] for k in ("inception_score", "sfid", "precision", "recall") if k in figures},
    }
    return row(params["scale"], "gen", name, entry, float(figures["fid"]), path, weights_digest, protocol, deviations)
