"""The Inception Score as ADM's evaluator computes it: consecutive splits of a fixed size, in sample order.

Hand-written because torch-fidelity's ``isc_features_to_metric`` cuts N samples into a number
of equal chunks, while ADM's ``compute_inception_score`` cuts them, in order, into
consecutive splits of ``split_size`` = 5,000, the last one possibly shorter.
"""

from __future__ import annotations

from typing import Tuple, Union

import numpy as np
import torch

from vcarepro.core.errors import BadInput


def inception_score(logits: Union[np.ndarray, torch.Tensor], split_size: int = 5000) -> Tuple[float, float]:
    """Inception Score as ADM's evaluator computes it: (mean over splits, std over splits).

    The softmax of the logits is cut, in order, into consecutive splits of ``split_size``
    samples (50,000 samples: ten splits of 5,000); each split scores exp(mean KL(p(y|x) ||
    p(y))) with p(y) the split's mean prediction. ADM prints the mean; the std is ours.
    """
    values = logits.detach().cpu().numpy() if isinstance(logits, torch.Tensor) else np.asarray(logits)
    values = values.astype(np.float64)
    if values.ndim != 2 or values.shape[0] < 1 or split_size < 1:
        raise BadInput(
            f"inception_score needs (N, classes) logits with N >= 1 and split_size >= 1, got "
            f"{values.shape} and split_size={split_size}; pass the samples' logits."
        )
    values = values - values.max(axis=1, keepdims=True)
    probs = np.exp(values)
    probs /= probs.sum(axis=1, keepdims=True)
    scores = []
    for start in range(0, len(probs), split_size):
        part = probs[start : start + split_size]
        kl = part * (np.log(part) - np.log(part.mean(axis=0, keepdims=True)))
        scores.append(float(np.exp(kl.sum(axis=1).mean())))
    return float(np.mean(scores)), float(np.std(scores))
