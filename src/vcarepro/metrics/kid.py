"""The Kernel Inception Distance, by torch-fidelity, between the reference features and the samples' features.

ADM's evaluator has no KID; DiT and SiT do not report one. It is computed on the same pool
features as precision/recall, so it needs the reference images' features (``features.npy``
of data/fid_reference), not only their statistics.
"""

from __future__ import annotations

from typing import Tuple

import numpy as np
import torch
from torch_fidelity.metric_kid import KEY_METRIC_KID_MEAN, KEY_METRIC_KID_STD, kid_features_to_metric


def kernel_inception_distance(
    real_feats: np.ndarray, fake_feats: np.ndarray, *, subsets: int = 100, subset_size: int = 1000, seed: int = 0
) -> Tuple[float, float]:
    """(mean, std) of the polynomial-kernel MMD over ``subsets`` random subsets of each feature set.

    A subset holds ``min(subset_size, both set sizes)`` rows, so a smoke evaluation of a few
    samples still gets a number; the subsets are drawn with ``seed``.
    """
    subset = min(subset_size, len(real_feats), len(fake_feats))
    kid = kid_features_to_metric(
        torch.from_numpy(np.asarray(real_feats)),
        torch.from_numpy(np.asarray(fake_feats)),
        kid_subsets=subsets,
        kid_subset_size=subset,
        rng_seed=seed,
        verbose=False,
    )
    return kid[KEY_METRIC_KID_MEAN], kid[KEY_METRIC_KID_STD]
