"""The SD-VAE and FID on the device (part ``fid``): the smoke scale's stand-ins, loaded by the project's own readers.

Images go through the VAE and back, then the evaluator's FID against the originals with Inception on the
device. The weights are random, so the number means nothing; that the path runs does.
"""

from __future__ import annotations

import math
import tempfile
import time
from pathlib import Path
from typing import Any, Dict

import torch

from vcarepro.tools.gpu_check.parts import FAIL, PASS, Check, Outcome

# (image side, images, FID's leading feature coordinates, images that calibrate the stand-in Inception's batch norms):
# a GPU at the paper's 256 px, a CPU at a tiny size (each image costs Inception's 299 px pass on the CPU)
GPU_SIZES = (256, 32, 16, 8)
TINY_SIZES = (64, 3, 2, 1)
VAE_FACTOR = 8  # the SD-VAE's downsampling: 256 px images, 4 x 32 x 32 latents


def fid_part(check: Check, outcome: Outcome) -> None:
    from vcarepro.core.io import write_npz
    from vcarepro.data.latents import decode_to_uint8, load_vae
    from vcarepro.metrics.evaluator import evaluate_samples
    from vcarepro.metrics.feature_stats import StatsAccumulator
    from vcarepro.metrics.inception import InceptionFeatures
    from vcarepro.tools.standins import synthetic_batch, write_random_inception, write_random_vae

    side, count, dims, calibration = TINY_SIZES if check.tiny else GPU_SIZES
    row: Dict[str, Any] = {"id": "SD-VAE stand-in, Inception stand-in", "image_size": side, "images": count}
    with tempfile.TemporaryDirectory(prefix="vcarepro-gpu-check-fid-") as tmp:
        check.log("fid: writing the stand-in VAE and Inception weights")
        vae_dir = write_random_vae(Path(tmp) / "vae", sample_size=side)
        weights = write_random_inception(Path(tmp) / "inception.pth", calibration_images=calibration)
        if check.out_of_time(outcome, 0, 2, "passes (VAE, FID)"):
            return
        vae = load_vae(str(vae_dir), check.device)
        images = synthetic_batch(count, classes=4, seed=0, split="reference", image_size_px=side)  # uint8 NHWC
        pixels = torch.from_numpy(images).permute(0, 3, 1, 2).float().div(127.5).sub(1.0)
        started = time.perf_counter()
        with torch.inference_mode():
            latents = vae.encode(pixels.to(check.device)).latent_dist.mean * vae.config.scaling_factor
        decoded = decode_to_uint8(vae, latents)  # uint8 (B, 3, H, W) on the CPU
        _sync(check)
        row["vae_seconds"] = time.perf_counter() - started
        row["vae_device"] = str(next(vae.parameters()).device)
        row["latent_shape"] = list(latents.shape[1:])
        row["decoded_shape"] = list(decoded.shape[1:])
        if check.out_of_time(outcome, 1, 2, "passes (VAE, FID)"):
            return
        extractor = InceptionFeatures(weights, check.device, batch_size=count)
        reference = StatsAccumulator(extractor.feature_dim)
        reference.update(extractor(torch.from_numpy(images).permute(0, 3, 1, 2))[0])
        samples = Path(tmp) / "samples.npz"
        write_npz(samples, {"arr_0": decoded.permute(0, 2, 3, 1).contiguous().numpy()})
        started = time.perf_counter()
        scores = evaluate_samples(
            samples, reference.result(), extractor, feature_dims=dims, split_size=count, batch_size=count
        )
        _sync(check)
        row["fid_seconds"] = time.perf_counter() - started
        row["inception_device"] = str(next(extractor.network.parameters()).device)
        row["fid"] = scores["fid"]
        row["fid_feature_dims"] = scores["fid_feature_dims"]
        row["inception_score"] = scores["inception_score"]
    problems = fid_problems(row, check.device.type, side)
    row["status"] = FAIL if problems else PASS
    row["reason"] = "; ".join(problems) or (
        f"latents {'x'.join(map(str, row['latent_shape']))} and back; FID {row['fid']:.3g} over "
        f"{row['fid_feature_dims']} coordinates, Inception on {row['inception_device']}"
    )
    outcome.rows.append(row)
    outcome.summary = row["reason"]


def fid_problems(row: Dict[str, Any], device_type: str, side: int) -> list:
    problems = []
    if row["latent_shape"] != [4, side // VAE_FACTOR, side // VAE_FACTOR]:
        problems.append(f"latents of shape {row['latent_shape']}, not the SD-VAE's [4, {side // VAE_FACTOR}, ...]")
    if row["decoded_shape"] != [3, side, side]:
        problems.append(f"decoded images of shape {row['decoded_shape']}, not [3, {side}, {side}]")
    for what in ("vae_device", "inception_device"):
        if not row[what].startswith(device_type):
            problems.append(f"the {what.split('_')[0]} ran on {row[what]}, not {device_type}")
    if not (math.isfinite(row["fid"]) and row["fid"] >= 0):
        problems.append(f"FID is {row['fid']}")
    return problems


def _sync(check: Check) -> None:
    if check.device.type == "cuda":
        torch.cuda.synchronize(check.device)
