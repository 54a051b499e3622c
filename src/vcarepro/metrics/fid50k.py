"""FID-50K, sFID, Inception Score and precision/recall as ADM's evaluator computes them, without TensorFlow.

DiT and SiT report ImageNet 256x256 numbers from OpenAI's guided-diffusion
``evaluations/evaluator.py`` ("the ADM evaluator"): 50,000 samples in an
``.npz`` (``arr_0``: uint8 N x 256 x 256 x 3) against a reference batch
(``VIRTUAL_imagenet256_labeled.npz``: 10,000 images and the precomputed
statistics ``mu``/``sigma`` of the whole training set's pool features and
``mu_s``/``sigma_s`` of its spatial features). This module reproduces that
evaluation on torch-fidelity's ``inception-v3-compat`` network, a port of the
same 2015 TF Inception graph with TF1-compatible resizing to 299 px:

* FID: Frechet distance of 2048-d ``pool_3`` features, computed by
  torch-fidelity's :func:`~torch_fidelity.metric_fid.fid_statistics_to_metric`.
* sFID: Frechet distance of ADM's spatial features, the first 7 channels of
  the TF graph's ``mixed_6/conv`` (17 x 17 x 7 = 2023 dims). torch-fidelity does
  not list that layer among its named features, but its network contains it:
  torch-fidelity's weight converter (``utils/util_convert_inception_weights.py``)
  maps the TF scope ``mixed_6/conv`` (conv2d_params + batchnorm) onto
  ``Mixed_6d.branch1x1``, a conv-BN-ReLU unit whose output is the tensor ADM
  reads. :class:`InceptionFeatures` captures that module's output with a
  forward hook, keeps channels 0..6 and flattens them in TF's NHWC order, so
  the features line up element for element with ADM's ``mu_s``/``sigma_s``.
  Not checked here against the real weights (they are not on this machine):
  the first run with them should compare :func:`load_adm_reference` (spatial)
  with statistics from :func:`reference_from_images` on the same images.
* Inception Score: ADM's ``compute_inception_score``, hand-written (torch-fidelity's
  ``isc_features_to_metric`` cuts N samples into a number of equal chunks; ADM cuts
  them, in order, into consecutive splits of ``split_size`` = 5,000, the last one
  possibly shorter), over the softmax of the unbiased logits (pool features times
  the final layer's weights, no bias: what ADM's ``softmax/logits/MatMul`` graph
  computes too).
* Precision/recall: hand-written, see :func:`precision_recall`; its pairwise
  distances are float16 by default, as ADM's ``DistanceBlock`` computes them.
"""
from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, NamedTuple, Optional, Tuple, Union

import numpy as np
import torch
from numpy.lib import format as npy_format
from torch_fidelity.metric_fid import KEY_METRIC_FID, fid_statistics_to_metric
from torch_fidelity.metric_kid import KEY_METRIC_KID_MEAN, KEY_METRIC_KID_STD, kid_features_to_metric
from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3

from vcarepro.metrics.digit_features import INCEPTION_EXTRACTOR, INCEPTION_FEATURE_DIM, INCEPTION_WEIGHTS_FILENAME, \
    default_inception_weights_path
from vcarepro.core.errors import BadInput, MissingInput
from vcarepro.core.integrity import prepared
from vcarepro.core.io import write_npz
from vcarepro.core.progress import Progress

PathLike = Union[str, Path]
ArrayLike = Union[np.ndarray, torch.Tensor]

INCEPTION_NUM_LOGITS = 1008  # the 2015 graph's softmax has 1008 outputs (1000 classes and 8 unused)
SPATIAL_CHANNELS = 7  # ADM: spatial = mixed_6/conv[..., :7]
SPATIAL_GRID = 17  # mixed_6 works at 17 x 17 for a 299 px input
SPATIAL_FEATURE_DIM = SPATIAL_CHANNELS * SPATIAL_GRID * SPATIAL_GRID  # 2023
SPATIAL_MODULE = "Mixed_6d.branch1x1"  # torch-fidelity's name for TF's mixed_6/conv
PR_NEIGHBOURHOOD = 3  # ADM's ManifoldEstimator(nhood_sizes=(3,))
ADM_REFERENCE_SIZE = 10_000  # images in ADM's reference batches, used for precision/recall


# --------------------------------------------------------------------------- statistics


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
            raise BadInput(f"FeatureStats needs mu of shape (D,) and sigma of shape (D, D), got {self.mu.shape} and "
                             f"{self.sigma.shape}; pass the mean vector and the covariance matrix of one feature set.")

    @property
    def dim(self) -> int:
        return self.mu.shape[0]

    def leading(self, dims: Optional[int]) -> "FeatureStats":
        """The statistics of the first ``dims`` coordinates (all of them for None or more): a smaller FID space."""
        if dims is None or dims >= self.dim:
            return self
        return FeatureStats(self.mu[:dims], self.sigma[:dims, :dims], self.num)

    def save(self, path: PathLike) -> None:
        """Write ``mu``, ``sigma`` and ``num`` to an ``.npz`` at exactly ``path``, atomically (temp file, then rename)."""
        # np.savez's format, the same bytes under every Python (io.write_npz), at exactly ``path``
        write_npz(path, {"mu": self.mu, "sigma": self.sigma, "num": np.int64(self.num)})

    @classmethod
    def load(cls, path: PathLike) -> "FeatureStats":
        """Read a file written by :meth:`save`."""
        path = Path(path)
        if not path.is_file():
            raise MissingInput(f"Feature statistics not found at {path}; run the stage that computes them "
                                    "(FeatureStats.save) or fix the path.")
        with np.load(path, allow_pickle=False) as data:
            missing = [key for key in ("mu", "sigma", "num") if key not in data.files]
            if missing:
                raise BadInput(f"{path} lacks the keys {missing} of a FeatureStats file; pass a file written by "
                                 "FeatureStats.save.")
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
        x = _as_float64(features)
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise BadInput(f"StatsAccumulator({self.dim}) expects (B, {self.dim}) features, got {x.shape}; "
                             "pass one feature vector per row.")
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
        x = _as_float64(features) if isinstance(features, torch.Tensor) else np.asarray(features)
        if x.ndim != 2 or x.shape[1] != self._rows.shape[1]:
            raise BadInput(f"FeatureReservoir expects (B, {self._rows.shape[1]}) features, got {x.shape}; "
                             "pass one feature vector per row.")
        filling = max(0, min(self.capacity - self.seen, x.shape[0]))
        self._rows[self.seen:self.seen + filling] = x[:filling]
        for offset in range(filling, x.shape[0]):
            slot = self._rng.integers(0, self.seen + offset + 1)
            if slot < self.capacity:
                self._rows[slot] = x[offset]
        self.seen += x.shape[0]

    def result(self) -> np.ndarray:
        return self._rows[:min(self.seen, self.capacity)].copy()


def load_adm_reference(path: PathLike, *, spatial: bool = False) -> FeatureStats:
    """Statistics of an ADM reference batch ``.npz``: ``mu``/``sigma`` (pool, FID), or ``mu_s``/``sigma_s`` if ``spatial``.

    ``num`` is the number of images in its ``arr_0`` (read from the array
    header, the images stay on disk), or 0 if it has none; the statistics
    themselves were computed by OpenAI over the whole training set.
    """
    path = Path(path)
    if not path.is_file():
        raise MissingInput(f"ADM reference batch not found at {path}; download VIRTUAL_imagenet256_labeled.npz "
                                "from openai/guided-diffusion's evaluations README on a connected machine and put it there.")
    keys = ("mu_s", "sigma_s") if spatial else ("mu", "sigma")
    with np.load(path, allow_pickle=False) as data:
        missing = [key for key in keys if key not in data.files]
        if missing:
            raise BadInput(f"{path} has no {' or '.join(missing)} (keys: {sorted(data.files)}), so it is not an ADM "
                             "reference batch; pass the VIRTUAL_*.npz file from openai/guided-diffusion's evaluations.")
        mu, sigma = data[keys[0]], data[keys[1]]
    num = _npz_array_shape(path, "arr_0")[0] if "arr_0" in _npz_keys(path) else 0
    return FeatureStats(mu=mu, sigma=sigma, num=num)


def frechet_distance(a: FeatureStats, b: FeatureStats) -> float:
    """FID between two Gaussians, by torch-fidelity's ``fid_statistics_to_metric``.

    torch-fidelity takes the trace of sqrt(sigma_a sigma_b) from the
    eigenvalues of the product; ADM uses ``scipy.linalg.sqrtm``. The two agree
    to rounding for the positive semi-definite covariances FID deals with.
    """
    if a.dim != b.dim:
        raise BadInput(f"Cannot compare {a.dim}-d with {b.dim}-d feature statistics; compute both with the same "
                         "feature extractor and layer.")
    stats = [{"mu": s.mu.astype(np.float64), "sigma": s.sigma.astype(np.float64)} for s in (a, b)]
    return float(fid_statistics_to_metric(stats[0], stats[1], verbose=False)[KEY_METRIC_FID])


# --------------------------------------------------------------------------- Inception


class InceptionOutputs(NamedTuple):
    pool: np.ndarray  # (B, 2048) float64, pool_3
    logits: np.ndarray  # (B, 1008) float32, unbiased logits
    spatial: np.ndarray  # (B, 2023) float64, mixed_6/conv[..., :7] flattened in NHWC order


class InceptionFeatures:
    """torch-fidelity's ``inception-v3-compat`` network from a local weights file, as ADM's evaluator uses it.

    ``weights_path``: torch-fidelity's ``weights-inception-2015-12-05-6726825d.pth``;
    None looks in torch hub's checkpoint directory. Nothing is ever
    downloaded. Calling it on uint8 (B, 3, H, W) images returns
    ``(pool (B, 2048) float64, logits_unbiased (B, 1008) float32)``; the
    network resizes to 299 px itself, the TF1 way. :meth:`extract` also
    returns ADM's sFID features.
    """

    feature_dim = INCEPTION_FEATURE_DIM
    num_logits = INCEPTION_NUM_LOGITS
    spatial_dim = SPATIAL_FEATURE_DIM

    def __init__(self, weights_path: Optional[PathLike] = None, device: Union[str, torch.device] = "cpu",
                 batch_size: int = 100):
        path = Path(weights_path) if weights_path is not None else default_inception_weights_path()
        if not path.is_file():
            raise MissingInput(f"Inception weights not found at {path}; copy {INCEPTION_WEIGHTS_FILENAME} (from "
                                    "torch-fidelity's v0.2.0 GitHub release) there or pass its path as weights_path.")
        if batch_size < 1:
            raise BadInput(f"batch_size must be >= 1, got {batch_size}; pass a positive number of images per pass.")
        self.weights_path = path
        self.device = torch.device(device)
        self.batch_size = int(batch_size)
        # built as torch-fidelity's create_feature_extractor builds it, minus its hard-wired .cuda()
        self.network = FeatureExtractorInceptionV3(INCEPTION_EXTRACTOR, ["2048", "logits_unbiased"],
                                                   feature_extractor_weights_path=str(path))
        self.network.requires_grad_(False).eval().to(self.device)
        self._spatial: Optional[torch.Tensor] = None
        self.network.get_submodule(SPATIAL_MODULE).register_forward_hook(self._keep_spatial)

    def _keep_spatial(self, module, inputs, output: torch.Tensor) -> None:
        # TF's [..., :7] on NHWC, flattened as ADM does (reshape([N, -1]) on NHWC): H, W, then channel
        self._spatial = output[:, :SPATIAL_CHANNELS].permute(0, 2, 3, 1).reshape(output.shape[0], -1)

    @torch.inference_mode()
    def extract(self, images_uint8: ArrayLike) -> InceptionOutputs:
        """Pool features, unbiased logits and spatial (sFID) features of uint8 (B, 3, H, W) images."""
        images = torch.as_tensor(images_uint8)
        if images.dtype != torch.uint8 or images.dim() != 4 or images.shape[1] != 3:
            raise BadInput(f"InceptionFeatures expects uint8 (B, 3, H, W) images, got {images.dtype} "
                             f"{tuple(images.shape)}; convert NHWC arrays with .permute(0, 3, 1, 2).")
        pools, logits, spatials = [], [], []
        for start in range(0, images.shape[0], self.batch_size):
            batch = images[start:start + self.batch_size].to(self.device, non_blocking=True).contiguous()
            self._spatial = None
            pool, logit = self.network(batch)
            if self._spatial is None:
                raise RuntimeError(f"The forward hook on {SPATIAL_MODULE} did not fire; torch-fidelity's Inception "
                                   "has changed layout, pin torch-fidelity 0.4 or update SPATIAL_MODULE.")
            pools.append(pool.double().cpu().numpy())
            logits.append(logit.float().cpu().numpy())
            spatials.append(self._spatial.double().cpu().numpy())
            self._spatial = None
        if not pools:
            return InceptionOutputs(np.zeros((0, self.feature_dim)), np.zeros((0, self.num_logits), np.float32),
                                    np.zeros((0, self.spatial_dim)))
        return InceptionOutputs(np.concatenate(pools), np.concatenate(logits), np.concatenate(spatials))

    def __call__(self, images_uint8: ArrayLike) -> Tuple[np.ndarray, np.ndarray]:
        outputs = self.extract(images_uint8)
        return outputs.pool, outputs.logits


# --------------------------------------------------------------------------- IS and precision/recall


def inception_score(logits: ArrayLike, split_size: int = 5000) -> Tuple[float, float]:
    """Inception Score as ADM's evaluator computes it: (mean over splits, std over splits).

    The softmax of the logits is cut, in order, into consecutive splits of ``split_size``
    samples (50,000 samples: ten splits of 5,000); each split scores exp(mean KL(p(y|x) ||
    p(y))) with p(y) the split's mean prediction. ADM prints the mean; the std is ours.
    """
    values = logits.detach().cpu().numpy() if isinstance(logits, torch.Tensor) else np.asarray(logits)
    values = values.astype(np.float64)
    if values.ndim != 2 or values.shape[0] < 1 or split_size < 1:
        raise BadInput(f"inception_score needs (N, classes) logits with N >= 1 and split_size >= 1, got "
                         f"{values.shape} and split_size={split_size}; pass the samples' logits.")
    values = values - values.max(axis=1, keepdims=True)
    probs = np.exp(values)
    probs /= probs.sum(axis=1, keepdims=True)
    scores = []
    for start in range(0, len(probs), split_size):
        part = probs[start:start + split_size]
        kl = part * (np.log(part) - np.log(part.mean(axis=0, keepdims=True)))
        scores.append(float(np.exp(kl.sum(axis=1).mean())))
    return float(np.mean(scores)), float(np.std(scores))


DISTANCE_DTYPES = {"float16": torch.float16, "float32": torch.float32, "float64": torch.float64}


def precision_recall(real_feats: ArrayLike, fake_feats: ArrayLike, k: int = PR_NEIGHBOURHOOD, batch_size: int = 10000,
                     *, device: Union[str, torch.device] = "cpu", distance_dtype: str = "float16") -> Tuple[float, float]:
    """Improved precision and recall (Kynkaanniemi et al., 2019) as ADM's ``ManifoldEstimator`` computes them.

    Each set spans a manifold: the union of balls around its points, the
    radius of a point being the distance to its ``k``-th nearest neighbour
    within the set (itself excluded). Precision is the fraction of fake
    points inside the real manifold (within the radius of ANY real point),
    recall the fraction of real points inside the fake manifold. Distances
    are computed in ``batch_size`` x ``batch_size`` blocks, so 50K x 10K never
    needs a 50K x 50K matrix.

    ``distance_dtype``: ``float16`` does what ADM's ``DistanceBlock`` does: squared
    distances of the features cast to float16, used (as float32) where the whole block
    is finite and recomputed in float32 where it is not; radii and comparisons are
    float32. ``float32`` / ``float64`` compute everything in that dtype.

    Hand-written because torch-fidelity's ``prc`` runs on VGG16 features
    (weights that download), while the DiT/SiT numbers use Inception pool
    features, as here.
    """
    if distance_dtype not in DISTANCE_DTYPES:
        raise BadInput(f"distance_dtype={distance_dtype!r} is unknown; use one of {', '.join(DISTANCE_DTYPES)}.")
    work = torch.float64 if distance_dtype == "float64" else torch.float32
    real = _as_tensor(real_feats, device, work)
    fake = _as_tensor(fake_feats, device, work)
    if real.dim() != 2 or fake.dim() != 2 or real.shape[1] != fake.shape[1]:
        raise BadInput(f"precision_recall needs two (N, D) feature sets of one D, got {tuple(real.shape)} and "
                         f"{tuple(fake.shape)}; extract both with the same network and layer.")
    if min(real.shape[0], fake.shape[0]) <= k:
        raise BadInput(f"precision_recall with k={k} needs more than {k} points per set, got {real.shape[0]} real "
                         f"and {fake.shape[0]} fake; pass more samples or lower k.")
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
            block = distances(points[rows], points[col:col + batch_size])
            candidates = block if nearest is None else torch.cat([nearest, block], dim=1)
            nearest = candidates.topk(min(k + 1, candidates.shape[1]), dim=1, largest=False).values
        radii[rows] = nearest[:, k]  # ADM: index k of the sorted row, index 0 being the point itself
    return radii


def _fraction_inside(queries: torch.Tensor, manifold: torch.Tensor, sq_radii: torch.Tensor, batch_size: int,
                     distances: _DistanceBlock) -> float:
    inside = torch.zeros(queries.shape[0], dtype=torch.bool, device=queries.device)
    for row in range(0, queries.shape[0], batch_size):
        rows = slice(row, row + batch_size)
        for col in range(0, manifold.shape[0], batch_size):
            cols = slice(col, col + batch_size)
            inside[rows] |= (distances(queries[rows], manifold[cols]) <= sq_radii[cols][None, :]).any(dim=1)
    return float(inside.double().mean())


# --------------------------------------------------------------------------- sample files


def iter_npz_images(path: PathLike, batch_size: int, *, key: str = "arr_0") -> Iterator[np.ndarray]:
    """Yield uint8 (B, H, W, 3) batches of an ADM-format ``.npz`` (or ``.npy``) without loading the whole array.

    ``np.load``'s ``mmap_mode`` does not apply inside an ``.npz`` (a zip), so
    the member is streamed: its header is parsed, then ``batch_size`` rows are
    read at a time. Works for ``np.savez`` and ``np.savez_compressed`` files.
    A ``.npy`` file is memory-mapped.
    """
    path = Path(path)
    _require_file(path)
    if batch_size < 1:
        raise BadInput(f"batch_size must be >= 1, got {batch_size}; pass a positive number of images per batch.")
    if path.suffix == ".npy":
        array = np.load(path, mmap_mode="r", allow_pickle=False)
        _check_image_array(path, array.shape, array.dtype)
        for start in range(0, array.shape[0], batch_size):
            yield np.ascontiguousarray(array[start:start + batch_size])
        return
    with zipfile.ZipFile(path) as archive:
        member = _npz_member(archive, path, key)
        with archive.open(member) as stream:
            shape, fortran_order, dtype = _read_npy_header(stream)
            _check_image_array(path, shape, dtype)
            if fortran_order:
                raise BadInput(f"{path}:{key} is stored in Fortran order, which cannot be streamed by rows; "
                                 "re-save it with np.savez(np.ascontiguousarray(images)).")
            row_bytes = int(np.prod(shape[1:])) * dtype.itemsize
            for start in range(0, shape[0], batch_size):
                count = min(batch_size, shape[0] - start)
                batch = np.empty((count,) + tuple(shape[1:]), dtype=dtype)
                if _read_into(stream, memoryview(batch).cast("B")) != count * row_bytes:
                    raise BadInput(f"{path}:{key} ends after {start} of {shape[0]} images; the file is truncated, "
                                     "write it again.")
                yield batch


def npz_num_images(path: PathLike, *, key: str = "arr_0") -> int:
    """Number of images in an ADM-format sample file, read from its header only."""
    path = Path(path)
    _require_file(path)
    if path.suffix == ".npy":
        shape = np.load(path, mmap_mode="r", allow_pickle=False).shape
    else:
        shape = _npz_array_shape(path, key)
    return int(shape[0]) if shape else 0


def evaluate_samples(npz_path: PathLike, reference: FeatureStats, extractor: Any, *,
                     reference_features: Optional[np.ndarray] = None,
                     spatial_reference: Optional[FeatureStats] = None,
                     own_reference: Optional[FeatureStats] = None,
                     own_spatial_reference: Optional[FeatureStats] = None,
                     feature_dims: Optional[int] = None, min_samples: Optional[int] = None, split_size: int = 5000,
                     batch_size: Optional[int] = None, prc_k: int = PR_NEIGHBOURHOOD,
                     prc_distance_dtype: str = "float16", kid_subsets: int = 100,
                     kid_subset_size: int = 1000, seed: int = 0) -> Dict[str, Union[float, int]]:
    """ADM's evaluation of a sample ``.npz`` (``arr_0``: uint8 N x H x W x 3), streamed through ``extractor``.

    Returns ``fid``, ``inception_score``, ``inception_score_std`` and
    ``num_samples``; ``precision`` and ``recall`` when ``reference_features``
    (the reference images' pool features, ADM: its 10,000-image batch) are
    given, with ``kid_mean`` / ``kid_std`` (torch-fidelity's KID over ``kid_subsets`` random
    subsets of ``min(kid_subset_size, both set sizes)``, drawn with ``seed``); ``sfid`` when
    ``spatial_reference`` is (then ``extractor`` must have
    :meth:`InceptionFeatures.extract`); ``fid_own`` (and ``sfid_own``) against a second
    reference, our own statistics of the training images, when ``own_reference`` is given.
    ``extractor(images)`` gets uint8 (B, 3, H, W) tensors and returns (pool features, logits).
    ``feature_dims`` computes FID and sFID over the first that many feature coordinates only (every one
    for None, ADM's protocol), so that fewer samples than the extractor's dimension + 1 give a covariance
    of full rank (the smoke scale); precision / recall and KID keep every coordinate. ``min_samples``
    (default: that dimension + 1) is the fewest samples accepted.
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
        fix = ("raise sampling.num_samples" if feature_dims is None or feature_dims >= full_dim else
               "raise sampling.num_samples or lower eval_gen.feature_dims")
        raise BadInput(f"FID over {reference.dim} feature dimensions needs at least {min_samples} samples, but "
                       f"{npz_path} holds {num_samples}; {fix}.")
    if spatial_reference is not None and not hasattr(extractor, "extract"):
        raise BadInput(f"sFID needs an extractor with .extract() (InceptionFeatures), got "
                         f"{type(extractor).__name__}; pass InceptionFeatures or drop spatial_reference.")
    batch_size = batch_size or getattr(extractor, "batch_size", 100)

    pool_stats = StatsAccumulator(reference.dim)
    spatial_stats = StatsAccumulator(spatial_reference.dim) if spatial_reference is not None else None
    logits, kept_pool = [], []
    with Progress("features", num_samples, unit="image", seed=seed) as progress:
        for batch in iter_npz_images(npz_path, batch_size):
            images = torch.from_numpy(batch).permute(0, 3, 1, 2)
            if spatial_stats is not None:
                pool, logit, spatial = extractor.extract(images)
                spatial_stats.update(_as_float64(spatial)[:, :spatial_reference.dim])
            else:
                pool, logit = extractor(images)
            pool = _as_float64(pool)
            if pool.shape[1] != full_dim:
                raise BadInput(f"The extractor gives {pool.shape[1]}-d features but the reference statistics are "
                                 f"{full_dim}-d; compute both with the same extractor.")
            pool_stats.update(pool[:, :reference.dim])
            logits.append(np.asarray(logit.cpu() if isinstance(logit, torch.Tensor) else logit, dtype=np.float32))
            if reference_features is not None:
                kept_pool.append(pool.astype(np.float32))
            progress.advance(len(batch))

    inception_mean, inception_std = inception_score(np.concatenate(logits), split_size=split_size)
    samples_stats = pool_stats.result()
    result: Dict[str, Union[float, int]] = {
        "fid": frechet_distance(samples_stats, reference),
        "inception_score": inception_mean,
        "inception_score_std": inception_std,
    }
    if own_reference is not None:
        result["fid_own"] = frechet_distance(samples_stats, own_reference)
    if spatial_stats is not None:
        samples_spatial = spatial_stats.result()
        result["sfid"] = frechet_distance(samples_spatial, spatial_reference)
        if own_spatial_reference is not None:
            result["sfid_own"] = frechet_distance(samples_spatial, own_spatial_reference)
    if reference_features is not None:
        device = getattr(extractor, "device", "cpu")
        fake_features = np.concatenate(kept_pool)
        result["precision"], result["recall"] = precision_recall(reference_features, fake_features, k=prc_k,
                                                                 device=device, distance_dtype=prc_distance_dtype)
        subset = min(kid_subset_size, len(reference_features), len(fake_features))
        kid = kid_features_to_metric(torch.from_numpy(np.asarray(reference_features)),
                                     torch.from_numpy(fake_features), kid_subsets=kid_subsets,
                                     kid_subset_size=subset, rng_seed=seed, verbose=False)
        result["kid_mean"], result["kid_std"] = kid[KEY_METRIC_KID_MEAN], kid[KEY_METRIC_KID_STD]
    result["num_samples"] = num_samples
    result["fid_feature_dims"] = reference.dim
    return result


def reference_from_images(image_iter: Iterable[ArrayLike], extractor: Any, *, keep_features: int = ADM_REFERENCE_SIZE,
                          seed: int = 0, spatial: bool = False, total: Optional[int] = None):
    """Reference statistics over every image yielded, and a random subset of their pool features for precision/recall.

    ``image_iter`` yields uint8 (B, 3, H, W) batches (e.g. the training set at
    256 px, ADM's preprocessing). Returns ``(stats, kept)``: ``kept`` is a
    uniformly random subset of ``keep_features`` pool feature rows (float32),
    drawn by reservoir sampling, the same for the same ``seed`` and image
    order; ADM's reference batch has 10,000 images. With ``spatial=True``
    (``extractor`` being :class:`InceptionFeatures`) the spatial statistics
    for sFID come third: ``(stats, kept, spatial_stats)``. ``total``: the images to expect, for the progress.
    """
    pool_stats = spatial_stats = reservoir = None
    with Progress("reference features", total, unit="image") as progress:
        for images in image_iter:
            if spatial:
                pool, _, spatial_features = extractor.extract(images)
                spatial_features = _as_float64(spatial_features)
                spatial_stats = spatial_stats or StatsAccumulator(spatial_features.shape[1])
                spatial_stats.update(spatial_features)
            else:
                pool, _ = extractor(images)
            pool = _as_float64(pool)
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
    path = Path(path)
    if not path.is_file():
        raise MissingInput(f"ADM reference batch not found at {path}; download VIRTUAL_imagenet256_labeled.npz "
                                "from openai/guided-diffusion's evaluations README on a connected machine and put it there.")
    batch_size = batch_size or getattr(extractor, "batch_size", 100)
    features = []
    with Progress("ADM reference features", npz_num_images(path), unit="image") as progress:
        for batch in iter_npz_images(path, batch_size):
            features.append(_as_float64(extractor(torch.from_numpy(batch).permute(0, 3, 1, 2))[0]).astype(np.float32))
            progress.advance(len(batch))
    if not features:
        raise BadInput(f"{path} holds no images in arr_0; pass a reference batch with images.")
    return np.concatenate(features)


def write_reference(out_dir: PathLike, extractor: Any, *, adm_npz: Optional[PathLike],
                    own: Optional[Callable[[], Tuple[FeatureStats, np.ndarray, Optional[FeatureStats], str]]],
                    batch_size: int = 100) -> Dict[str, Any]:
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
    info.update(num_images=int(stats.num), num_features_kept=int(len(features)), feature_dim=int(stats.dim),
                sfid=spatial is not None)
    return info


# --------------------------------------------------------------------------- helpers


def _as_float64(x: ArrayLike) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", torch.float64).numpy()
    return np.asarray(x, dtype=np.float64)


def _as_tensor(x: ArrayLike, device, dtype) -> torch.Tensor:
    tensor = x if isinstance(x, torch.Tensor) else torch.from_numpy(np.asarray(x))
    return tensor.detach().to(device=device, dtype=dtype)


def _require_file(path: Path) -> None:
    if not path.is_file():
        raise MissingInput(f"Sample file not found at {path}; run the sampling stage first or fix the path.")


def _npz_keys(path: Path) -> list:
    with zipfile.ZipFile(path) as archive:
        return [name[:-4] for name in archive.namelist() if name.endswith(".npy")]


def _npz_member(archive: zipfile.ZipFile, path: Path, key: str) -> str:
    member = key + ".npy"
    if member not in archive.namelist():
        keys = sorted(name[:-4] for name in archive.namelist() if name.endswith(".npy"))
        raise BadInput(f"{path} has no '{key}' array (keys: {keys}); write samples with np.savez(path, images) as "
                         "ADM's and DiT's samplers do.")
    return member


def _npz_array_shape(path: Path, key: str) -> Tuple[int, ...]:
    try:
        with zipfile.ZipFile(path) as archive, archive.open(_npz_member(archive, path, key)) as stream:
            return tuple(_read_npy_header(stream)[0])
    except zipfile.BadZipFile:
        raise BadInput(f"{path} is not an .npz (zip) file; write samples with np.savez.") from None


def _read_into(stream, buffer: memoryview) -> int:
    # a zip member stream may return fewer bytes than asked for; read until full or at the end
    filled = 0
    while filled < len(buffer):
        count = stream.readinto(buffer[filled:])
        if not count:
            break
        filled += count
    return filled


def _read_npy_header(stream) -> Tuple[Tuple[int, ...], bool, np.dtype]:
    version = npy_format.read_magic(stream)
    if version == (1, 0):
        return npy_format.read_array_header_1_0(stream)
    if version in ((2, 0), (3, 0)):
        return npy_format.read_array_header_2_0(stream)
    raise BadInput(f"Unsupported .npy format version {version}; re-save the array with a current numpy.")


def _check_image_array(path: Path, shape: Tuple[int, ...], dtype: np.dtype) -> None:
    if np.dtype(dtype) != np.uint8 or len(shape) != 4 or shape[-1] != 3:
        raise BadInput(f"{path} holds {np.dtype(dtype)} {tuple(shape)}, not uint8 (N, H, W, 3) images; save samples "
                         "as ADM does: np.savez(path, uint8_nhwc_images).")


def load_reference_set(root: PathLike) -> Dict[str, Any]:
    """A reference directory (stage fid_reference's data/fid_reference) as ``evaluate_samples``' keyword arguments."""
    root = prepared(root, "fid_reference")  # every file as the stage wrote it

    def optional(name: str) -> Optional[FeatureStats]:
        return FeatureStats.load(root / name) if (root / name).is_file() else None

    return {"reference": FeatureStats.load(root / "stats.npz"),
            "reference_features": np.load(root / "features.npy", allow_pickle=False),
            "spatial_reference": optional("spatial_stats.npz"), "own_reference": optional("own_stats.npz"),
            "own_spatial_reference": optional("own_spatial_stats.npz")}


def evaluator_options(eval_gen: Dict[str, Any]) -> Dict[str, Any]:
    """The params section ``eval_gen`` as ``evaluate_samples``' keyword arguments."""
    return {"feature_dims": eval_gen["feature_dims"], "split_size": eval_gen["isc_split_size"],
            "prc_k": eval_gen["prc_k"], "prc_distance_dtype": eval_gen["prc_distance_dtype"],
            "kid_subsets": eval_gen["kid_subsets"], "kid_subset_size": eval_gen["kid_subset_size"]}
