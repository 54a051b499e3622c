"""The attention family: each member's published DeiT-T row, our counts and our runs beside MHSA and
VCA, and the decomposition of VCA's gain into its depthwise term and its contrast."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Dict, List, Optional, Tuple

from vcarepro.core.errors import BadInput
from vcarepro.metrics.intervals import Difference
from vcarepro.params.provenance import Stale
from vcarepro.report.holm import SIGN, Comparison, Judgement, judge
from vcarepro.report.verdicts import difference, exact_verdict, measured, stale_of
from vcarepro.report.workspace import Workspace


@dataclass(frozen=True)
class Published:
    """A number of the member's own paper, with its source mark."""

    value: Optional[str]
    source: Optional[str]
    unverified: bool


@dataclass(frozen=True)
class Count:
    """Parameters or GMACs at the paper's shape: our count of the published model, its verdict against the
    published number, and our count of the drop-in (DeiT-T with only the attention swapped)."""

    of_published: Optional[str]
    verdict: Optional[str]
    dropin: Optional[str]


@dataclass(frozen=True)
class FamilyDifference:
    """One difference of our runs, a sign only where it survives Holm's correction over the family table."""

    text: Optional[str]
    verdict: Optional[str]
    note: Optional[str]
    p_holm: Optional[str]
    flags: Tuple[str, ...]

    def judged(self, judgement: Judgement) -> "FamilyDifference":
        return replace(self, verdict=judgement.verdict, note=judgement.note, p_holm=judgement.p_holm)


@dataclass(frozen=True)
class FamilyMetric:
    """A member's number in one branch (top-1 of its DeiT-T, FID of its DiT-S/2) and its two differences."""

    value: Optional[str]
    scale: Optional[str]
    flags: Tuple[str, ...]
    stale: Optional[str]
    stale_detail: Optional[str]
    vs_mhsa: FamilyDifference  # the member minus MHSA
    vca_minus: FamilyDifference  # VCA minus the member

    def judged(self, vs_mhsa: Judgement, vca_minus: Judgement) -> "FamilyMetric":
        return replace(self, vs_mhsa=self.vs_mhsa.judged(vs_mhsa), vca_minus=self.vca_minus.judged(vca_minus))


@dataclass(frozen=True)
class FamilyRow:
    attention: str
    label: str
    cite: Optional[str]
    published_model: Optional[str]
    cls_run: str
    gen_run: str
    published_top1: Published
    published_params_m: Published
    published_gmacs: Published
    params_m: Count
    gmacs: Count
    top1: FamilyMetric
    fid: FamilyMetric

    def judged(self, *judgements: Judgement) -> "FamilyRow":
        """Judgements in the order top-1 minus MHSA, VCA minus it; FID minus MHSA, VCA minus it."""
        top1_vs, top1_minus, fid_vs, fid_minus = judgements
        return replace(self, top1=self.top1.judged(top1_vs, top1_minus), fid=self.fid.judged(fid_vs, fid_minus))

    def as_dict(self) -> Dict[str, Any]:
        """The flat record of the CSV / Markdown and results.json."""
        out: Dict[str, Any] = {
            "attention": self.attention,
            "label": self.label,
            "cite": self.cite,
            "published_model": self.published_model,
            "cls_run": self.cls_run,
            "gen_run": self.gen_run,
        }
        for key, p in (
            ("top1", self.published_top1),
            ("params_m", self.published_params_m),
            ("gmacs", self.published_gmacs),
        ):
            out.update(
                {
                    f"published_{key}": p.value,
                    f"published_{key}_source": p.source,
                    f"published_{key}_unverified": p.unverified,
                }
            )
        for key, c in (("params_m", self.params_m), ("gmacs", self.gmacs)):
            out.update(
                {
                    f"ours_published_{key}": c.of_published,
                    f"ours_published_{key}_verdict": c.verdict,
                    f"dropin_{key}": c.dropin,
                }
            )
        for metric, m in (("top1", self.top1), ("fid", self.fid)):
            out.update(
                {
                    metric: m.value,
                    f"{metric}_scale": m.scale,
                    f"{metric}_flags": list(m.flags),
                    f"{metric}_stale": m.stale,
                    f"{metric}_stale_detail": m.stale_detail,
                }
            )
            for label, d in (("vs_mhsa", m.vs_mhsa), ("vca_minus", m.vca_minus)):
                key = f"{metric}_{label}"
                out.update(
                    {
                        key: d.text,
                        f"{key}_verdict": d.verdict,
                        f"{key}_note": d.note,
                        f"{key}_p_holm": d.p_holm,
                        f"{key}_flags": list(d.flags),
                    }
                )
        return out


@dataclass(frozen=True)
class FamilyDecompositionRow:
    """One part of VCA's gain over MHSA in one branch."""

    branch: str
    metric: str
    part: str
    runs: str
    ours: Optional[str]
    scale: Optional[str]
    verdict: Optional[str]
    seeds_note: Optional[str]
    p_holm: Optional[str]
    stale: Optional[str]
    flags: Tuple[str, ...]

    def judged(self, judgement: Judgement) -> "FamilyDecompositionRow":
        return replace(self, verdict=judgement.verdict, seeds_note=judgement.note, p_holm=judgement.p_holm)

    def as_dict(self) -> Dict[str, Any]:
        return {
            "branch": self.branch,
            "metric": self.metric,
            "part": self.part,
            "runs": self.runs,
            "ours": self.ours,
            "scale": self.scale,
            "verdict": self.verdict,
            "seeds_note": self.seeds_note,
            "p_holm": self.p_holm,
            "stale": self.stale,
            "flags": list(self.flags),
        }


def _difference(ws: Workspace, metric: str, run_a: Optional[str], run_b: Optional[str]) -> Optional[Difference]:
    if not run_a or not run_b:
        return None
    return difference(
        measured(ws.result(metric, run_a), metric, ws.scale), measured(ws.result(metric, run_b), metric, ws.scale)
    )


def _stale(ws: Workspace, metric: str, *runs: Optional[str]) -> Optional[Stale]:
    return stale_of(*(ws.result(metric, run) for run in runs if run))


def _branch(metric: str) -> str:
    return "cls" if metric == "top1" else "gen"


def _published(ws: Workspace, entry) -> Published:
    pv = ws.paper_value(entry)
    return Published(None if not pv.available else f"{pv.value:.1f}", pv.source, pv.available and not pv.verified)


def _count(ws: Workspace, published: Dict[str, float], dropin: Dict[str, float], key: str, paper_entry) -> Count:
    value = published.get(key)
    return Count(
        None if value is None else f"{value:.2f}",
        None if value is None else exact_verdict(ws.paper_value(paper_entry), value, ws.tol_complexity),
        None if key not in dropin else f"{dropin[key]:.2f}",
    )


def _ours(
    ws: Workspace, metric: str, run: str, mhsa_run: str, vca_run: str
) -> Tuple[FamilyMetric, List[Optional[Comparison]]]:
    """A member's number in one branch, its difference from MHSA and VCA's from it (none where they are the
    same run: MHSA's own row, VCA's), and the comparisons that judge those differences."""
    kind = _branch(metric)
    value = measured(ws.result(metric, run), metric, ws.scale)
    stale = _stale(ws, metric, run)
    differences, comparisons = [], []
    for a, b in ((run, mhsa_run), (vca_run, run)):
        if a == b:
            differences.append(FamilyDifference(None, None, None, None, ()))
            comparisons.append(None)
            continue
        diff = _difference(ws, metric, a, b)
        flags = () if diff is None else (*ws.convergence(kind, a), *ws.convergence(kind, b))
        differences.append(FamilyDifference(None if diff is None else diff.text(), None, None, None, flags))
        comparisons.append(
            Comparison(diff, _stale(ws, metric, a, b), SIGN, pair=(metric, ws.run_used(a), metric, ws.run_used(b)))
        )
    vs_mhsa, vca_minus = differences
    return FamilyMetric(
        value=None if value is None else value.text(2 if metric == "fid" else 1),
        scale=None if value is None else ws.scale,
        flags=ws.convergence(kind, run),
        stale=stale.text if stale else None,
        stale_detail=stale.detail if stale else None,
        vs_mhsa=vs_mhsa,
        vca_minus=vca_minus,
    ), comparisons


def family(ws: Workspace) -> List[FamilyRow]:
    """Each family member beside MHSA and VCA: its published DeiT-T row, our counts, our runs' numbers.

    The published row is trained with the method's own recipe; our runs drop each layer into DeiT-T / DiT-S/2
    with the VCA row's recipe (docs/family.md).
    """
    fam = ws.ref["family"]
    base, vca = fam["baseline"], fam["vca"]
    rows, comparisons = [], []
    for r in [
        {"attention": "mhsa", "label": "MHSA (baseline)", **base},
        {"attention": "vca", "label": "VCA", **vca},
        *fam["rows"],
    ]:
        cls_model = ws.model_of(r["cls_run"]) or ws.paper_params.get("cls_runs", {}).get(r["cls_run"], {}).get("model")
        # the complexity stage counts each published model as models["<drop-in model>-published"]
        published = ws.complexity.get(f"{cls_model}-published", {}) if r.get("published_model") else {}
        dropin = ws.complexity.get(cls_model, {}) if cls_model else {}
        top1, top1_comparisons = _ours(ws, "top1", r["cls_run"], base["cls_run"], vca["cls_run"])
        fid, fid_comparisons = _ours(ws, "fid", r["gen_run"], base["gen_run"], vca["gen_run"])
        rows.append(
            FamilyRow(
                attention=r["attention"],
                label=r["label"],
                cite=r.get("cite"),
                published_model=r.get("published_model"),
                cls_run=ws.run_used(r["cls_run"]),
                gen_run=r["gen_run"],
                # the published "GFLOPs" count multiply-accumulates: the report names them GMACs throughout
                published_top1=_published(ws, r.get("top1")),
                published_params_m=_published(ws, r.get("params_m")),
                published_gmacs=_published(ws, r.get("gflops")),
                params_m=_count(ws, published, dropin, "params_m", r.get("params_m")),
                gmacs=_count(ws, published, dropin, "gmacs", r.get("gflops")),
                top1=top1,
                fid=fid,
            )
        )
        comparisons.append(top1_comparisons + fid_comparisons)
    rows, ws.comparisons["family"] = judge(rows, comparisons)
    return rows


def family_decomposition(ws: Workspace) -> List[FamilyDecompositionRow]:
    """MHSA -> MHSA+DWC -> VCA-DWC -> VCA per branch: how much of VCA's gain is its depthwise term.

    For FID a negative difference is the better one; the verdict names only a resolved sign.
    """
    steps = ws.ref["family"]["decomposition"]
    if len(steps) != 4:
        raise BadInput(
            "family.decomposition in data/paper_reference.yaml needs the four steps MHSA, "
            "MHSA + depthwise term, VCA without it, VCA, in that order."
        )
    mhsa, mhsa_dwc, vca_no_dwc, vca = steps
    parts = [
        ("depthwise term added to MHSA", mhsa_dwc, mhsa),
        ("VCA's attention without its depthwise term, minus MHSA", vca_no_dwc, mhsa),
        ("depthwise term added to VCA", vca, vca_no_dwc),
        ("VCA minus MHSA + depthwise term (both with the term)", vca, mhsa_dwc),
        ("total: VCA minus MHSA", vca, mhsa),
    ]
    rows, comparisons = [], []
    for branch, metric, run_key in (("DeiT-T", "top1", "cls_run"), ("DiT-S/2", "fid", "gen_run")):
        kind = _branch(metric)
        for label, a, b in parts:
            diff = _difference(ws, metric, a[run_key], b[run_key])
            stale = _stale(ws, metric, a[run_key], b[run_key])
            rows.append(
                FamilyDecompositionRow(
                    branch=branch,
                    metric="top-1" if metric == "top1" else "FID (lower is better)",
                    part=label,
                    runs=f"{ws.run_used(a[run_key])} − {ws.run_used(b[run_key])}",
                    ours=None if diff is None else diff.text(),
                    scale=None if diff is None else ws.scale,
                    verdict=None,
                    seeds_note=None,
                    p_holm=None,
                    stale=stale and stale.detail,
                    flags=(*ws.convergence(kind, a[run_key]), *ws.convergence(kind, b[run_key])),
                )
            )
            comparisons.append(
                (
                    Comparison(
                        diff, stale, SIGN, pair=(metric, ws.run_used(a[run_key]), metric, ws.run_used(b[run_key]))
                    ),
                )
            )
    rows, ws.comparisons["family_decomposition"] = judge(rows, comparisons)
    return rows
