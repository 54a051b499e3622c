"""The real-image side of every FID (stage fid_reference's data/fid_reference): written, and read back.

Two references: ADM's reference batch (``VIRTUAL_imagenet256_labeled.npz``), the one DiT's, SiT's and ADM's
FID-50K use, and our own statistics streamed over the training images (:func:`reference_from_images`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Optional, Tuple

import numpy as np
import torch

from vcarepro.core.errors import BadInput, MissingInput
from vcarepro.core.integrity import prepared
from vcarepro.core.progress import Progress
from vcarepro.metrics.feature_stats import (
    ArrayLike,
    FeatureReservoir,
    FeatureStats,
    PathLike,
    StatsAccumulator,
    as_float64,
    frechet_distance,
)
from vcarepro.metrics.npz_images import iter_npz_images, npz_array_shape, npz_keys, npz_num_images

ADM_REFERENCE_SIZE = 10_000  # images in ADM's reference batches, used for precision/recall


def load_adm_reference(path: PathLike, *, spatial: bool = False) -> FeatureStats:
    """An ADM reference batch ``.npz``'s statistics: ``mu``/``sigma`` (pool, FID), ``mu_s``/``sigma_s`` if ``spatial``.

    ``num`` is the number of images in its ``arr_0`` (read from the array
    header, the images stay on disk), or 0 if it has none; the statistics
    themselves were computed by OpenAI over the whole training set.
    """
    path = _adm_batch(path)
    keys = ("mu_s", "sigma_s") if spatial else ("mu", "sigma")
    with np.load(path, allow_pickle=False) as data:
        missing = [key for key in keys if key not in data.files]
        if missing:
            raise BadInput(
                f"{path} has no {' or '.join(missing)} (keys: {sorted(data.files)}), so it is not an ADM "
                "reference batch; pass the VIRTUAL_*.npz file from openai/guided-diffusion's evaluations."
            )
        mu, sigma = data[keys[0]], data[keys[1]]
    num = npz_array_shape(path, "arr_0")[0] if "arr_0" in npz_keys(path) else 0
    return FeatureStats(mu=mu, sigma=sigma, num=num)


def reference_from_images(
    image_iter: Iterable[ArrayLike],
    extractor: Any,
    *,
    keep_features: int = ADM_REFERENCE_SIZE,
    seed: int = 0,
    spatial: bool = False,
    total: Optional[int] = None,
):
    """Reference statistics over every image yielded, and a random subset of their pool features for precision/recall.

    Returns ``(stats, kept)``, ``kept`` being ``keep_features`` rows drawn by reservoir sampling (the same for the
    same ``seed`` and order); with ``spatial=True``, ``(stats, kept, spatial_stats)`` for sFID.
    """
    pool_stats = spatial_stats = reservoir = None
    with Progress("reference features", total, unit="image") as progress:
        for images in image_iter:
            if spatial:
                pool, _, spatial_features = extractor.extract(images)
                spatial_features = as_float64(spatial_features)
                spatial_stats = spatial_stats or StatsAccumulator(spatial_features.shape[1])
                spatial_stats.update(spatial_features)
            else:
                pool, _ = extractor(images)
            pool = as_float64(pool)
            if pool_stats is None:
                pool_stats = StatsAccumulator(pool.shape[1])
                reservoir = FeatureReservoir(keep_features, pool.shape[1], seed=seed)
            pool_stats.update(pool)
            reservoir.update(pool)
            progress.advance(len(pool))
    if pool_stats is None:
        raise BadInput("reference_from_images got no images; check the dataset path and split.")
    if spatial:
        return pool_stats.result(), reservoir.result(), spatial_stats.result()
    return pool_stats.result(), reservoir.result()


def adm_reference_features(path: PathLike, extractor: Any, *, batch_size: Optional[int] = None) -> np.ndarray:
    """Pool features (float32) of the ``arr_0`` images of an ADM reference batch: ADM's precision/recall reference."""
    path = _adm_batch(path)
    batch_size = batch_size or getattr(extractor, "batch_size", 100)
    features = []
    with Progress("ADM reference features", npz_num_images(path), unit="image") as progress:
        for batch in iter_npz_images(path, batch_size):
            features.append(as_float64(extractor(torch.from_numpy(batch).permute(0, 3, 1, 2))[0]).astype(np.float32))
            progress.advance(len(batch))
    if not features:
        raise BadInput(f"{path} holds no images in arr_0; pass a reference batch with images.")
    return np.concatenate(features)


def write_reference(
    out_dir: PathLike,
    extractor: Any,
    *,
    adm_npz: Optional[PathLike],
    own: Optional[Callable[[], Tuple[FeatureStats, np.ndarray, Optional[FeatureStats], str]]],
    batch_size: int = 100,
) -> Dict[str, Any]:
    """Write the reference side of every FID into ``out_dir``; returns what goes into its ``meta.json``.

    With ``adm_npz`` (ADM's reference batch) its statistics are the reference (``stats.npz``,
    ``spatial_stats.npz``) and its images' pool features the precision/recall and KID reference
    (``features.npy``); ``own`` (a callable giving our own statistics, kept features, spatial
    statistics and a description) then adds ``own_stats.npz`` / ``own_spatial_stats.npz`` and the
    FID between the two references. Without ``adm_npz`` our own statistics are the reference.
    """
    out_dir = Path(out_dir)
    if adm_npz is not None:
        stats, spatial = load_adm_reference(adm_npz), load_adm_reference(adm_npz, spatial=True)
        features = adm_reference_features(adm_npz, extractor, batch_size=batch_size)
        info: Dict[str, Any] = {"reference": "adm", "source": f"ADM reference batch {adm_npz}"}
        extra = own() if own is not None else None
    else:
        stats, features, spatial, source = own()
        info, extra = {"reference": "own", "source": source}, None
    stats.save(out_dir / "stats.npz")
    if spatial is not None:
        spatial.save(out_dir / "spatial_stats.npz")
    np.save(out_dir / "features.npy", np.asarray(features, dtype=np.float32), allow_pickle=False)
    if extra is not None:  # both references: ours beside ADM's, and how far apart they are
        own_stats, _, own_spatial, own_source = extra
        own_stats.save(out_dir / "own_stats.npz")
        info.update(own_source=own_source, fid_between_references=frechet_distance(own_stats, stats))
        if own_spatial is not None and spatial is not None:
            own_spatial.save(out_dir / "own_spatial_stats.npz")
            info["sfid_between_references"] = frechet_distance(own_spatial, spatial)
    info.update(
        num_images=int(stats.num),
        num_features_kept=int(len(features)),
        feature_dim=int(stats.dim),
        sfid=spatial is not None,
    )
    return info


def load_reference_set(root: PathLike) -> Dict[str, Any]:
    """A reference directory (stage fid_reference's data/fid_reference) as ``evaluate_samples``' keyword arguments."""
    root = prepared(root, "fid_reference")  # every file as the stage wrote it

    def optional(name: str) -> Optional[FeatureStats]:
        return FeatureStats.load(root / name) if (root / name).is_file() else None

    return {
        "reference": FeatureStats.load(root / "stats.npz"),
        "reference_features": np.load(root / "features.npy", allow_pickle=False),
        "spatial_reference": optional("spatial_stats.npz"),
        "own_reference": optional("own_stats.npz"),
        "own_spatial_reference": optional("own_spatial_stats.npz"),
    }


def _adm_batch(path: PathLike) -> Path:
    path = Path(path)
    if not path.is_file():
        raise MissingInput(
            f"ADM reference batch not found at {path}; download VIRTUAL_imagenet256_labeled.npz "
            "from openai/guided-diffusion's evaluations README on a connected machine and put it there."
        )
    return path
