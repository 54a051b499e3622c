"""Improved precision and recall of generated against real features, as ADM's evaluator computes them.

The pairwise distances are float16 by default, as ADM's ``DistanceBlock`` computes them; see
:func:`precision_recall`.
"""

from __future__ import annotations

from typing import Tuple, Union

import numpy as np
import torch

from vcarepro.core.errors import BadInput

ArrayLike = Union[np.ndarray, torch.Tensor]
PR_NEIGHBOURHOOD = 3  # ADM's ManifoldEstimator(nhood_sizes=(3,))
DISTANCE_DTYPES = {"float16": torch.float16, "float32": torch.float32, "float64": torch.float64}


def precision_recall(
    real_feats: ArrayLike,
    fake_feats: ArrayLike,
    k: int = PR_NEIGHBOURHOOD,
    batch_size: int = 10000,
    *,
    device: Union[str, torch.device] = "cpu",
    distance_dtype: str = "float16",
) -> Tuple[float, float]:
    """Improved precision and recall (Kynkaanniemi et al., 2019) as ADM's ``ManifoldEstimator`` computes them.

    A point's radius is the distance to its ``k``-th nearest neighbour in its own set; precision is the fraction of
    fake points within the radius of any real point, recall the converse. Distances go in ``batch_size`` blocks.
    ``distance_dtype="float16"`` is ADM's ``DistanceBlock``: float16 squared distances, recomputed in float32
    where a block is not finite. Hand-written because torch-fidelity's ``prc`` uses VGG16 features, not Inception.
    """
    if distance_dtype not in DISTANCE_DTYPES:
        raise BadInput(f"distance_dtype={distance_dtype!r} is unknown; use one of {', '.join(DISTANCE_DTYPES)}.")
    work = torch.float64 if distance_dtype == "float64" else torch.float32
    real = _as_tensor(real_feats, device, work)
    fake = _as_tensor(fake_feats, device, work)
    if real.dim() != 2 or fake.dim() != 2 or real.shape[1] != fake.shape[1]:
        raise BadInput(
            f"precision_recall needs two (N, D) feature sets of one D, got {tuple(real.shape)} and "
            f"{tuple(fake.shape)}; extract both with the same network and layer."
        )
    if min(real.shape[0], fake.shape[0]) <= k:
        raise BadInput(
            f"precision_recall with k={k} needs more than {k} points per set, got {real.shape[0]} real "
            f"and {fake.shape[0]} fake; pass more samples or lower k."
        )
    if batch_size < 1:
        raise BadInput(f"batch_size must be >= 1, got {batch_size}; pass a positive block size.")
    distances = _DistanceBlock(DISTANCE_DTYPES[distance_dtype], work)
    real_radii = _kth_neighbour_sq_radii(real, k, batch_size, distances)
    fake_radii = _kth_neighbour_sq_radii(fake, k, batch_size, distances)
    precision = _fraction_inside(fake, real, real_radii, batch_size, distances)
    recall = _fraction_inside(real, fake, fake_radii, batch_size, distances)
    return precision, recall


class _DistanceBlock:
    """Squared pairwise distances of two row blocks, computed in ``compute`` and returned in ``work`` dtype."""

    def __init__(self, compute: torch.dtype, work: torch.dtype):
        self.compute, self.work = compute, work

    @staticmethod
    def _squared(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        # squared, as ADM's _batch_pairwise_distances: comparing squared distances with squared radii decides the same
        a_sq, b_sq = (a * a).sum(dim=1), (b * b).sum(dim=1)
        return (a_sq[:, None] - 2 * a @ b.T + b_sq[None, :]).clamp_min(0)

    def __call__(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if self.compute == self.work:
            return self._squared(a, b)
        block = self._squared(a.to(self.compute), b.to(self.compute))
        if not torch.isfinite(block).all():  # ADM: tf.cond(all finite, float16 block, float32 block)
            return self._squared(a, b)
        return block.to(self.work)


def _kth_neighbour_sq_radii(points: torch.Tensor, k: int, batch_size: int, distances: _DistanceBlock) -> torch.Tensor:
    radii = torch.empty(points.shape[0], dtype=points.dtype, device=points.device)
    for row in range(0, points.shape[0], batch_size):
        rows = slice(row, row + batch_size)
        nearest = None  # the k + 1 smallest distances so far, self included (at or near 0), ascending
        for col in range(0, points.shape[0], batch_size):
            block = distances(points[rows], points[col : col + batch_size])
            candidates = block if nearest is None else torch.cat([nearest, block], dim=1)
            nearest = candidates.topk(min(k + 1, candidates.shape[1]), dim=1, largest=False).values
        radii[rows] = nearest[:, k]  # ADM: index k of the sorted row, index 0 being the point itself
    return radii


def _fraction_inside(
    queries: torch.Tensor, manifold: torch.Tensor, sq_radii: torch.Tensor, batch_size: int, distances: _DistanceBlock
) -> float:
    inside = torch.zeros(queries.shape[0], dtype=torch.bool, device=queries.device)
    for row in range(0, queries.shape[0], batch_size):
        rows = slice(row, row + batch_size)
        for col in range(0, manifold.shape[0], batch_size):
            cols = slice(col, col + batch_size)
            inside[rows] |= (distances(queries[rows], manifold[cols]) <= sq_radii[cols][None, :]).any(dim=1)
    return float(inside.double().mean())


def _as_tensor(x: ArrayLike, device, dtype) -> torch.Tensor:
    tensor = x if isinstance(x, torch.Tensor) else torch.from_numpy(np.asarray(x))
    return tensor.detach().to(device=device, dtype=dtype)
