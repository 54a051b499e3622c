"""From a trained generator to samples on disk: what ``sample_gen`` does for each seed of a run.

The model samples its own space: VAE latents at paper scale, decoded with ``sampling.vae_decoder``
batch by batch, or pixels at embedded scale (:func:`sample_space`). Either way a sample becomes a
uint8 image of the ADM evaluator's format, grayscale repeated to RGB. :func:`write_seed_samples`
fills one seed's ``seed_<s>.npz`` resumably (:class:`~vcarepro.data.samples.NpzSampleWriter`) and
draws its preview grid; :func:`write_protocol` records the protocol the samples followed
(:mod:`vcarepro.metrics.protocol`), which ``eval_gen`` copies beside its numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Tuple

import torch
import torch.nn as nn

from vcarepro.core.io import write_json
from vcarepro.core.progress import Progress
from vcarepro.data.samples import NpzSampleWriter
from vcarepro.metrics.protocol import PIXELS_DECODER, PROTOCOL_FILE, sampling_protocol
from vcarepro.train.generation import generate_batches, pixels_to_uint8

GRID_PER_CLASS = 8
GRID_CLASSES = 10  # the preview shows the first ten classes, eight samples each


@dataclass
class SampleSpace:
    """What the model samples, the images it becomes, and the decoder between them (the protocol's name)."""

    input_shape: Tuple[int, ...]
    image_shape: Tuple[int, int, int]  # (H, W, 3), the ADM format
    decoder: str
    to_uint8: Callable[[torch.Tensor], torch.Tensor]


def sample_space(meta: Dict[str, Any], vae_decoder: str, device: torch.device) -> SampleSpace:
    """The sample space of the prepared generation set (data/gen/meta.json): VAE latents or pixels."""
    image_shape = (meta["image_size"], meta["image_size"], 3)
    if meta["kind"] == "vae_latents":
        from vcarepro.data.latents import decode_to_uint8, load_vae  # diffusers only where latents are used

        vae = load_vae(vae_decoder, device)
        return SampleSpace(
            tuple(meta["latent_shape"]), image_shape, vae_decoder, lambda x: decode_to_uint8(vae, x.to(device))
        )
    # grayscale repeated to RGB: the ADM format holds (N, H, W, 3) images
    return SampleSpace(
        (meta["channels"], meta["image_size"], meta["image_size"]),
        image_shape,
        PIXELS_DECODER,
        lambda x: pixels_to_uint8(x).expand(-1, 3, -1, -1),
    )


def write_protocol(
    out_dir: str | Path, objective: str, sampling: Dict[str, Any], space: SampleSpace, train_precision: str
) -> Dict[str, Any]:
    """``protocol.json`` in ``out_dir``: the protocol the samples there follow; returns it."""
    protocol = sampling_protocol(objective, sampling, decoder=space.decoder, train_precision=train_precision)
    write_json(Path(out_dir) / PROTOCOL_FILE, protocol)
    return protocol


def write_seed_samples(
    model: nn.Module,
    objective: str,
    sampling: Dict[str, Any],
    space: SampleSpace,
    out_dir: str | Path,
    seed: int,
    *,
    num_classes: int,
    device: torch.device,
    flow_path: str,
    work_dir: str | Path,
    key: str,
    log: Callable[[str], None] = print,
) -> None:
    """``seed_<seed>.npz`` and its preview ``grid_seed_<seed>.png`` in ``out_dir``.

    Unfinished work in ``work_dir`` resumes at the first unfinished batch when its ``key`` (what is
    sampled: weights, sampler settings, code) is this one's.
    """
    from torchvision.utils import save_image

    out_dir = Path(out_dir)
    num = sampling["num_samples"]
    writer = NpzSampleWriter(out_dir / f"seed_{seed}.npz", num, space.image_shape, work_dir=work_dir, key=key)
    if writer.note:
        log(writer.note)
    if writer.done_batches:
        log(f"resuming after {writer.done_batches} finished batches")
    done = min(num, writer.done_batches * sampling["batch_size"])
    with Progress("sampling", num, start=done, unit="sample", seed=seed) as progress:
        for batch, (start, samples, labels) in enumerate(
            generate_batches(
                model,
                objective,
                sampling,
                num_samples=num,
                num_classes=num_classes,
                input_shape=space.input_shape,
                seed=seed,
                device=device,
                flow_path=flow_path,
                start_batch=writer.done_batches,
            ),
            start=writer.done_batches,
        ):
            writer.write(batch, start, space.to_uint8(samples).cpu(), labels)
            progress.update(start + len(labels))
    # the preview, from the memory maps: the first ten classes, eight samples each
    grid = torch.from_numpy(writer.preview(GRID_PER_CLASS, min(GRID_CLASSES, num_classes)))
    writer.close()
    save_image(
        grid.permute(0, 3, 1, 2).float() / 255.0, str(out_dir / f"grid_seed_{seed}.png"), nrow=GRID_PER_CLASS, padding=1
    )
