"""Convergence flags of a run's seeds: not flattened, ending below the non-neural reference, loss still falling."""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

from vcarepro.metrics.aggregate import per_seed_values
from vcarepro.report.collect import RunResult

# A classification seed whose validation top-1 spans more than this over its last three evaluations has not
# flattened; one whose final top-1 is below the non-neural reference (cls_reference) ends below it.
FLAT_TOP1_POINTS = 1.0
# a generation seed whose mean training loss over the last tenth of its logged steps is more than this fraction
# below the tenth before is still falling
FLAT_LOSS_FRACTION = 0.05


def flags(
    branch: str, result: Optional[RunResult], seeds: Sequence[Any], reference_top1: Optional[Tuple[float, str]] = None
) -> Tuple[str, ...]:
    """The flags of ``result``'s seeds; ``seeds``: the run's seeds as params lists them (their indices where the
    metrics hold another count); ``reference_top1``: (value, name) of the non-neural reference on the same split."""
    if result is None or not result.metrics:
        return ()
    name, m, out = result.name, result.metrics, []
    if branch == "cls":
        spread = per_seed_values(m, "plateau_spread")
        final = per_seed_values(m, "top1") or [m["top1"]]
        named: List[Any] = list(seeds) if len(seeds) == len(final) else list(range(len(final)))
        for i, seed in enumerate(named):
            if i < len(spread) and spread[i] > FLAT_TOP1_POINTS:
                out.append(f"{name} seed {seed}: not flattened (last 3 evaluations span {spread[i]:.1f} points)")
            if reference_top1 and final[i] < reference_top1[0]:
                out.append(
                    f"{name} seed {seed}: ends below the {reference_top1[1]} reference "
                    f"({final[i]:.1f} < {reference_top1[0]:.1f})"
                )
    else:
        for seed, points in sorted(result.curves.get("train/loss", {}).items()):
            tenth = len(points) // 10
            if tenth < 2:
                continue
            last = sum(v for _, v in points[-tenth:]) / tenth
            before = sum(v for _, v in points[-2 * tenth : -tenth]) / tenth
            if before > 0 and (before - last) / before > FLAT_LOSS_FRACTION:
                out.append(
                    f"{name} seed {seed}: training loss still falling "
                    f"({(before - last) / before:.0%} over the last tenth of its steps)"
                )
    return tuple(out)
