"""Paper-scale generation data: ImageNet images stored as the posterior moments of the SD VAE.

Each image is encoded once and its posterior ``mean`` and ``std`` kept, so :meth:`LatentShards.batch`
draws a fresh sample every call, as DiT's ``train.py`` does with its encoder in the loop. A VAE is not
equivariant to mirroring its latents, so the image and its mirror are both stored: picking a variant is
the flip exactly. docs/paper-scale.md says how it is prepared (about 42 GB at ImageNet scale).

Layout of a prepared directory (shard k holds images ``k*shard_size ...``)::

    moments_{k:05d}.npy   float16 (n_k, 2, 2, C, h, w)  axis 1 = [original, mirrored],
                                                         axis 2 = [mean, std]
    labels_{k:05d}.npy    int64 (n_k,)
    index.json            written last; its presence marks a finished preparation

float16 suffices without a log-variance: diffusers clamps it to [-30, 20], so std lies in [3.1e-7, 22026],
inside float16's range, and the means' rounding (at most 0.003 after scaling) is small next to the noise.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
import torch
from numpy.lib.format import open_memmap
from PIL import Image

from vcarepro.core.errors import BadInput, MissingInput
from vcarepro.core.io import preallocate, write_json
from vcarepro.data.folders import Stored, decoded_image

INDEX = "index.json"
MEAN, STD = 0, 1  # positions on the moments axis


def _moments_name(shard: int) -> str:
    return f"moments_{shard:05d}.npy"


def _labels_name(shard: int) -> str:
    return f"labels_{shard:05d}.npy"


# ---------------------------------------------------------------- pixels


def adm_center_crop(image: Image.Image, image_size: int) -> Image.Image:
    """ADM / DiT preprocessing: RGB, box-halve while the short side is >= 2*image_size,
    bicubic-resize the short side to image_size, then centre-crop a square."""
    image = image.convert("RGB")  # ImageNet holds CMYK and grayscale JPEGs
    while min(image.size) >= 2 * image_size:
        image = image.resize(tuple(side // 2 for side in image.size), resample=Image.BOX)
    scale = image_size / min(image.size)
    image = image.resize(tuple(round(side * scale) for side in image.size), resample=Image.BICUBIC)
    left = (image.width - image_size) // 2
    top = (image.height - image_size) // 2
    return image.crop((left, top, left + image_size, top + image_size))


def _to_model_space(image: Image.Image) -> torch.Tensor:
    """uint8 HxWx3 -> float32 3xHxW in [-1, 1], as ToTensor + Normalize(0.5, 0.5) computes it."""
    pixels = torch.from_numpy(np.asarray(image, dtype=np.uint8).copy()).permute(2, 0, 1)
    return pixels.float().div(255).sub(0.5).div(0.5)


def _load_cropped(stored: Stored, image_size: int) -> torch.Tensor:
    with decoded_image(stored) as image:  # names the file and the fix: a bare decoder error does not
        return _to_model_space(adm_center_crop(image, image_size))


def to_uint8_pixels(images: torch.Tensor) -> torch.Tensor:
    """[-1, 1] -> uint8 with DiT's rule: clamp((x + 1) * 127.5 + 0.5, 0, 255), then truncate."""
    return torch.clamp((images + 1) * 127.5 + 0.5, 0, 255).to(torch.uint8)


# ---------------------------------------------------------------- the VAE


def _local_vae_folder(name_or_path: str) -> Optional[Path]:
    """The directory to load from: the path itself, or the cached snapshot of a Hub repo id."""
    if Path(name_or_path).is_dir():
        return Path(name_or_path)
    from huggingface_hub import try_to_load_from_cache  # reads the cache directory only

    try:
        config = try_to_load_from_cache(name_or_path, "config.json")
    except ValueError:  # not a valid repo id either (e.g. a missing absolute path)
        return None
    return Path(config).parent if isinstance(config, str) else None


def load_vae(name_or_path: str, device: torch.device):
    """An ``AutoencoderKL`` in eval mode, float32, on device, from a local directory or the
    Hugging Face cache; never from the network.

    A Hub id is resolved to its cached snapshot directory first: given a repo id,
    huggingface_hub (2.4) contacts the Hub while building its user agent even under
    ``local_files_only=True``, whereas a directory is read without any request.
    """
    from diffusers import AutoencoderKL

    folder = _local_vae_folder(name_or_path)
    try:
        if folder is None:
            raise OSError(f"{name_or_path} is not cached")
        # low_cpu_mem_usage=False: what diffusers falls back to without `accelerate`, said here so that every
        # stage that loads the VAE does not print its seven-line advice to install it
        vae = AutoencoderKL.from_pretrained(
            folder, local_files_only=True, torch_dtype=torch.float32, low_cpu_mem_usage=False
        )
    except OSError as err:
        if Path(name_or_path).is_dir():
            raise  # a local directory that does not hold a VAE: diffusers' message says what is missing
        target = name_or_path.rstrip("/").split("/")[-1]
        raise MissingInput(
            f"VAE {name_or_path!r} is neither a local directory nor in the Hugging Face cache; on a machine "
            f"with internet run `huggingface-cli download {name_or_path} --local-dir weights/{target}`, copy "
            f"that folder here and set prepare_gen.vae to it."
        ) from err
    return vae.to(device).eval()


def _vae_device(vae) -> torch.device:
    return next(vae.parameters()).device


# ---------------------------------------------------------------- encoding


def encode_to_shards(
    items: Sequence[Tuple[Stored, int]],
    out_dir: str | Path,
    vae,
    *,
    image_size: int = 256,
    batch_size: int = 32,
    shard_size: int = 10000,
    device: torch.device = torch.device("cpu"),
    progress: Optional[Callable[[int, int], None]] = None,
) -> dict:
    """Encode (image, label) pairs (as :func:`~vcarepro.data.folders.read_manifest` gives them) and their mirrors
    into posterior-moment shards.

    ``progress(done, total)`` is called after each batch with the number of images
    encoded so far. Returns the index written to ``out_dir/index.json``, last.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # a re-run must not leave an earlier run's index or surplus shards looking valid
    for stale in [out_dir / INDEX, *out_dir.glob("moments_*.npy"), *out_dir.glob("labels_*.npy")]:
        stale.unlink(missing_ok=True)

    items = list(items)
    total = len(items)
    if total == 0:
        raise BadInput("encode_to_shards got no images.")
    counts = [min(shard_size, total - start) for start in range(0, total, shard_size)]
    vae = vae.to(device)
    latent_shape: Optional[List[int]] = None
    done = 0

    # image decoding and resizing release the GIL: load the next batch while this one encodes
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool, torch.inference_mode():
        batches = [
            (shard, start, min(start + batch_size, count))
            for shard, count in enumerate(counts)
            for start in range(0, count, batch_size)
        ]

        def submit(position: int):
            shard, start, stop = batches[position]
            first = shard * shard_size
            return [pool.submit(_load_cropped, items[first + i][0], image_size) for i in range(start, stop)]

        pending = submit(0)
        moments = None
        for position, (shard, start, stop) in enumerate(batches):
            images = torch.stack([future.result() for future in pending])
            if position + 1 < len(batches):
                pending = submit(position + 1)
            n = stop - start
            stacked = _moments_of(vae, images, device)
            if start == 0:
                latent_shape = list(stacked.shape[3:])
                first = shard * shard_size
                labels = [label for _, label in items[first : first + counts[shard]]]
                moments = _open_shard(out_dir, shard, labels, latent_shape)
            moments[start:stop] = stacked
            if stop == counts[shard]:
                moments.flush()
                del moments
                moments = None
            done += n
            if progress is not None:
                progress(done, total)

    index = {
        "num_images": total,
        "shard_size": shard_size,
        "shards": counts,
        "latent_shape": latent_shape,
        "scaling_factor": float(vae.config.scaling_factor),
        "image_size": image_size,
        "flip_variants": True,
        "posterior": "moments",
    }
    write_json(out_dir / INDEX, index)
    return index


def _moments_of(vae, images: torch.Tensor, device: torch.device) -> np.ndarray:
    """The posterior's mean and std of each image and its mirror: (n, [original, mirrored], [mean, std], C, h, w)."""
    posterior = vae.encode(torch.cat([images, images.flip(-1)]).to(device)).latent_dist
    stacked = torch.stack([posterior.mean, posterior.std], dim=1).unflatten(0, (2, len(images))).transpose(0, 1)
    return stacked.float().cpu().numpy()


def _open_shard(out_dir: Path, shard: int, labels: List[int], latent_shape: List[int]) -> np.ndarray:
    """A shard's labels, written, and its moments' memory map, preallocated for ``len(labels)`` images."""
    np.save(out_dir / _labels_name(shard), np.asarray(labels, dtype=np.int64))
    moments = open_memmap(
        out_dir / _moments_name(shard), mode="w+", dtype=np.float16, shape=(len(labels), 2, 2, *latent_shape)
    )
    preallocate(out_dir / _moments_name(shard))  # a full disk: one sentence, not a bus error
    return moments


# ---------------------------------------------------------------- reading


class LatentShards:
    """A finished latent preparation, memory-mapped; draws posterior samples by global index."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        index_path = self.root / INDEX
        if not index_path.is_file():
            raise MissingInput(
                f"{self.root} is not a finished latent preparation (no {INDEX}); run dvc repro prepare_gen."
            )
        self.index = json.loads(index_path.read_text())
        self.num_images: int = self.index["num_images"]
        self.latent_shape: Tuple[int, ...] = tuple(self.index["latent_shape"])
        self.scaling_factor: float = float(self.index["scaling_factor"])
        counts = np.asarray(self.index["shards"], dtype=np.int64)
        self._starts = np.concatenate([[0], np.cumsum(counts)])
        self.labels = torch.from_numpy(
            np.concatenate(
                [np.load(self.root / _labels_name(k), allow_pickle=False) for k in range(len(counts))]
            ).astype(np.int64)
        )
        self._moments: Optional[List[np.ndarray]] = None

    def __len__(self) -> int:
        return self.num_images

    # memory maps are reopened in each process: pickling one would copy the whole shard
    def __getstate__(self):
        return {**self.__dict__, "_moments": None}

    def _shards(self) -> List[np.ndarray]:
        if self._moments is None:
            self._moments = [
                np.load(self.root / _moments_name(k), mmap_mode="r", allow_pickle=False)
                for k in range(len(self._starts) - 1)
            ]
        return self._moments

    def moments(self, indices: torch.Tensor, flip: torch.Tensor) -> Tuple[np.ndarray, np.ndarray]:
        """float16 (mean, std), each (B, C, h, w), for global indices, mirrored where flip."""
        indices = np.asarray(torch.as_tensor(indices).cpu(), dtype=np.int64).reshape(-1)
        variants = np.asarray(torch.as_tensor(flip).cpu(), dtype=bool).reshape(-1).astype(np.int64)
        if variants.shape != indices.shape:
            raise BadInput(f"flip has {variants.size} entries for {indices.size} indices.")
        if indices.size and (indices.min() < 0 or indices.max() >= self.num_images):
            raise IndexError(f"latent indices must lie in [0, {self.num_images}).")
        gathered = np.empty((indices.size, 2, *self.latent_shape), dtype=np.float16)
        shard_of = np.searchsorted(self._starts, indices, side="right") - 1
        for shard in np.unique(shard_of):
            positions = np.flatnonzero(shard_of == shard)
            local = indices[positions] - self._starts[shard]
            order = np.argsort(local, kind="stable")  # ascending offsets read the memory map front to back
            gathered[positions[order]] = self._shards()[shard][local[order], variants[positions[order]]]
        return gathered[:, MEAN], gathered[:, STD]

    def batch(self, indices: torch.Tensor, flip: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """float32 (B, C, h, w): a fresh posterior sample (mean + std * eps) * scaling_factor per index."""
        mean, std = (torch.from_numpy(m).float() for m in self.moments(indices, flip))
        eps = torch.randn(mean.shape, generator=generator)
        return (mean + std * eps) * self.scaling_factor


# ---------------------------------------------------------------- decoding


def decode_to_uint8(vae, latents: torch.Tensor, batch_size: int = 32) -> torch.Tensor:
    """Scaled latents (as the model samples them) -> uint8 (B, 3, H, W) images on CPU."""
    device = _vae_device(vae)
    scaling_factor = vae.config.scaling_factor
    images = []
    with torch.inference_mode():
        for chunk in latents.split(batch_size):
            decoded = vae.decode(chunk.to(device=device, dtype=torch.float32) / scaling_factor).sample
            images.append(to_uint8_pixels(decoded).cpu())
    return torch.cat(images)
