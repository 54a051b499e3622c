"""A table cell's verdict: our number beside the paper's, never judged across scales, and the cell as shown."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

from vcarepro.metrics.intervals import Difference, direction, welch
from vcarepro.params.provenance import Stale
from vcarepro.report.collect import RunResult
from vcarepro.report.reference import PaperValue
from vcarepro.report.rows import seed_values

REPRODUCED = "reproduced"
BETTER = "better than paper"
SHORT = "short of paper"
NOT_COMPARABLE = "not comparable"
NOT_RUN = "not run"
NOT_FINITE = "not a finite number"
NO_PAPER_VALUE = "paper value not available"
MATCHES = "matches paper"
DIFFERS = "differs from paper"
STALE_PREFIX = "stale: "
# appended to a verdict judged against a second-hand paper value (data/paper_reference.yaml `unverified`)
UNVERIFIED = " (unverified value)"


def verdict_class(verdict: Optional[str]) -> str:
    """A verdict as a CSS class: "same direction as paper (resolved)" -> "same-direction-as-paper-resolved"."""
    verdict = verdict or ""
    if verdict.startswith(STALE_PREFIX):
        return "stale"
    if verdict.endswith(UNVERIFIED):
        return verdict_class(verdict[: -len(UNVERIFIED)]) + " unverified"
    return verdict.replace(" ", "-").replace("(", "").replace(")", "").replace(",", "")


def stale_of(*results: Optional[RunResult]) -> Optional[Stale]:
    """The staleness of the runs a figure is computed from, as one: every stale run's stage re-run in one command."""
    stale = list(dict.fromkeys(r.stale for r in results if r is not None and r.stale is not None))
    if len(stale) <= 1:
        return stale[0] if stale else None
    return Stale(" ".join(s.stage for s in stale), tuple(f"{s.stage}: {f}" for s in stale for f in s.fields))


@dataclass(frozen=True)
class Measured:
    mean: float
    std: float
    n_seeds: int
    scale: str
    values: Tuple[float, ...] = ()  # per seed, in seed order (what intervals are computed from)

    def text(self, digits: int = 1) -> str:
        if self.n_seeds > 1:
            return f"{self.mean:.{digits}f} ± {self.std:.{digits}f} (n={self.n_seeds})"
        return f"{self.mean:.{digits}f}"


def measured(result: Optional[RunResult], key: str, scale: str) -> Optional[Measured]:
    if result is None or result.metrics is None or key not in result.metrics:
        return None
    m = result.metrics
    return Measured(
        float(m[key]), float(m.get(f"{key}_std", 0.0)), int(m.get("n_seeds", 1)), scale, seed_values(m, key)
    )


def verdict(
    paper: PaperValue, ours: Optional[Measured], *, comparable: bool, tolerance: float, lower_is_better: bool
) -> str:
    """A smoke-scale number is never judged against a paper number."""
    if ours is None:
        return NOT_RUN
    if not math.isfinite(ours.mean):
        return NOT_FINITE
    if not paper.available:
        return NO_PAPER_VALUE
    if not comparable:
        return NOT_COMPARABLE
    diff = ours.mean - paper.value
    out = REPRODUCED if abs(diff) <= tolerance else BETTER if (diff < 0) == lower_is_better else SHORT
    return out if paper.verified else out + UNVERIFIED


def exact_verdict(paper: PaperValue, ours: Optional[float], tolerance: float) -> str:
    """For exact quantities (parameters, FLOPs at paper shape): within ``tolerance`` of the paper's value?"""
    if ours is None:
        return NOT_RUN
    if not paper.available:
        return NO_PAPER_VALUE
    out = MATCHES if abs(ours - paper.value) <= tolerance + 1e-9 else DIFFERS
    return out if paper.verified else out + UNVERIFIED


def difference(a: Optional[Measured], b: Optional[Measured]) -> Optional[Difference]:
    """a - b with Welch's 95% interval over the per-seed values (no interval when a side has one seed)."""
    if a is None or b is None:
        return None
    return welch(a.values, b.values)


def sign(diff: Optional[Difference], resolved: Optional[bool] = None) -> str:
    """For a difference without a paper counterpart: its sign, only where the interval (or Holm) resolves it."""
    if diff is None or not diff.has_interval or not (diff.resolved if resolved is None else resolved):
        return direction(diff, None, resolved)
    return "positive (resolved)" if diff.value > 0 else "negative (resolved)"


@dataclass(frozen=True)
class ShownCell:
    """A cell as the page, the CSV / Markdown and results.json show it: text, never a number to compute with."""

    paper: Optional[str]
    source: Optional[str]
    unverified: bool
    conflict: Optional[Tuple[str, str]]  # another summary's value and its source
    ours: Optional[str]
    scale: Optional[str]
    diff: Optional[str]
    verdict: str
    verdict_class: str
    statistic: Optional[str]
    reason: Optional[str]
    stale: Optional[str]  # what differs, where the run's numbers are stale
    flags: Tuple[str, ...]

    def as_dict(self) -> Dict[str, Any]:
        return {
            "paper": self.paper,
            "source": self.source,
            "unverified": self.unverified,
            "conflict": self.conflict,
            "ours": self.ours,
            "scale": self.scale,
            "diff": self.diff,
            "verdict": self.verdict,
            "verdict_class": self.verdict_class,
            "statistic": self.statistic,
            "reason": self.reason,
            "stale": self.stale,
            "flags": list(self.flags),
        }


@dataclass(frozen=True)
class Cell:
    """One table cell: paper value (with source), ours (with scale), difference, verdict."""

    paper: PaperValue
    ours: Optional[Measured]
    verdict: str
    conflict: Optional[PaperValue] = None
    digits: int = 1
    statistic: Optional[str] = None  # which top-1 the paper's number is (and ours was read as)
    reason: Optional[str] = None  # why a number measured at paper scale is not comparable
    stale: Optional[Stale] = None  # the run's numbers on disk are not the current params' (verdict says so)
    flags: Tuple[str, ...] = ()  # convergence flags of the seeds ours is computed from

    @property
    def diff(self) -> Optional[float]:
        # no difference is printed where the numbers are not comparable: it would read as a result
        if self.ours is None or not self.paper.available or self.verdict in (NOT_COMPARABLE, NOT_FINITE):
            return None
        return self.ours.mean - self.paper.value

    def shown(self) -> ShownCell:
        return ShownCell(
            paper=None if not self.paper.available else f"{self.paper.value:.{self.digits}f}",
            source=self.paper.source,
            unverified=self.paper.available and not self.paper.verified,
            conflict=None
            if self.conflict is None or not self.conflict.available
            else (f"{self.conflict.value:.{self.digits}f}", self.conflict.source),
            ours=None if self.ours is None else self.ours.text(self.digits),
            scale=None if self.ours is None else self.ours.scale,
            diff=None if self.diff is None else f"{self.diff:+.{self.digits}f}",
            verdict=self.verdict,
            verdict_class=verdict_class(self.verdict),
            statistic=self.statistic,
            reason=self.reason,
            stale=None if self.stale is None else self.stale.detail,
            flags=tuple(self.flags),
        )
