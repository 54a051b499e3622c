"""Convergence flags of a run's seeds: not flattened, ending below the non-neural reference, loss still falling."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

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


def seeds_checked(branch: str, result: Optional[RunResult]) -> int:
    """How many seeds the run's number rests on, each of which :func:`flags` may flag (0 without metrics)."""
    if result is None or not result.metrics:
        return 0
    key = "top1" if branch == "cls" else "fid"
    return len(per_seed_values(result.metrics, key)) or 1


# each kind of flag (a word of its text) and what it says of a seed, in the order the words name them
KINDS = (
    ("below", lambda text: text.split(" (")[0]),  # "ends below the logistic-regression reference"
    ("flattened", lambda text: "had not flattened"),
    ("falling", lambda text: "still had a falling training loss"),
)


def unconverged(flags: Sequence[str], checked: Sequence[Tuple[str, int]]) -> Optional[str]:
    """The flags in words where every seed of every run a number rests on (``checked``: (run, seeds) pairs) is
    flagged, since then the number compares models that had not converged; None where any seed is unflagged."""
    checked = list(dict(checked).items())  # a run shared by several differences counts once
    total = sum(n for _, n in checked)
    if not total:
        return None
    kinds: Dict[str, Dict[str, str]] = {}  # "run seed s" -> {kind: what it says}
    for flag in flags:
        seed, _, text = flag.partition(": ")
        for kind, says in KINDS:
            if kind in text:
                kinds.setdefault(seed, {})[kind] = says(text)
    per_run = {run: sum(seed.rsplit(" seed ", 1)[0] == run for seed in kinds) for run, _ in checked}
    if any(per_run[run] < n for run, n in checked):
        return None
    said = {kind: [k[kind] for k in kinds.values() if kind in k] for kind, _ in KINDS}
    found = [(len(says), says[0]) for says in said.values() if says]  # (seeds flagged, what it says) per kind
    runs = len(checked)
    scope = f"of {checked[0][0]}" if runs == 1 else "of both runs" if runs == 2 else f"of all {runs} runs"
    plural = (lambda says: says.replace("ends below", "end below")) if total > 1 else (lambda says: says)
    every = [plural(says) for n, says in found if n == total]
    some = [f"{n} {plural(says) if n > 1 else says}" for n, says in found if n < total]
    text = (f"all {total} seeds " if total > 1 else "the only seed ") + scope + " "
    text += " and ".join(every) if every else ("are" if total > 1 else "is") + " flagged"
    if some:
        text += f" ({'; '.join(some)})"
    model = "the comparison is of unconverged models" if runs > 1 else "the number is from an unconverged model"
    return f"{text}: {model}"
