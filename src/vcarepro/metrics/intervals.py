"""Differences between two runs with a Welch 95% interval, and the direction verdict the interval supports.

Seeds are not paired: two runs with one seed share its data order but not their initial weights, so a
paired interval would claim a correlation the construction does not give. A direction needs the interval
to exclude zero and, within a table, Holm's correction (docs/pipeline.md); seeds-to-resolve is a rough
projection, not a power calculation.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import List, Optional, Sequence

from scipy import stats

from vcarepro.core.errors import BadInput

LEVEL = 0.95
MAX_SEEDS_ESTIMATE = 1000  # beyond this the estimate says "more than"

SAME = "same direction as paper (resolved)"
OPPOSITE = "opposite direction (resolved)"
ONE_SEED = "one seed: no error estimate"
NOT_RUN = "not run"
NO_PAPER_GAIN = "paper gain not available"
NO_PAPER_CHANGE = "paper reports no change"


def not_resolved(n_seeds: int) -> str:
    return f"not resolved with {n_seeds} seeds"


@dataclass(frozen=True)
class Difference:
    """a - b with Welch's interval; ``low``/``high`` are None when a side has one seed."""

    value: float
    n_a: int
    n_b: int
    sd_a: float
    sd_b: float
    se: Optional[float] = None
    df: Optional[float] = None
    low: Optional[float] = None
    high: Optional[float] = None

    @property
    def has_interval(self) -> bool:
        return self.low is not None

    @property
    def resolved(self) -> bool:
        """The interval excludes zero (before any correction for multiple comparisons)."""
        return self.has_interval and (self.low > 0 or self.high < 0)

    @property
    def p_value(self) -> Optional[float]:
        """Welch's two-sided p-value of a zero difference (None without an interval); p < 0.05 iff it is resolved."""
        if not self.has_interval:
            return None
        if self.se == 0:
            return 0.0 if self.value != 0 else 1.0
        return float(2 * stats.t.sf(abs(self.value) / self.se, self.df))

    @property
    def half_width(self) -> Optional[float]:
        return None if self.low is None else (self.high - self.low) / 2

    def text(self, digits: int = 2) -> str:
        if not self.has_interval:
            return f"{self.value:+.{digits}f} ({ONE_SEED})"
        return (
            f"{self.value:+.{digits}f} [{self.low:+.{digits}f}, {self.high:+.{digits}f}] "
            f"(95% Welch, n={self.n_a} vs {self.n_b})"
        )

    def seeds_to_resolve(self) -> Optional[int]:
        """Seeds per run at which the interval would exclude zero if this difference and spread held.

        None when it is already resolved or cannot be estimated (one seed, or no difference at all).
        """
        if not self.has_interval or self.resolved or self.value == 0:
            return None
        var = self.sd_a**2 + self.sd_b**2
        if var == 0:
            return None
        for n in range(2, MAX_SEEDS_ESTIMATE + 1):
            se = math.sqrt(var / n)
            df = _welch_df(self.sd_a, n, self.sd_b, n)
            if stats.t.ppf(0.5 + LEVEL / 2, df) * se < abs(self.value):
                return n
        return MAX_SEEDS_ESTIMATE + 1


def _welch_df(sd_a: float, n_a: int, sd_b: float, n_b: int) -> float:
    va, vb = sd_a**2 / n_a, sd_b**2 / n_b
    denominator = va**2 / (n_a - 1) + vb**2 / (n_b - 1)
    if denominator == 0:  # both sides without spread: any df; the interval is the point
        return float(n_a + n_b - 2)
    return (va + vb) ** 2 / denominator


def welch(a: Sequence[float], b: Sequence[float], level: float = LEVEL) -> Difference:
    """mean(a) - mean(b) with Welch's t interval at ``level`` (none when a side has one value)."""
    if not a or not b:
        raise BadInput("a difference needs at least one value on each side.")
    a, b = [float(x) for x in a], [float(x) for x in b]
    mean_a, mean_b = statistics.fmean(a), statistics.fmean(b)
    value = mean_a - mean_b
    if abs(value) <= 1e-9 * max(abs(mean_a), abs(mean_b), 1.0):
        value = 0.0  # equal means up to rounding (92.78 - 92.78 is -1.4e-14): no difference, and no "-0.00"
    sd_a = statistics.stdev(a) if len(a) > 1 else 0.0
    sd_b = statistics.stdev(b) if len(b) > 1 else 0.0
    if len(a) < 2 or len(b) < 2:
        return Difference(value, len(a), len(b), sd_a, sd_b)
    se = math.sqrt(sd_a**2 / len(a) + sd_b**2 / len(b))
    df = _welch_df(sd_a, len(a), sd_b, len(b))
    half = stats.t.ppf(0.5 + level / 2, df) * se
    return Difference(value, len(a), len(b), sd_a, sd_b, se, df, value - half, value + half)


def holm(p_values: Sequence[Optional[float]], level: float = LEVEL) -> List[Optional[bool]]:
    """Holm's step-down test: which of ``p_values`` are significant at family-wise ``1 - level``.

    None stays None (a difference without an interval takes no part and does not count in m).
    """
    alpha = 1 - level
    order = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
    m = len(order)
    out: List[Optional[bool]] = [None if p is None else False for p in p_values]
    for rank, (p, i) in enumerate(order):
        if p > alpha / (m - rank):
            break  # step-down: every larger p-value is kept as well
        out[i] = True
    return out


def holm_adjusted(p_values: Sequence[Optional[float]]) -> List[Optional[float]]:
    """Holm-adjusted p-values (monotone, capped at 1), None where no p-value."""
    order = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
    m, running = len(order), 0.0
    out: List[Optional[float]] = [None] * len(p_values)
    for rank, (p, i) in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out


def direction(diff: Optional[Difference], paper_gain: Optional[float], resolved: Optional[bool] = None) -> str:
    """The direction verdict of our difference against the paper's, stated only where our interval allows.

    ``resolved`` overrides the interval's own verdict (Holm's, where the difference is one of a table's many).
    """
    if diff is None:
        return NOT_RUN
    if not diff.has_interval:
        return ONE_SEED
    if not (diff.resolved if resolved is None else resolved):
        return not_resolved(min(diff.n_a, diff.n_b))
    if paper_gain is None:
        return NO_PAPER_GAIN
    if paper_gain == 0:
        return NO_PAPER_CHANGE
    return SAME if (diff.value > 0) == (paper_gain > 0) else OPPOSITE


def seeds_note(diff: Optional[Difference], resolved: Optional[bool] = None) -> Optional[str]:
    """For an unresolved difference: roughly how many seeds per run would resolve it (uncorrected, labelled rough)."""
    if diff is None or not diff.has_interval:
        return None
    if diff.resolved and resolved is False:
        return "its own 95% interval excludes zero, but not after Holm's correction over this table"
    if diff.resolved:
        return None
    n = diff.seeds_to_resolve()
    if n is None:
        return "no difference observed; more seeds would not give it a direction"
    if n > MAX_SEEDS_ESTIMATE:
        return f"rough: more than {MAX_SEEDS_ESTIMATE} seeds per run at the observed spread"
    return (
        f"rough: about {n} seeds per run if the observed difference and spread held "
        "(not a power calculation; before any correction)"
    )
