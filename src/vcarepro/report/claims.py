"""The abstract's compute claims: a table of how each is tested (``CLAIM_TESTS``), and ``check``, which reads it.

Every test reads counts at the paper's shape (metrics/complexity.json, metrics/attention_macs.json), so no verdict
depends on the scale; wall times (timings/) are quoted beside a verdict, never in it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from vcarepro.report.verdicts import verdict_class

HOLDS, DOES_NOT_HOLD, NOT_RUN, NOT_CHECKED = "holds", "does not hold", "not run", "not checked here"
NOT_MEASURED = "not measured by this pipeline"  # the evidence of a claim no test of CLAIM_TESTS answers

# The rules a claim is tested by (``RULES`` reads each): VCA's count against the baseline's, or how both grow
# with the token count.
ADDED_BELOW = "added below"  # VCA's parameters (M) minus the baseline's are below ``limit``
EQUAL_AS_PRINTED = "equal as printed"  # equal when rounded to ``limit`` decimals, the paper's precision
LINEAR_IN_TOKENS = "linear in tokens"  # VCA's count grows no faster than the tokens (within ``limit`` times),
#                                           the baseline's faster


@dataclass(frozen=True)
class ClaimTest:
    """How one claim of data/paper_reference.yaml ``claims`` is tested."""

    wording: str  # the claim, word for word as data/paper_reference.yaml has it
    stage: str  # the stage whose output measures it (``dvc repro <stage>`` where it is absent)
    quantity: str  # params_m / gmacs of metrics/complexity.json, or macs of metrics/attention_macs.json
    baseline: str  # the model (complexity) or attention layer (attention_macs) VCA is compared with
    vca: str
    rule: str  # ADDED_BELOW, EQUAL_AS_PRINTED or LINEAR_IN_TOKENS
    limit: float
    on: str  # what was measured, as the evidence names it
    tolerance: str  # the rule, in words, for the page


CLAIM_TESTS: Tuple[ClaimTest, ...] = (
    ClaimTest(
        wording="VCA adds fewer than 0.3M parameters to DeiT-T",
        stage="complexity",
        quantity="params_m",
        baseline="deit_tiny-mhsa",
        vca="deit_tiny-vca",
        rule=ADDED_BELOW,
        limit=0.3,
        on="DeiT-T",
        tolerance="exact counts at the paper's shape; holds if fewer than 0.3M are added",
    ),
    ClaimTest(
        wording="VCA adds no FLOPs",
        stage="complexity",
        quantity="gmacs",
        baseline="deit_tiny-mhsa",
        vca="deit_tiny-vca",
        rule=EQUAL_AS_PRINTED,
        limit=1,
        on="DeiT-T at 224 px",
        tolerance="holds if equal at one decimal, the precision at which the paper prints GMACs",
    ),
    ClaimTest(
        wording="complexity O(N n C) with n << N",
        stage="attention_cost",
        quantity="macs",
        baseline="mhsa",
        vca="vca",
        rule=LINEAR_IN_TOKENS,
        limit=1.1,
        on="one layer at DeiT-T width",
        tolerance="holds if VCA's MACs grow no faster than the token count (within 10%) and MHSA's faster",
    ),
)


@dataclass(frozen=True)
class ClaimRow:
    claim: str
    source: str
    paper: Optional[str]
    evidence: str
    verdict: str
    verdict_class: str
    tolerance: Optional[str]
    timing: Optional[str]  # wall times: this machine's record (the claims export), never in the verdict
    command: Optional[str] = None  # what measures it, where it was not run (the summary's; not exported)

    def as_dict(self) -> Dict[str, Any]:
        return {
            "claim": self.claim,
            "source": self.source,
            "paper": self.paper,
            "evidence": self.evidence,
            "verdict": self.verdict,
            "verdict_class": self.verdict_class,
            "tolerance": self.tolerance,
            "timing": self.timing,
        }


@dataclass(frozen=True)
class Measurements:
    """What the claims are tested on: metrics/complexity.json, metrics/attention_macs.json, and the wall times
    measured with the same configuration (timings/attention_cost.json, None where absent or from another)."""

    complexity: Mapping[str, Mapping[str, float]]
    attention_macs: Optional[Mapping[str, Any]] = None
    attention_cost: Optional[Mapping[str, Any]] = None

    def present(self, test: ClaimTest) -> bool:
        """Whether the output ``test`` reads is here (the MACs, or the times measured with them; both counts)."""
        if test.quantity == "macs":
            return bool(self.attention_macs or self.attention_cost)
        return bool(self.complexity.get(test.baseline) and self.complexity.get(test.vca))


Outcome = Tuple[str, Optional[bool], Optional[str]]  # evidence, holds (None: cannot tell), wall times


def _counts(test: ClaimTest, m: Measurements) -> Tuple[float, float]:
    return m.complexity[test.baseline][test.quantity], m.complexity[test.vca][test.quantity]


def _added_below(test: ClaimTest, m: Measurements) -> Outcome:
    base, vca = _counts(test, m)
    return f"+{(vca - base) * 1e3:.1f}K parameters on {test.on}", vca - base < test.limit, None


def _equal_as_printed(test: ClaimTest, m: Measurements) -> Outcome:
    base, vca = _counts(test, m)
    digits = int(test.limit)
    return (
        f"{base:.4f} -> {vca:.4f} GMACs on {test.on} ({(vca / base - 1) * 100:+.2f}%)",
        round(vca, digits) == round(base, digits),
        None,
    )


def _linear_in_tokens(test: ClaimTest, m: Measurements) -> Outcome:
    """How one attention layer's MACs (exact, a DVC output) and, where measured here, time grow with N."""
    rows = (m.attention_macs or m.attention_cost)["rows"]
    by = {(r["layer"], r["tokens"]): r for r in rows}
    times = {(r["layer"], r["tokens"]): r.get("forward_backward_ms") for r in (m.attention_cost or {}).get("rows", [])}
    layers = (test.baseline, test.vca)
    vca, base = test.vca.upper(), test.baseline.upper()  # as the evidence names them
    # the claim compares VCA with its baseline; the other layers the stage measures do not enter it
    tokens = sorted({r["tokens"] for r in rows if all((layer, r["tokens"]) in by for layer in layers)})
    if not tokens:
        return f"{vca} and {base} were not both measured (attention_cost.layers)", None, None
    n0, n1 = tokens[0], tokens[-1]
    if n0 == n1:
        return "measured at one token count only; growth needs two (attention_cost.sides)", None, None
    grew = {layer: by[(layer, n1)][test.quantity] / by[(layer, n0)][test.quantity] for layer in layers}
    growth = n1 / n0
    evidence = (
        f"{test.on}, N {n0} -> {n1} ({growth:.0f}x tokens): {vca} MACs "
        f"{grew[test.vca]:.1f}x, {base} {grew[test.baseline]:.1f}x"
    )
    timing = None
    if all(times.get((layer, n)) for layer in layers for n in (n0, n1)):
        t = {layer: times[(layer, n1)] / times[(layer, n0)] for layer in layers}
        timing = (
            f"forward+backward time {vca} {t[test.vca]:.1f}x, {base} {t[test.baseline]:.1f}x "
            f"({m.attention_cost['machine'].get('cpu')})"
        )
    return evidence, grew[test.vca] <= test.limit * growth < grew[test.baseline], timing


RULES = {ADDED_BELOW: _added_below, EQUAL_AS_PRINTED: _equal_as_printed, LINEAR_IN_TOKENS: _linear_in_tokens}


def check(claim: Mapping[str, Any], m: Measurements, tests: Sequence[ClaimTest] = CLAIM_TESTS) -> ClaimRow:
    """One claim of data/paper_reference.yaml ``claims`` tested as ``tests`` says: holds, does not hold, not run
    (its stage's output is absent here), or not checked here (no test, or the output cannot decide it)."""
    test = next((t for t in tests if t.wording == claim["claim"]), None)
    evidence, holds, tolerance, timing, command = NOT_MEASURED, None, None, None, None
    if test is not None and not m.present(test):
        command = f"dvc repro {test.stage}"
        evidence = f"not measured in this workspace: {command}"
    elif test is not None:
        tolerance = test.tolerance
        evidence, holds, timing = RULES[test.rule](test, m)
    verdict = HOLDS if holds else DOES_NOT_HOLD if holds is False else NOT_RUN if command else NOT_CHECKED
    return ClaimRow(
        claim=claim["claim"],
        source=claim["source"],
        paper=claim.get("paper"),
        evidence=evidence,
        verdict=verdict,
        verdict_class=verdict_class(verdict),
        tolerance=tolerance,
        timing=timing,
        command=command,
    )


def claims(reference_claims: Sequence[Mapping[str, Any]], m: Measurements) -> List[ClaimRow]:
    """Every claim of data/paper_reference.yaml ``claims``, checked (``check``)."""
    return [check(c, m) for c in reference_claims]
