"""VCA's differences: VCA minus baseline (Tables 1 and 2), each ablation minus its reference row (Tables 3 and 4),
and Table 1's gain split into recipe, backbone and attention; ours with Welch's interval, judged after Holm."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Dict, List, Optional, Tuple

from vcarepro.report.collect import RunResult
from vcarepro.report.holm import SIGN, Comparison, Judgement, judge
from vcarepro.report.rows import role
from vcarepro.report.verdicts import difference, measured, stale_of
from vcarepro.report.workspace import Workspace


@dataclass(frozen=True)
class GainRow:
    """other minus base for one model (or ablation variant) and metric: the paper's difference beside ours."""

    table: str
    model: str  # the model, or the ablation's variant
    metric: str  # top1 or fid
    label: str  # as the gains figure names it
    paper_value: Optional[float]
    ours_value: Optional[float]
    ours_low: Optional[float]
    ours_high: Optional[float]
    paper: Optional[str]
    source: Optional[str]
    ours: Optional[str]  # our difference with its interval, in words
    scale: Optional[str]
    unverified: bool
    direction: Optional[str]  # the verdict after Holm's correction
    seeds_note: Optional[str]
    p_holm: Optional[str]
    stale: Optional[str]
    flags: Tuple[str, ...]
    comparable: bool  # both sides at the paper's scale, recipe and (FID) protocol
    # (run, seeds) of both sides, for the summary's words on flags; the page's alone, so not in as_dict
    checked: Tuple[Tuple[str, int], ...] = ()

    def as_dict(self) -> Dict[str, Any]:
        return {
            "table": self.table,
            "model": self.model,
            "metric": self.metric,
            "label": self.label,
            "paper_value": self.paper_value,
            "ours_value": self.ours_value,
            "ours_low": self.ours_low,
            "ours_high": self.ours_high,
            "paper": self.paper,
            "source": self.source,
            "ours": self.ours,
            "scale": self.scale,
            "unverified": self.unverified,
            "direction": self.direction,
            "seeds_note": self.seeds_note,
            "p_holm": self.p_holm,
            "stale": self.stale,
            "flags": list(self.flags),
            "comparable": self.comparable,
        }

    def judged(self, judgement: Judgement) -> "GainRow":
        return replace(self, direction=judgement.verdict, seeds_note=judgement.note, p_holm=judgement.p_holm)


@dataclass(frozen=True)
class AblationGainRow(GainRow):
    runs: str = ""  # "<variant's run> − <reference row's run>"

    def as_dict(self) -> Dict[str, Any]:
        return {**super().as_dict(), "runs": self.runs}


@dataclass(frozen=True)
class DecompositionRow:
    """One part of a Table 1 backbone's gain: total, recipe, backbone or attention."""

    model: str
    part: str
    runs: str  # "<run> − <run>"
    paper: Optional[str]  # the paper's gain, on the total row only
    ours: Optional[str]
    scale: Optional[str]
    verdict: Optional[str]
    seeds_note: Optional[str]
    p_holm: Optional[str]
    stale: Optional[str]
    flags: Tuple[str, ...]

    def as_dict(self) -> Dict[str, Any]:
        return {
            "model": self.model,
            "part": self.part,
            "runs": self.runs,
            "paper": self.paper,
            "ours": self.ours,
            "scale": self.scale,
            "verdict": self.verdict,
            "seeds_note": self.seeds_note,
            "p_holm": self.p_holm,
            "stale": self.stale,
            "flags": list(self.flags),
        }

    def judged(self, judgement: Judgement) -> "DecompositionRow":
        return replace(self, verdict=judgement.verdict, seeds_note=judgement.note, p_holm=judgement.p_holm)


def _gain(
    ws: Workspace,
    table: str,
    label: str,
    metric: str,
    paper_base,
    paper_other,
    base: Optional[RunResult],
    other: Optional[RunResult],
    stat_base: Optional[str] = None,
    stat_other: Optional[str] = None,
) -> Tuple[GainRow, Comparison]:
    """other minus base: the paper's difference, ours with its 95% interval, and the comparison that judges it.

    Top-1 is read per side as its cell is (``top1_key``); the verdict is set by Holm's correction over the table.
    """
    pb, po = ws.paper_value(paper_base), ws.paper_value(paper_other)
    paper_gain = po.value - pb.value if pb.available and po.available else None
    key_base = ws.top1_key(stat_base)[0] if metric == "top1" else metric
    key_other = ws.top1_key(stat_other)[0] if metric == "top1" else metric
    diff = difference(measured(other, key_other, ws.scale), measured(base, key_base, ws.scale))
    stale = stale_of(base, other)
    branch = "cls" if metric == "top1" else "gen"
    # judged against the paper only where both sides are: paper scale, its recipe and (FID) its protocol
    comparable = (
        ws.cls_comparable
        if metric == "top1"
        else ws.gen_comparable and not any(ws.fid_protocol_deviations(r.name) for r in (base, other) if r is not None)
    )
    row = GainRow(
        table=table,
        model=label,
        metric=metric,
        label=f"{label} ({'top-1' if metric == 'top1' else 'FID'}){' [stale]' if stale else ''}",
        paper_value=paper_gain,
        ours_value=None if diff is None else diff.value,
        ours_low=None if diff is None else diff.low,
        ours_high=None if diff is None else diff.high,
        paper=None if paper_gain is None else f"{paper_gain:+.1f}",
        source=(None if paper_gain is None else pb.source if pb.source == po.source else f"{pb.source}/{po.source}"),
        ours=None if diff is None else diff.text(),
        scale=None if diff is None else ws.scale,
        unverified=bool(paper_gain is not None and not (pb.verified and po.verified)),
        direction=None,
        seeds_note=None,
        p_holm=None,
        stale=stale and stale.detail,
        flags=(*ws.convergence(branch, base and base.name), *ws.convergence(branch, other and other.name)),
        comparable=comparable,
        checked=(*ws.checked(branch, base and base.name), *ws.checked(branch, other and other.name)),
    )
    pair = (key_other, other and other.name, key_base, base and base.name)
    return row, Comparison(diff, stale, paper_gain, pair=pair)


def gains(ws: Workspace) -> List[GainRow]:
    """VCA minus baseline for every model of Tables 1 and 2: ours, at the scale measured, beside the paper's.

    At a small scale the direction of the effect is what a reader can compare, and only where our
    95% interval excludes zero (Welch's, over the per-seed values).
    """
    rows, comparisons = [], []
    for table, metric in (("table1", "top1"), ("table2", "fid")):
        by_model: Dict[str, Dict[str, Any]] = {}
        for r in ws.ref[table]["rows"]:
            by_model.setdefault(r["model"], {})[role(r)] = r
        for model, pair in by_model.items():
            if "baseline" not in pair or "vca" not in pair:
                continue
            base, vca = pair["baseline"], pair["vca"]
            row, comparison = _gain(
                ws,
                ws.ref[table]["title"],
                model,
                metric,
                base[metric],
                vca[metric],
                ws.result(metric, base["run"]),
                ws.result(metric, vca["run"]),
                base.get("statistic"),
                vca.get("statistic"),
            )
            rows.append(row)
            comparisons.append((comparison,))
    rows, ws.comparisons["gains"] = judge(rows, comparisons)
    return rows


def ablation_gains(ws: Workspace, name: str) -> List[AblationGainRow]:
    """Each ablation row minus the table's reference row (``reference: true``), per branch, with intervals."""
    table, ref = ws.ref[name], ws.reference_row(name)
    rows, comparisons = [], []
    for r in table["rows"]:
        if r is ref:
            continue
        for metric, run_key, results in (("top1", "cls_run", ws.cls), ("fid", "gen_run", ws.gen)):
            row, comparison = _gain(
                ws,
                table["title"],
                r["variant"],
                metric,
                ref[metric],
                r[metric],
                results.get(ref[run_key]),
                results.get(r[run_key]),
                table.get("statistic"),
                table.get("statistic"),
            )
            rows.append(AblationGainRow(**vars(row), runs=f"{r[run_key]} − {ref[run_key]}"))
            comparisons.append((comparison,))
    rows, ws.comparisons[f"{name}_gains"] = judge(rows, comparisons)
    return rows


def decomposition(ws: Workspace) -> List[DecompositionRow]:
    """Per backbone, the paper's gain beside ours split into what the recipe, the backbone and the attention do.

    Ours are final-epoch top-1 differences between our runs: recipe = baseline with the lab's recipe minus
    with the original one; backbone = the control (the lab's backbone change, own attention) minus the
    lab-recipe baseline; attention = VCA minus the lab-recipe baseline (or the control, where there is one).
    """
    by_model: Dict[str, Dict[str, Any]] = {}
    for r in ws.ref["table1"]["rows"]:
        by_model.setdefault(r["model"], {})[r["role"]] = r
    rows, comparisons = [], []
    for model, roles in by_model.items():
        base, twin, control, vca = (roles.get(k) for k in ("baseline", "twin", "control", "vca"))
        stat = ws.row_statistic  # the cells' read-out (twin and control: as the VCA row)
        if base is None or vca is None:
            continue
        pb, pv = ws.paper_value(base.get("top1")), ws.paper_value(vca.get("top1"))
        paper_gain = pv.value - pb.value if pb.available and pv.available else None
        reference = control or twin
        parts = [("total: VCA (lab's recipe) minus baseline (original recipe)", vca, base)]
        if twin is not None:
            parts.append(("recipe: baseline, lab's recipe minus original", twin, base))
        if control is not None:
            parts.append((f"backbone: {control['attention']} minus baseline, both lab's recipe", control, twin))
        if reference is not None:
            parts.append(
                (f"attention: VCA minus {'control' if control else 'baseline'}, both lab's recipe", vca, reference)
            )
        for label, a, b in parts:
            ra, rb = ws.cls_result(a["run"]), ws.cls_result(b["run"])
            ma = measured(ra, ws.top1_key(stat(a))[0], ws.scale)
            mb = measured(rb, ws.top1_key(stat(b))[0], ws.scale)
            diff = difference(ma, mb)
            total = a is vca and b is base
            same = ra is not None and ra is rb
            stale = None if same else stale_of(ra, rb)
            rows.append(
                DecompositionRow(
                    model=model,
                    part=label,
                    runs=f"{a['run']} − {b['run']}",
                    paper=f"{paper_gain:+.1f}" if paper_gain is not None and total else None,
                    ours="0 (the same run at this scale)" if same else (diff and diff.text()),
                    scale=None if diff is None else ws.scale,
                    verdict=None,
                    seeds_note=None,
                    p_holm=None,
                    stale=stale and stale.detail,
                    flags=() if same else (*ws.convergence("cls", a["run"]), *ws.convergence("cls", b["run"])),
                )
            )
            comparisons.append(
                (
                    None
                    if same
                    else Comparison(
                        diff,
                        stale,
                        paper_gain if total else SIGN,
                        pair=(ws.top1_key(stat(a))[0], ra and ra.name, ws.top1_key(stat(b))[0], rb and rb.name),
                    ),
                )
            )
    rows, ws.comparisons["decomposition"] = judge(rows, comparisons)
    return rows
