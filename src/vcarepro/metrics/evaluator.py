"""FID-50K, sFID, Inception Score, precision/recall and KID of a sample file, as ADM's evaluator computes them.

DiT and SiT report guided-diffusion's ``evaluations/evaluator.py``; :func:`evaluate_samples` reproduces it
without TensorFlow, one concept per module of :mod:`vcarepro.metrics` (docs/paper-scale.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Optional, Union

import numpy as np
import torch

from vcarepro.core.errors import BadInput
from vcarepro.core.progress import Progress
from vcarepro.metrics.feature_stats import FeatureStats, PathLike, StatsAccumulator, as_float64, frechet_distance
from vcarepro.metrics.inception_score import inception_score
from vcarepro.metrics.kid import kernel_inception_distance
from vcarepro.metrics.npz_images import iter_npz_images, npz_num_images
from vcarepro.metrics.precision_recall import PR_NEIGHBOURHOOD, precision_recall


def evaluate_samples(
    npz_path: PathLike,
    reference: FeatureStats,
    extractor: Any,
    *,
    reference_features: Optional[np.ndarray] = None,
    spatial_reference: Optional[FeatureStats] = None,
    own_reference: Optional[FeatureStats] = None,
    own_spatial_reference: Optional[FeatureStats] = None,
    feature_dims: Optional[int] = None,
    min_samples: Optional[int] = None,
    split_size: int = 5000,
    batch_size: Optional[int] = None,
    prc_k: int = PR_NEIGHBOURHOOD,
    prc_distance_dtype: str = "float16",
    kid_subsets: int = 100,
    kid_subset_size: int = 1000,
    seed: int = 0,
) -> Dict[str, Union[float, int]]:
    """ADM's evaluation of a sample ``.npz`` (``arr_0``: uint8 N x H x W x 3), streamed through ``extractor``.

    ``extractor(images)`` maps uint8 (B, 3, H, W) to (pool features, logits). Returns ``fid``, ``inception_score``
    (``_std``), ``num_samples``; with ``reference_features`` also precision/recall and ``kid_mean``/``kid_std``;
    ``sfid`` with ``spatial_reference``; ``fid_own``/``sfid_own`` with ``own_reference``. ``feature_dims`` keeps
    FID's first coordinates only, so few samples still give a full-rank covariance (the smoke scale).
    """
    npz_path = Path(npz_path)
    num_samples = npz_num_images(npz_path)
    full_dim = reference.dim
    reference, own_reference = reference.leading(feature_dims), own_reference and own_reference.leading(feature_dims)
    if spatial_reference is not None:
        spatial_reference = spatial_reference.leading(feature_dims)
        own_spatial_reference = own_spatial_reference and own_spatial_reference.leading(feature_dims)
    min_samples = reference.dim + 1 if min_samples is None else min_samples
    if num_samples < min_samples:
        fix = (
            "raise sampling.num_samples"
            if feature_dims is None or feature_dims >= full_dim
            else "raise sampling.num_samples or lower eval_gen.feature_dims"
        )
        raise BadInput(
            f"FID over {reference.dim} feature dimensions needs at least {min_samples} samples, but "
            f"{npz_path} holds {num_samples}; {fix}."
        )
    if spatial_reference is not None and not hasattr(extractor, "extract"):
        raise BadInput(
            f"sFID needs an extractor with .extract() (InceptionFeatures), got "
            f"{type(extractor).__name__}; pass InceptionFeatures or drop spatial_reference."
        )
    batch_size = batch_size or getattr(extractor, "batch_size", 100)

    dims = (full_dim, reference.dim, spatial_reference.dim if spatial_reference is not None else None)
    samples_stats, samples_spatial, logits, kept_pool = _features(
        npz_path, extractor, num_samples, dims, batch_size, keep=reference_features is not None, seed=seed
    )
    inception_mean, inception_std = inception_score(logits, split_size=split_size)
    result: Dict[str, Union[float, int]] = {
        "fid": frechet_distance(samples_stats, reference),
        "inception_score": inception_mean,
        "inception_score_std": inception_std,
    }
    if own_reference is not None:
        result["fid_own"] = frechet_distance(samples_stats, own_reference)
    if samples_spatial is not None:
        result["sfid"] = frechet_distance(samples_spatial, spatial_reference)
        if own_spatial_reference is not None:
            result["sfid_own"] = frechet_distance(samples_spatial, own_spatial_reference)
    if reference_features is not None:
        device = getattr(extractor, "device", "cpu")
        fake_features = np.concatenate(kept_pool)
        result["precision"], result["recall"] = precision_recall(
            reference_features, fake_features, k=prc_k, device=device, distance_dtype=prc_distance_dtype
        )
        result["kid_mean"], result["kid_std"] = kernel_inception_distance(
            reference_features, fake_features, subsets=kid_subsets, subset_size=kid_subset_size, seed=seed
        )
    result["num_samples"] = num_samples
    result["fid_feature_dims"] = reference.dim
    return result


def _features(npz_path: Path, extractor: Any, num_samples: int, dims, batch_size: int, *, keep: bool, seed: int):
    """Every sample through ``extractor``, streamed: the statistics of the pool features' first ``dims[1]`` and of
    the spatial features' first ``dims[2]`` coordinates (None: no sFID), the logits, and the pool features themselves
    where ``keep`` (precision, recall and KID need them). ``dims[0]``: the width the reference was computed at."""
    full_dim, dim, spatial_dim = dims
    pool_stats = StatsAccumulator(dim)
    spatial_stats = StatsAccumulator(spatial_dim) if spatial_dim is not None else None
    logits, kept_pool = [], []
    with Progress("features", num_samples, unit="image", seed=seed) as progress:
        for batch in iter_npz_images(npz_path, batch_size):
            images = torch.from_numpy(batch).permute(0, 3, 1, 2)
            if spatial_stats is not None:
                pool, logit, spatial = extractor.extract(images)
                spatial_stats.update(as_float64(spatial)[:, :spatial_dim])
            else:
                pool, logit = extractor(images)
            pool = as_float64(pool)
            if pool.shape[1] != full_dim:
                raise BadInput(
                    f"The extractor gives {pool.shape[1]}-d features but the reference statistics are "
                    f"{full_dim}-d; compute both with the same extractor."
                )
            pool_stats.update(pool[:, :dim])
            logits.append(np.asarray(logit.cpu() if isinstance(logit, torch.Tensor) else logit, dtype=np.float32))
            if keep:
                kept_pool.append(pool.astype(np.float32))
            progress.advance(len(batch))
    spatial = spatial_stats.result() if spatial_stats is not None else None
    return pool_stats.result(), spatial, np.concatenate(logits), kept_pool


def evaluator_options(eval_gen: Dict[str, Any]) -> Dict[str, Any]:
    """The params section ``eval_gen`` as ``evaluate_samples``' keyword arguments."""
    return {
        "feature_dims": eval_gen["feature_dims"],
        "split_size": eval_gen["isc_split_size"],
        "prc_k": eval_gen["prc_k"],
        "prc_distance_dtype": eval_gen["prc_distance_dtype"],
        "kid_subsets": eval_gen["kid_subsets"],
        "kid_subset_size": eval_gen["kid_subset_size"],
    }
