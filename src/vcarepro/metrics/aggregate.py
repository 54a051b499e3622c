"""Seeds are an axis of a run: per-seed figures in, flat mean / std / per-seed metrics out."""

from __future__ import annotations

import math
import statistics
from typing import Any, Dict, Iterable, List, Mapping

from vcarepro.core.errors import BadInput


def aggregate_seeds(per_seed: Mapping[int, Mapping[str, float]], keys: Iterable[str]) -> Dict[str, float]:
    """{'top1': mean, 'top1_std': sample std (0 for one seed), 'top1_seed0': ..., 'n_seeds': k}."""
    if not per_seed:
        raise BadInput("no seeds to aggregate; the run lists no seeds.")
    out: Dict[str, float] = {"n_seeds": len(per_seed)}
    for key in keys:
        values = [float(fig[key]) for fig in per_seed.values()]
        bad = [v for v in values if not math.isfinite(v)]
        if bad:
            raise BadInput(f"{key} is not finite for some seed ({bad[0]}); the run diverged, see its logs.")
        out[key] = statistics.fmean(values)
        out[f"{key}_std"] = statistics.stdev(values) if len(values) > 1 else 0.0
        for seed, fig in per_seed.items():
            out[f"{key}_seed{seed}"] = float(fig[key])
    return out


# The number a run is compared by: what `dvc exp show` tabulates for it (see :func:`headline`).
HEADLINE_KEY = {"cls": "top1", "gen": "fid"}


def headline(run: str, branch: str, metrics: Mapping[str, Any]) -> Dict[str, Dict[str, float]]:
    """A run's DVC metric, written by its own evaluation: ``{run: {top1|fid: mean, <key>_std: spread, n_seeds}}``.

    Keyed by the run's whole name, so that `dvc exp show` has a column group per run named after it, and an
    experiment's column changes only where its own stages ran. One seed has no spread, so no ``_std``.
    """
    key = HEADLINE_KEY[branch]
    out = {key: metrics[key], "n_seeds": metrics["n_seeds"]}
    if metrics["n_seeds"] > 1:
        out[f"{key}_std"] = metrics[f"{key}_std"]
    return {run: out}


def per_seed_values(metrics: Mapping[str, Any], key: str) -> List[float]:
    """The per-seed values of ``key`` that :func:`aggregate_seeds` wrote, in seed order (empty if none)."""
    prefix = f"{key}_seed"
    pairs = sorted(
        (int(k[len(prefix) :]), float(v))
        for k, v in metrics.items()
        if k.startswith(prefix) and k[len(prefix) :].isdigit()
    )
    return [v for _, v in pairs]
