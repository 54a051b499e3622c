"""The report's answer first: one row per claim of the paper, one status from a fixed vocabulary.

A row is an abstract claim or a headline row of Tables 1-4 (VCA minus its baseline per backbone and
generator, and per ablation table whether VCA's own variant is the best). Each row is computed from
the tables below it in the report (``gains``, ``claims``), never written by hand; its status is one of
``STATUSES``, and each status is defined there once for the page's legend.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from vcarepro.metrics.intervals import ONE_SEED, OPPOSITE, SAME
from vcarepro.report.claims import DOES_NOT_HOLD, HOLDS, ClaimRow
from vcarepro.report.claims import NOT_RUN as CLAIM_NOT_RUN
from vcarepro.report.convergence import unconverged
from vcarepro.report.gains import GainRow
from vcarepro.report.rows import role
from vcarepro.report.workspace import Workspace

REPRODUCED = "reproduced"
NOT_REPRODUCED = "not reproduced"
SAME_DIRECTION = "same direction, size not comparable"
OPPOSITE_DIRECTION = "opposite direction"
NOT_RESOLVED = "not resolved with {n} seeds"
NOT_RUN = "not run at this scale"
NOT_TESTABLE = "not testable here"
STALE = "stale"

# Each status once, for the legend beside the summary (the not-resolved one with n in words).
STATUSES = {
    REPRODUCED: "at the paper's scale, recipe and protocol, our difference is within the stated tolerance of the "
    "paper's (a point comparison, as the paper reports single runs; with several seeds, their mean); "
    "compute claims: as the claim words it, counted at the paper's shape",
    NOT_REPRODUCED: "at the paper's scale, recipe and protocol (or for a compute count), ours is outside that "
    "tolerance",
    SAME_DIRECTION: "measured where sizes cannot be compared with the paper's: our difference is significant in the "
    "paper's direction (Welch's test, Holm-corrected over the comparisons of its table, family-wise 5%)",
    OPPOSITE_DIRECTION: "significant in the same sense, on the other side from the paper's",
    NOT_RESOLVED.format(n="n"): "not significant after that correction (its own 95% interval may still exclude zero: "
    "the row says so), or a side has a single seed and no error estimate",
    NOT_RUN: "the runs this row needs are not in this scale's matrix; the row says how to run them",
    NOT_TESTABLE: "the paper gives no value to compare with, or the quantity is not one this pipeline measures",
    STALE: "the numbers on disk were produced by other params; the row names the stage to re-run",
}
# For a claim over several rows: the status of its weakest measured row (first in this order).
WEAKEST_FIRST = [STALE, OPPOSITE_DIRECTION, NOT_REPRODUCED, "not resolved", SAME_DIRECTION, REPRODUCED]


def status_key(status: str) -> str:
    """The legend entry of a status ("not resolved with 3 seeds" -> "not resolved with n seeds")."""
    return NOT_RESOLVED.format(n="n") if status.startswith("not resolved") else status


def _rank(status: str) -> int:
    for i, prefix in enumerate(WEAKEST_FIRST):
        if status.startswith(prefix):
            return i
    return len(WEAKEST_FIRST)


def gain_status(row: GainRow, tolerance: float) -> str:
    """The status of one difference row (``gains.GainRow``), from its Holm-corrected verdict.

    Judged against the paper's size only where the row says both sides are comparable (paper scale, recipe and,
    for FID, protocol); elsewhere only its direction counts.
    """
    if row.stale:
        return STALE
    if row.ours_value is None:
        return NOT_RUN
    if row.paper_value is None:
        return NOT_TESTABLE
    if row.comparable:
        return REPRODUCED if abs(row.ours_value - row.paper_value) <= tolerance else NOT_REPRODUCED
    verdict = row.direction or ""
    if verdict == SAME:
        return SAME_DIRECTION
    if verdict == OPPOSITE:
        return OPPOSITE_DIRECTION
    if verdict == ONE_SEED:
        return NOT_RESOLVED.format(n=1).replace("1 seeds", "1 seed")
    return verdict if verdict.startswith("not resolved") else NOT_TESTABLE


def combine(statuses: Sequence[str]) -> str:
    """A claim over several rows: not run if none was measured, else the weakest measured row's status."""
    measured = [s for s in statuses if s not in (NOT_RUN, NOT_TESTABLE)]
    if not measured:
        return NOT_RUN if NOT_RUN in statuses else NOT_TESTABLE
    return min(measured, key=_rank)


def _span(values: Sequence[float], digits: int = 1) -> str:
    values = sorted(values)
    if not values:
        return ""
    lo, hi = values[0], values[-1]
    return f"{lo:+.{digits}f}" if abs(hi - lo) < 10**-digits / 2 else f"{lo:+.{digits}f} to {hi:+.{digits}f}"


def _paper_sources(rows: Sequence[GainRow]) -> str:
    return "/".join(dict.fromkeys(s for r in rows if r.source for s in r.source.split("/")))


def _row(
    claim: str,
    source: Optional[str],
    members: Sequence[GainRow],
    ws: Workspace,
    tolerance: float,
    paper_text: Optional[str] = None,
    section: str = "",
    runs: Optional[Dict[str, List[str]]] = None,
) -> Dict[str, Any]:
    """One summary row over ``members`` (gain rows); ``runs``: each member's runs (by its ``model``), for the
    command that runs what was not run."""
    statuses = [gain_status(r, tolerance) for r in members]
    status = combine(statuses)
    # what the status rests on: the measured rows that have a paper value to compare with
    measured = [r for r, s in zip(members, statuses) if s not in (NOT_RUN, NOT_TESTABLE, STALE)]
    with_paper = [r for r in members if r.paper_value is not None]
    if len(members) == 1 and measured:
        ours = measured[0].ours
    elif measured:  # each row's own difference and interval, not a range of point estimates
        ours = "; ".join(f"{r.model}: {r.ours}" for r in measured)
    else:
        ours = None
    not_run = [r for r, s in zip(members, statuses) if s == NOT_RUN]
    notes, command = [], None
    if len(members) > 1 and measured:
        notes.append(f"{len(measured)} of {len(members)} rows measured")
    if not_run and measured:
        notes.append("not run at this scale: " + ", ".join(r.model for r in not_run))
    notes += [
        f"{r.model}: {r.seeds_note}" if len(members) > 1 else r.seeds_note
        for r in measured
        if r.seeds_note and "Holm" in r.seeds_note
    ]
    if not_run:
        command = ws.how_to_run([run for r in not_run for run in (runs or {}).get(r.model, [])])
    if status == STALE:
        notes.append("; ".join(r.direction for r in members if r.stale))
    flags = list(dict.fromkeys(f for r in measured for f in r.flags))
    # a claim with its own source (the abstract) is as verified as that source; else as its rows' values
    unverified = source in ws.unverified if source else any(r.unverified for r in with_paper)
    if unverified and status in (REPRODUCED, NOT_REPRODUCED, SAME_DIRECTION, OPPOSITE_DIRECTION):
        notes.append("judged against an unverified paper value")
    paper = paper_text or (_span([r.paper_value for r in with_paper]) if with_paper else None)
    _words(ws, claim, status, paper, measured, flags)
    return {
        "section": section,
        "claim": claim,
        "paper": paper,
        "source": source or _paper_sources(with_paper) or None,
        "unverified": bool(unverified),
        "ours": ours,
        "scale": ws.scale if ours is not None else None,
        "status": status,
        "note": "; ".join(notes) or None,
        "command": command,
        "flags": flags,
    }


def _words(
    ws: Workspace, claim: str, status: str, paper: Optional[str], measured: Sequence[GainRow], flags: Sequence[str]
) -> None:
    """What the page says beside a row's number (``ws.summary_words``, in no export, whose hashes stay): the flags
    in words where every seed is flagged, and that ours is not comparable with the paper's where the status does
    not already say so ("not resolved" beside "+3.4" reads as a near miss)."""
    words = {}
    text = unconverged(flags, [c for r in measured for c in r.checked])
    if text:
        words["unconverged"] = text
    apart = [r for r in measured if r.paper_value is not None and not r.comparable]
    if paper is not None and apart and "not comparable" not in status:
        if ws.scale != "paper":
            words["scale"] = f"{ws.scale} scale: not comparable with the paper's {paper}; only its sign can agree"
        else:
            which = "" if len(apart) == len(measured) else ", ".join(r.model for r in apart) + ": "
            words["scale"] = (
                f"{which}paper scale, but not the paper's recipe or FID protocol (see Recipes): not comparable with "
                f"the paper's {paper}; only its sign can agree"
            )
    if words:
        ws.summary_words[claim] = words


def summary(
    ws: Workspace, gains: List[GainRow], ablation_gains: Dict[str, List[GainRow]], claims: List[ClaimRow]
) -> List[Dict[str, Any]]:
    """Every claim row of the summary, computed from the report's own tables (see the module docstring)."""
    ref = ws.ref
    tol_top1, tol_fid = ws.tol_top1, ws.tol_fid
    rows: List[Dict[str, Any]] = []
    # the abstract's compute claims, measured at the paper's shape (never scale-dependent)
    for c in claims:
        status = {HOLDS: REPRODUCED, DOES_NOT_HOLD: NOT_REPRODUCED, CLAIM_NOT_RUN: NOT_RUN}.get(c.verdict, NOT_TESTABLE)
        measured = status in (REPRODUCED, NOT_REPRODUCED)
        rows.append(
            {
                "section": "abstract",
                "claim": c.claim,
                "paper": c.paper,
                "source": c.source,
                "unverified": c.source in ws.unverified,
                "ours": c.evidence if measured else None,
                "scale": "paper shape" if measured else None,
                "status": status,
                "note": c.tolerance if measured else c.evidence.split(":")[0],
                "command": c.command if status == NOT_RUN else None,
                "flags": [],
            }
        )
    by_table = {"table1": [g for g in gains if g.metric == "top1"], "table2": [g for g in gains if g.metric == "fid"]}
    for claim in ref.get("headline_claims", []):
        members = [g for g in by_table[claim["table"]] if not claim.get("models") or g.model in claim["models"]]
        metric_tol = tol_top1 if claim["table"] == "table1" else tol_fid
        runs = _runs_by_model(ref[claim["table"]]["rows"])
        rows.append(
            _row(
                claim["claim"],
                claim.get("source"),
                members,
                ws,
                metric_tol,
                paper_text=claim.get("paper"),
                section="abstract",
                runs=runs,
            )
        )
    # Tables 1 and 2, one row per model with a paper value or a measurement: VCA minus baseline
    for table, label, unit, tol in (("table1", "Table 1", "top-1", tol_top1), ("table2", "Table 2", "FID", tol_fid)):
        for g in by_table[table]:
            if g.paper_value is None and g.ours_value is None and not g.stale:
                continue
            runs = _runs_by_model(ref[table]["rows"])
            rows.append(_row(f"{g.model}: VCA minus baseline, {unit}", None, [g], ws, tol, section=label, runs=runs))
    # Tables 3 and 4: VCA's own variant (the reference row) is the best, per branch
    for name in ("table3", "table4"):
        reference = ws.reference_row(name)["variant"]
        for metric, unit, tol in (("top1", "DeiT-T top-1", tol_top1), ("fid", "DiT-S/2 FID", tol_fid)):
            members = [g for g in ablation_gains[name] if g.metric == metric]
            runs = {g.model: g.runs.split(" − ") for g in members}
            rows.append(
                _row(
                    f"{ref[name]['title']}: each other variant minus {reference}, {unit} (the paper: every one worse)",
                    None,
                    members,
                    ws,
                    tol,
                    section=f"Table {name[-1]}",
                    runs=runs,
                )
            )
    return rows


def _runs_by_model(rows: Sequence[Dict[str, Any]]) -> Dict[str, List[str]]:
    """Each model's runs that its gain row (VCA minus baseline) compares: the lab-recipe twin and the control
    enter no summary row, so the command that runs what is missing does not name them."""
    out: Dict[str, List[str]] = {}
    for r in rows:
        if role(r) in ("baseline", "vca"):
            out.setdefault(r["model"], []).append(r["run"])
    return out
