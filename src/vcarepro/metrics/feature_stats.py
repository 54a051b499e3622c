"""What a stream of feature batches is summarised into: mean and covariance, a random subset, the Frechet distance.

FID compares two :class:`FeatureStats` with :func:`frechet_distance`; :class:`StatsAccumulator`
builds them batch by batch, and :class:`FeatureReservoir` keeps the random subset of feature
rows that precision/recall and KID compare against. Both accumulators take (B, D) numpy
arrays or torch tensors, one feature vector per row.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import numpy as np
import torch
from torch_fidelity.metric_fid import KEY_METRIC_FID, fid_statistics_to_metric

from vcarepro.core.errors import BadInput, MissingInput
from vcarepro.core.io import write_npz

PathLike = Union[str, Path]
ArrayLike = Union[np.ndarray, torch.Tensor]


def as_float64(x: ArrayLike) -> np.ndarray:
    """A numpy float64 copy (or view) of features given as an array or a tensor on any device."""
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", torch.float64).numpy()
    return np.asarray(x, dtype=np.float64)


@dataclass
class FeatureStats:
    """Mean and covariance of a feature set: what FID compares, and what an ADM reference batch stores."""

    mu: np.ndarray  # (D,) float64
    sigma: np.ndarray  # (D, D) float64
    num: int  # how many feature vectors went in (0 where the source does not say)

    def __post_init__(self):
        self.mu = np.asarray(self.mu, dtype=np.float64)
        self.sigma = np.asarray(self.sigma, dtype=np.float64)
        self.num = int(self.num)
        if self.mu.ndim != 1 or self.sigma.shape != (self.mu.shape[0],) * 2:
            raise BadInput(
                f"FeatureStats needs mu of shape (D,) and sigma of shape (D, D), got {self.mu.shape} and "
                f"{self.sigma.shape}; pass the mean vector and the covariance matrix of one feature set."
            )

    @property
    def dim(self) -> int:
        return self.mu.shape[0]

    def leading(self, dims: Optional[int]) -> "FeatureStats":
        """The statistics of the first ``dims`` coordinates (all of them for None or more): a smaller FID space."""
        if dims is None or dims >= self.dim:
            return self
        return FeatureStats(self.mu[:dims], self.sigma[:dims, :dims], self.num)

    def save(self, path: PathLike) -> None:
        """Write ``mu``, ``sigma`` and ``num`` to an ``.npz`` at exactly ``path``, atomically (temp file, rename)."""
        # np.savez's format, the same bytes under every Python (io.write_npz), at exactly ``path``
        write_npz(path, {"mu": self.mu, "sigma": self.sigma, "num": np.int64(self.num)})

    @classmethod
    def load(cls, path: PathLike) -> "FeatureStats":
        """Read a file written by :meth:`save`."""
        path = Path(path)
        if not path.is_file():
            raise MissingInput(
                f"Feature statistics not found at {path}; run the stage that computes them "
                "(FeatureStats.save) or fix the path."
            )
        with np.load(path, allow_pickle=False) as data:
            missing = [key for key in ("mu", "sigma", "num") if key not in data.files]
            if missing:
                raise BadInput(
                    f"{path} lacks the keys {missing} of a FeatureStats file; pass a file written by FeatureStats.save."
                )
            return cls(mu=data["mu"], sigma=data["sigma"], num=int(data["num"]))


class StatsAccumulator:
    """Streaming mean and unbiased covariance (ddof=1, as ``np.cov``) of (B, D) feature batches, in float64.

    Sums are taken of features minus the first batch's mean: the covariance
    does not change under a shift, and centring first avoids the cancellation
    of ``E[xx^T] - mu mu^T`` when the mean is large against the spread.
    """

    def __init__(self, dim: int):
        self.dim = int(dim)
        self.num = 0
        self._shift: Optional[np.ndarray] = None
        self._sum = np.zeros(self.dim, dtype=np.float64)
        self._outer = np.zeros((self.dim, self.dim), dtype=np.float64)

    def update(self, features: ArrayLike) -> None:
        x = as_float64(features)
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise BadInput(
                f"StatsAccumulator({self.dim}) expects (B, {self.dim}) features, got {x.shape}; "
                "pass one feature vector per row."
            )
        if x.shape[0] == 0:
            return
        if self._shift is None:
            self._shift = x.mean(axis=0)
        x = x - self._shift
        self._sum += x.sum(axis=0)
        self._outer += x.T @ x
        self.num += x.shape[0]

    def result(self) -> FeatureStats:
        if self.num < 2:
            raise BadInput(f"A covariance needs at least 2 feature vectors, got {self.num}; feed more images.")
        centred_mean = self._sum / self.num
        sigma = (self._outer - self.num * np.outer(centred_mean, centred_mean)) / (self.num - 1)
        sigma = (sigma + sigma.T) / 2  # exact symmetry, which rounding in the sums does not guarantee
        return FeatureStats(mu=centred_mean + self._shift, sigma=sigma, num=self.num)


class FeatureReservoir:
    """A uniformly random subset of at most ``capacity`` rows from a stream of (B, D) batches (reservoir sampling).

    Algorithm R: row ``t`` (0-based, over the whole stream) is kept outright
    while ``t < capacity``, later it replaces a uniformly drawn slot with
    probability ``capacity / (t + 1)``. One random draw per row past the
    first ``capacity``, in stream order, so the subset depends on ``seed`` and
    the rows' order only, not on how the stream is cut into batches.
    """

    def __init__(self, capacity: int, dim: int, *, seed: int = 0, dtype=np.float32):
        if capacity < 1:
            raise BadInput(f"FeatureReservoir needs capacity >= 1, got {capacity}; keep at least one feature vector.")
        self.capacity = int(capacity)
        self.seen = 0
        self._rows = np.empty((self.capacity, int(dim)), dtype=dtype)
        self._rng = np.random.Generator(np.random.PCG64(seed))

    def update(self, features: ArrayLike) -> None:
        x = as_float64(features) if isinstance(features, torch.Tensor) else np.asarray(features)
        if x.ndim != 2 or x.shape[1] != self._rows.shape[1]:
            raise BadInput(
                f"FeatureReservoir expects (B, {self._rows.shape[1]}) features, got {x.shape}; "
                "pass one feature vector per row."
            )
        filling = max(0, min(self.capacity - self.seen, x.shape[0]))
        self._rows[self.seen : self.seen + filling] = x[:filling]
        for offset in range(filling, x.shape[0]):
            slot = self._rng.integers(0, self.seen + offset + 1)
            if slot < self.capacity:
                self._rows[slot] = x[offset]
        self.seen += x.shape[0]

    def result(self) -> np.ndarray:
        return self._rows[: min(self.seen, self.capacity)].copy()


def frechet_distance(a: FeatureStats, b: FeatureStats) -> float:
    """FID between two Gaussians, by torch-fidelity's ``fid_statistics_to_metric``.

    torch-fidelity takes the trace of sqrt(sigma_a sigma_b) from the
    eigenvalues of the product; ADM uses ``scipy.linalg.sqrtm``. The two agree
    to rounding for the positive semi-definite covariances FID deals with.
    """
    if a.dim != b.dim:
        raise BadInput(
            f"Cannot compare {a.dim}-d with {b.dim}-d feature statistics; compute both with the same "
            "feature extractor and layer."
        )
    stats = [{"mu": s.mu.astype(np.float64), "sigma": s.sigma.astype(np.float64)} for s in (a, b)]
    return float(fid_statistics_to_metric(stats[0], stats[1], verbose=False)[KEY_METRIC_FID])
