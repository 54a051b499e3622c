"""Holm's correction over one table's differences: each comparison's verdict, seeds note and adjusted p-value."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Protocol, Sequence, Tuple, TypeVar

from vcarepro.metrics.intervals import Difference, direction, holm, holm_adjusted, seeds_note
from vcarepro.params.provenance import Stale
from vcarepro.report.verdicts import sign

SIGN = object()  # a Comparison's paper gain where the difference has no paper counterpart: its sign is the verdict


@dataclass(frozen=True)
class Comparison:
    """One difference a table shows, before the correction.

    ``paper``: the paper's difference it is judged against (None: not available), or ``SIGN``. ``pair`` names
    what is compared (read-out and run of each side): a comparison a table shows twice (the family's "VCA minus
    MHSA" in both rows, a decomposition whose recipe part is zero) counts once in Holm's m.
    """

    diff: Optional[Difference]
    stale: Optional[Stale]
    paper: Any
    pair: Tuple = ()


@dataclass(frozen=True)
class Judgement:
    """A comparison after the correction: its verdict (or the stale mark), seeds note and Holm-adjusted p."""

    verdict: Optional[str] = None
    note: Optional[str] = None
    p_holm: Optional[str] = None


UNJUDGED = Judgement()  # a difference the table shows without a test (the same run on both sides)


def correct(comparisons: Sequence[Comparison]) -> Tuple[List[Judgement], int]:
    """Each comparison of one table judged after Holm's correction over the table's distinct comparisons, and m:
    how many differences with an interval entered the correction (the page's "Holm over m")."""
    p_values = [None if c.diff is None or c.stale else c.diff.p_value for c in comparisons]
    # each distinct comparison once: its first appearance carries its p-value into the correction
    keys = [c.pair or i for i, c in enumerate(comparisons)]
    first: Dict[Any, int] = {}
    for i, (key, p) in enumerate(zip(keys, p_values)):
        if p is not None:
            first.setdefault(key, i)
    distinct = [p if first.get(key) == i else None for i, (key, p) in enumerate(zip(keys, p_values))]
    decided_once, adjusted_once = holm(distinct), holm_adjusted(distinct)
    decided = [decided_once[first[k]] if k in first else None for k in keys]
    adjusted = [adjusted_once[first[k]] if k in first else None for k in keys]
    out = []
    for c, resolved, p_holm in zip(comparisons, decided, adjusted):
        if c.stale is not None:
            out.append(Judgement(c.stale.text))
            continue
        out.append(
            Judgement(
                sign(c.diff, resolved) if c.paper is SIGN else direction(c.diff, c.paper, resolved),
                seeds_note(c.diff, resolved),
                None if p_holm is None else f"{p_holm:.3f}",
            )
        )
    return out, len(first)


class Judged(Protocol):
    def judged(self, *judgements: Judgement) -> Any: ...


R = TypeVar("R", bound=Judged)


def judge(rows: Sequence[R], comparisons: Sequence[Sequence[Optional[Comparison]]]) -> Tuple[List[R], int]:
    """The rows of one table with their judgements after the correction over the table, and the table's m.

    ``comparisons[i]``: row i's comparisons in the order its ``judged`` takes their judgements (None: a
    difference it shows without a test, judged ``UNJUDGED``).
    """
    judgements, m = correct([c for row in comparisons for c in row if c is not None])
    it = iter(judgements)
    return [row.judged(*[next(it) if c is not None else UNJUDGED for c in cs]) for row, cs in zip(rows, comparisons)], m
