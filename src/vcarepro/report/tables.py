"""Report tables: paper value beside ours, with a verdict that never compares across scales."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import pandas as pd

from ..metrics.aggregate import per_seed_values
from ..metrics.intervals import Difference, direction, seeds_note, welch
from ..pipeline import cls_recipe, model_options
from ..provenance import Stale
from .collect import RunResult
from .reference import PaperValue, paper_value
from vcarepro.errors import BadInput

REPRODUCED = "reproduced"
BETTER = "better than paper"
SHORT = "short of paper"
NOT_COMPARABLE = "not comparable"
NOT_RUN = "not run"
NOT_FINITE = "not a finite number"
NO_PAPER_VALUE = "paper value not available"
# How a user runs the attention family (conf/family/all.yaml) when the report shows it as not run
FAMILY_COMMAND = "dvc exp run -S family=all"
MATCHES = "matches paper"
DIFFERS = "differs from paper"


STALE_PREFIX = "stale: "


def verdict_class(verdict: Optional[str]) -> str:
    """A verdict as a CSS class: "same direction as paper (resolved)" -> "same-direction-as-paper-resolved"."""
    if (verdict or "").startswith(STALE_PREFIX):
        return "stale"
    return (verdict or "").replace(" ", "-").replace("(", "").replace(")", "")


def stale_of(*results: Optional[RunResult]) -> Optional[Stale]:
    """The staleness of the runs a figure is computed from, as one: every stale run's stage re-run in one command."""
    stale = list(dict.fromkeys(r.stale for r in results if r is not None and r.stale is not None))
    if len(stale) <= 1:
        return stale[0] if stale else None
    return Stale(" ".join(s.stage for s in stale), tuple(f"{s.stage}: {f}" for s in stale for f in s.fields))


@dataclass
class Measured:
    mean: float
    std: float
    n_seeds: int
    scale: str
    values: Tuple[float, ...] = ()   # per seed, in seed order (what intervals are computed from)

    def text(self, digits: int = 1) -> str:
        if self.n_seeds > 1:
            return f"{self.mean:.{digits}f} ± {self.std:.{digits}f} (n={self.n_seeds})"
        return f"{self.mean:.{digits}f}"


def measured(result: Optional[RunResult], key: str, scale: str) -> Optional[Measured]:
    if result is None or result.metrics is None or key not in result.metrics:
        return None
    m = result.metrics
    return Measured(float(m[key]), float(m.get(f"{key}_std", 0.0)), int(m.get("n_seeds", 1)), scale,
                    tuple(per_seed_values(m, key)) or (float(m[key]),))


def verdict(paper: PaperValue, ours: Optional[Measured], *, comparable: bool, tolerance: float,
            lower_is_better: bool) -> str:
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
    if abs(diff) <= tolerance:
        return REPRODUCED
    return BETTER if (diff < 0) == lower_is_better else SHORT


def exact_verdict(paper: PaperValue, ours: Optional[float], tolerance: float) -> str:
    """For exact quantities (parameters, FLOPs at paper shape): within ``tolerance`` of the paper's value?"""
    if ours is None:
        return NOT_RUN
    if not paper.available:
        return NO_PAPER_VALUE
    return MATCHES if abs(ours - paper.value) <= tolerance + 1e-9 else DIFFERS


# Which of our top-1 figures answers a paper number, by the statistic the paper's number is
# (data/paper_reference.yaml): the metrics.json key and how the report names it.
STATISTICS = {
    "final": ("top1", "final epoch"),
    "final_ema": ("top1_ema", "final epoch, EMA weights"),
    "best": ("top1_best", "best epoch"),
    "best_ema": ("top1_best_ema", "best epoch, EMA weights"),
    "unknown": ("top1", "not stated; ours: final epoch"),
}


def difference(a: Optional[Measured], b: Optional[Measured]) -> Optional[Difference]:
    """a - b with Welch's 95% interval over the per-seed values (no interval when a side has one seed)."""
    if a is None or b is None:
        return None
    return welch(a.values, b.values)


@dataclass
class Cell:
    """One table cell: paper value (with source), ours (with scale), difference, verdict."""
    paper: PaperValue
    ours: Optional[Measured]
    verdict: str
    conflict: Optional[PaperValue] = None
    digits: int = 1
    statistic: Optional[str] = None   # which top-1 the paper's number is (and ours was read as)
    reason: Optional[str] = None      # why a number measured at paper scale is not comparable
    stale: Optional[Stale] = None     # the run's numbers on disk are not the current params' (verdict says so)

    @property
    def diff(self) -> Optional[float]:
        # no difference is printed where the numbers are not comparable: it would read as a result
        if self.ours is None or not self.paper.available or self.verdict in (NOT_COMPARABLE, NOT_FINITE):
            return None
        return self.ours.mean - self.paper.value

    def as_dict(self) -> Dict[str, Any]:
        return {
            "paper": None if not self.paper.available else f"{self.paper.value:.{self.digits}f}",
            "source": self.paper.source,
            "conflict": None if self.conflict is None or not self.conflict.available
            else (f"{self.conflict.value:.{self.digits}f}", self.conflict.source),
            "ours": None if self.ours is None else self.ours.text(self.digits),
            "scale": None if self.ours is None else self.ours.scale,
            "diff": None if self.diff is None else f"{self.diff:+.{self.digits}f}",
            "verdict": self.verdict,
            "verdict_class": verdict_class(self.verdict),
            "statistic": self.statistic,
            "reason": self.reason,
            "stale": None if self.stale is None else self.stale.detail,
        }


class TableBuilder:
    def __init__(self, reference: Dict[str, Any], params: Dict[str, Any], cls: Dict[str, RunResult],
                 gen: Dict[str, RunResult], complexity: Dict[str, Dict[str, float]],
                 attention_cost: Optional[Dict[str, Any]] = None, *, cls_comparable: bool,
                 gen_comparable: bool, paper_params: Optional[Dict[str, Any]] = None) -> None:
        self.ref = reference
        self.sources = reference["sources"]
        self.params = params
        self.paper_params = paper_params or params
        self.cls, self.gen = cls, gen
        self.complexity = complexity
        self.attention_cost = attention_cost
        self.scale = params["scale"]
        self.cls_comparable, self.gen_comparable = cls_comparable, gen_comparable
        tol = params["report"]
        self.tol_top1, self.tol_fid = tol["reproduce_tolerance_top1"], tol["reproduce_tolerance_fid"]
        self.tol_complexity = tol["complexity_tolerance"]

    def _pv(self, entry) -> PaperValue:
        return paper_value(entry, self.sources)

    def same_run(self, run: str) -> Optional[str]:
        """A run of this scale that trains exactly what ``run`` (a paper-scale run absent here) would.

        Looked for among the runs of the same backbone in Table 1 (same model, same recipe as resolved at this
        scale): at embedded scale the original and the lab's recipe collapse into the embedded one, so the
        lab-recipe twin of a baseline is the baseline run itself.
        """
        here, paper = self.params.get("cls_runs", {}), self.paper_params.get("cls_runs", {})
        if run in here or run not in paper:
            return None
        model = next((r["model"] for r in self.ref["table1"]["rows"] if r["run"] == run), None)
        wanted = (paper[run]["model"], cls_recipe(self.params, paper[run]["recipe"]))
        for row in self.ref["table1"]["rows"]:
            other = here.get(row["run"])
            if row["model"] == model and other is not None and \
                    (other["model"], cls_recipe(self.params, other["recipe"])) == wanted:
                return row["run"]
        return None

    def cls_result(self, run: str) -> Optional[RunResult]:
        return self.cls.get(run) or self.cls.get(self.same_run(run) or "")

    def top1_cell(self, run: str, entry, conflict=None, statistic: str = "final") -> Cell:
        key, label = STATISTICS[statistic]
        result = self.cls_result(run)
        ours = measured(result, key, self.scale)
        paper = self._pv(entry)
        stale = stale_of(result)
        return Cell(paper, ours, stale.text if stale else verdict(
                        paper, ours, comparable=self.cls_comparable, tolerance=self.tol_top1, lower_is_better=False),
                    self._pv(conflict) if conflict else None, statistic=label if paper.available else None,
                    stale=stale)

    def fid_protocol_deviations(self, run: str) -> List[str]:
        """How the run's FID was measured differently from the paper's protocol (data/paper_reference.yaml)."""
        result = self.gen.get(run)
        metrics = result.metrics if result is not None and result.metrics else {}
        if not metrics:
            return []
        expected = dict(self.ref["fid_protocol"])
        objective = self.params.get("gen_runs", {}).get(run, {}).get("objective")
        expected["sampler"], expected["sampler_steps"] = expected.pop("samplers").get(objective, (None, None))
        out = []
        for key, want in expected.items():
            got = metrics.get(key)
            if got is not None and got != want:
                out.append(PROTOCOL_DEVIATIONS.get(key, "{key} {got}").format(key=key, got=got, want=want))
        return out

    def fid_cell(self, run: str, entry, conflict=None) -> Cell:
        ours = measured(self.gen.get(run), "fid", self.scale)
        paper = self._pv(entry)
        deviations = self.fid_protocol_deviations(run) if self.gen_comparable else []
        stale = stale_of(self.gen.get(run))
        cell = Cell(paper, ours, stale.text if stale else verdict(
                        paper, ours, comparable=self.gen_comparable and not deviations, tolerance=self.tol_fid,
                        lower_is_better=True), self._pv(conflict) if conflict else None, stale=stale)
        if deviations and cell.verdict == NOT_COMPARABLE:
            cell.reason = "; ".join(deviations)
        return cell

    def protocol_text(self, run: str) -> Optional[str]:
        """The protocol a run's FID followed, in words, from its metrics.json."""
        result = self.gen.get(run)
        m = result.metrics if result is not None and result.metrics else None
        if not m or "reference" not in m:
            return None
        return (f"{m['sampler']} {m['sampler_steps']} steps, cfg {m['cfg_scale']}, {m['labels']} labels, "
                f"{m.get('num_samples')} samples, decoder {m['decoder']}, {m['reference']} reference, "
                f"trained {m['train_precision']}")

    def exact_cell(self, run: str, entry, key: str) -> Cell:
        model = self._model_of(run)
        value = self.complexity.get(model, {}).get(key) if model else None
        paper = self._pv(entry)
        ours = None if value is None else Measured(value, 0.0, 1, "paper shape")
        return Cell(paper, ours, exact_verdict(paper, value, self.tol_complexity), digits=2)

    def _cls_run_entry(self, run: str) -> Dict[str, Any]:
        """A classification run's params entry at this scale, or at paper scale where it runs only there."""
        for runs in (self.params.get("cls_runs", {}), self.paper_params.get("cls_runs", {})):
            if run in runs:
                return runs[run]
        return {}

    def _model_of(self, run: str) -> Optional[str]:
        return self._cls_run_entry(run).get("model") or (run if run in self.params.get("models", {}) else None)

    def table1(self) -> List[Dict[str, Any]]:
        rows = []
        for r in self.ref["table1"]["rows"]:
            same = self.same_run(r["run"])
            rows.append({"model": r["model"], "attention": r["attention"], "role": ROLES[r["role"]],
                         "recipe": self._cls_run_entry(r["run"]).get("recipe"), "run": r["run"],
                         "same_as": same,
                         "top1": self.top1_cell(r["run"], r.get("top1"), statistic=r.get("statistic", "final")).as_dict(),
                         "params_m": self.exact_cell(r["run"], r.get("params_m"), "params_m").as_dict(),
                         "gflops": self.exact_cell(r["run"], r.get("gflops"), "gmacs").as_dict()})
        return rows

    def decomposition(self) -> List[Dict[str, Any]]:
        """Per backbone, the paper's gain beside ours split into what the recipe, the backbone and the attention do.

        Ours are final-epoch top-1 differences between our runs: recipe = baseline with the lab's recipe minus
        with the original one; backbone = the control (the lab's backbone change, own attention) minus the
        lab-recipe baseline; attention = VCA minus the lab-recipe baseline (or the control, where there is one).
        """
        by_model: Dict[str, Dict[str, Any]] = {}
        for r in self.ref["table1"]["rows"]:
            by_model.setdefault(r["model"], {})[r["role"]] = r
        rows = []
        for model, roles in by_model.items():
            base, twin, control, vca = (roles.get(k) for k in ("baseline", "twin", "control", "vca"))
            if base is None or vca is None:
                continue
            pb, pv = self._pv(base.get("top1")), self._pv(vca.get("top1"))
            paper_gain = pv.value - pb.value if pb.available and pv.available else None
            reference = control or twin
            parts = [("total: VCA (lab's recipe) minus baseline (original recipe)", vca, base)]
            if twin is not None:
                parts.append(("recipe: baseline, lab's recipe minus original", twin, base))
            if control is not None:
                parts.append((f"backbone: {control['attention']} minus baseline, both lab's recipe", control, twin))
            if reference is not None:
                parts.append((f"attention: VCA minus {'control' if control else 'baseline'}, both lab's recipe",
                              vca, reference))
            for label, a, b in parts:
                ra, rb = self.cls_result(a["run"]), self.cls_result(b["run"])
                ma, mb = measured(ra, "top1", self.scale), measured(rb, "top1", self.scale)
                diff = difference(ma, mb)
                total = a is vca and b is base
                same = ra is not None and ra is rb
                stale = None if same else stale_of(ra, rb)
                rows.append({"model": model, "part": label, "runs": f"{a['run']} − {b['run']}",
                             "paper": f"{paper_gain:+.1f}" if paper_gain is not None and total else None,
                             "ours": "0 (the same run at this scale)" if same else (diff and diff.text()),
                             "scale": None if diff is None else self.scale,
                             "verdict": None if same else stale.text if stale else (
                                 direction(diff, paper_gain) if total else sign(diff)),
                             "seeds_note": None if same else seeds_note(diff),
                             "stale": stale and stale.detail})
        return rows

    def table2(self) -> List[Dict[str, Any]]:
        return [{"model": r["model"], "attention": r["attention"], "run": r["run"],
                 "fid": self.fid_cell(r["run"], r["fid"]).as_dict(), "protocol": self.protocol_text(r["run"])}
                for r in self.ref["table2"]["rows"]]

    def ablation(self, name: str) -> List[Dict[str, Any]]:
        rows = []
        for r in self.ref[name]["rows"]:
            conflict = r.get("conflict", {})
            rows.append({"variant": r["variant"], "cls_run": r["cls_run"], "gen_run": r["gen_run"],
                         "top1": self.top1_cell(r["cls_run"], r["top1"], conflict.get("top1"),
                                                statistic=self.ref[name].get("statistic", "final")).as_dict(),
                         "fid": self.fid_cell(r["gen_run"], r["fid"], conflict.get("fid")).as_dict()})
        return rows

    def gains(self) -> List[Dict[str, Any]]:
        """VCA minus baseline for every model of Tables 1 and 2: ours, at the scale measured, beside the paper's.

        At a small scale the direction of the effect is what a reader can compare, and only where our
        95% interval excludes zero (Welch's, over the per-seed values).
        """
        rows = []
        for table, metric, results in (("table1", "top1", self.cls), ("table2", "fid", self.gen)):
            by_model: Dict[str, Dict[str, Any]] = {}
            for r in self.ref[table]["rows"]:
                by_model.setdefault(r["model"], {})[_role(r)] = r
            for model, pair in by_model.items():
                if "baseline" not in pair or "vca" not in pair:
                    continue
                base, vca = pair["baseline"], pair["vca"]
                rows.append(self._gain_row(self.ref[table]["title"], model, metric, base[metric], vca[metric],
                                           results.get(base["run"]), results.get(vca["run"])))
        return rows

    def ablation_gains(self, name: str) -> List[Dict[str, Any]]:
        """Each ablation row minus the table's reference row (``reference: true``), per branch, with intervals."""
        table, ref = self.ref[name], self.reference_row(name)
        rows = []
        for r in table["rows"]:
            if r is ref:
                continue
            for metric, run_key, results in (("top1", "cls_run", self.cls), ("fid", "gen_run", self.gen)):
                row = self._gain_row(table["title"], r["variant"], metric, ref[metric], r[metric],
                                     results.get(ref[run_key]), results.get(r[run_key]))
                row["runs"] = f"{r[run_key]} − {ref[run_key]}"
                rows.append(row)
        return rows

    def reference_row(self, name: str) -> Dict[str, Any]:
        """The row of ablation table ``name`` that the others are compared with (``reference: true``)."""
        reference = [r for r in self.ref[name]["rows"] if r.get("reference")]
        if len(reference) != 1:
            raise BadInput(f"{name} in data/paper_reference.yaml needs exactly one row with reference: true.")
        return reference[0]

    def _gain_row(self, table: str, label: str, metric: str, paper_base, paper_other,
                  base: Optional[RunResult], other: Optional[RunResult]) -> Dict[str, Any]:
        """other minus base: the paper's difference, ours with its 95% interval, and the verdict they support."""
        pb, po = self._pv(paper_base), self._pv(paper_other)
        paper_gain = po.value - pb.value if pb.available and po.available else None
        diff = difference(measured(other, metric, self.scale), measured(base, metric, self.scale))
        stale = stale_of(base, other)
        return {
            "table": table, "model": label, "metric": metric,
            "label": f"{label} ({'top-1' if metric == 'top1' else 'FID'}){' [stale]' if stale else ''}",
            "paper_value": paper_gain, "ours_value": None if diff is None else diff.value,
            "ours_low": None if diff is None else diff.low, "ours_high": None if diff is None else diff.high,
            "paper": None if paper_gain is None else f"{paper_gain:+.1f}",
            "source": f"{pb.source}/{po.source}" if paper_gain is not None else None,
            "ours": None if diff is None else diff.text(),
            "scale": None if diff is None else self.scale,
            "direction": stale.text if stale else direction(diff, paper_gain),
            "seeds_note": seeds_note(diff),
            "stale": stale and stale.detail,
        }

    # -- the attention family (issue 15) ------------------------------------------------------------

    def _branch_difference(self, metric: str, run_a: Optional[str], run_b: Optional[str]) -> Optional[Difference]:
        results = self.cls_result if metric == "top1" else self.gen.get
        if not run_a or not run_b:
            return None
        return difference(measured(results(run_a), metric, self.scale), measured(results(run_b), metric, self.scale))

    def _branch_stale(self, metric: str, *runs: Optional[str]) -> Optional[Stale]:
        results = self.cls_result if metric == "top1" else self.gen.get
        return stale_of(*(results(run) for run in runs if run))

    def _run_used(self, run: str) -> str:
        """The run whose numbers stand for ``run`` at this scale (the baseline itself for its lab-recipe twin)."""
        return self.same_run(run) or run

    def family(self) -> List[Dict[str, Any]]:
        """Each family member beside MHSA and VCA: its published DeiT-T row, our counts, our runs' numbers.

        The published row is the method's own (source M), trained with its own recipe; our runs drop each
        layer into DeiT-T / DiT-S/2 with everything else equal (the recipe of the VCA row). Differences
        carry Welch's 95% interval and a sign only where it excludes zero.
        """
        fam = self.ref["family"]
        base, vca = fam["baseline"], fam["vca"]
        rows = []
        for r in [{"attention": "mhsa", "label": "MHSA (baseline)", **base},
                  {"attention": "vca", "label": "VCA", **vca}, *fam["rows"]]:
            cls_model = self._model_of(r["cls_run"]) or self.paper_params.get("cls_runs", {}).get(
                r["cls_run"], {}).get("model")
            # the complexity stage counts each published model as models["<drop-in model>-published"]
            published = self.complexity.get(f"{cls_model}-published", {}) if r.get("published_model") else {}
            dropin = self.complexity.get(cls_model, {}) if cls_model else {}
            row = {"attention": r["attention"], "label": r["label"], "cite": r.get("cite"),
                   "published_model": r.get("published_model"), "cls_run": self._run_used(r["cls_run"]),
                   "gen_run": r["gen_run"]}
            for key, entry in (("top1", r.get("top1")), ("params_m", r.get("params_m")), ("gflops", r.get("gflops"))):
                pv = self._pv(entry)
                row[f"published_{key}"] = None if not pv.available else f"{pv.value:.1f}"
                row[f"published_{key}_source"] = pv.source
            for key, ours_key in (("params_m", "params_m"), ("gflops", "gmacs")):
                value = published.get(ours_key)
                row[f"ours_published_{key}"] = None if value is None else f"{value:.2f}"
                row[f"ours_published_{key}_verdict"] = (
                    None if value is None else exact_verdict(self._pv(r.get(key)), value, self.tol_complexity))
                row[f"dropin_{key}"] = None if ours_key not in dropin else f"{dropin[ours_key]:.2f}"
            for metric, run_key, base_run, vca_run in (("top1", "cls_run", base["cls_run"], vca["cls_run"]),
                                                       ("fid", "gen_run", base["gen_run"], vca["gen_run"])):
                results = self.cls_result if metric == "top1" else self.gen.get
                ours = measured(results(r[run_key]), metric, self.scale)
                row[metric] = None if ours is None else ours.text(2 if metric == "fid" else 1)
                row[f"{metric}_scale"] = None if ours is None else self.scale
                stale = self._branch_stale(metric, r[run_key])
                row[f"{metric}_stale"], row[f"{metric}_stale_detail"] = (stale.text, stale.detail) if stale else (None, None)
                for label, a, b in (("vs_mhsa", r[run_key], base_run), ("vca_minus", vca_run, r[run_key])):
                    if a == b:
                        row[f"{metric}_{label}"] = row[f"{metric}_{label}_verdict"] = None
                        continue
                    diff = self._branch_difference(metric, a, b)
                    stale = self._branch_stale(metric, a, b)
                    row[f"{metric}_{label}"] = None if diff is None else diff.text()
                    row[f"{metric}_{label}_verdict"] = stale.text if stale else None if diff is None else sign(diff)
            rows.append(row)
        return rows

    def family_decomposition(self) -> List[Dict[str, Any]]:
        """MHSA -> MHSA+DWC -> VCA-DWC -> VCA per branch: how much of VCA's gain is its depthwise term.

        For FID a negative difference is the better one; the verdict names only a resolved sign.
        """
        steps = self.ref["family"]["decomposition"]
        if len(steps) != 4:
            raise BadInput("family.decomposition in data/paper_reference.yaml needs the four steps MHSA, "
                           "MHSA + depthwise term, VCA without it, VCA, in that order.")
        mhsa, mhsa_dwc, vca_no_dwc, vca = steps
        parts = [("depthwise term added to MHSA", mhsa_dwc, mhsa),
                 ("VCA's attention without its depthwise term, minus MHSA", vca_no_dwc, mhsa),
                 ("depthwise term added to VCA", vca, vca_no_dwc),
                 ("VCA minus MHSA + depthwise term (both with the term)", vca, mhsa_dwc),
                 ("total: VCA minus MHSA", vca, mhsa)]
        rows = []
        for branch, metric, run_key in (("DeiT-T", "top1", "cls_run"), ("DiT-S/2", "fid", "gen_run")):
            for label, a, b in parts:
                diff = self._branch_difference(metric, a[run_key], b[run_key])
                stale = self._branch_stale(metric, a[run_key], b[run_key])
                rows.append({"branch": branch, "metric": "top-1" if metric == "top1" else "FID (lower is better)",
                             "part": label, "runs": f"{self._run_used(a[run_key])} − {self._run_used(b[run_key])}",
                             "ours": None if diff is None else diff.text(),
                             "scale": None if diff is None else self.scale,
                             "verdict": stale.text if stale else None if diff is None else sign(diff),
                             "seeds_note": seeds_note(diff), "stale": stale and stale.detail})
        return rows

    def claims(self) -> List[Dict[str, str]]:
        """The abstract's claims, checked with the complexity stage's measurements at paper shape."""
        base, vca = self.complexity.get("deit_tiny-mhsa"), self.complexity.get("deit_tiny-vca")
        out = []
        for c in self.ref["claims"]:
            text, evidence, holds = c["claim"], "not measured by this pipeline", None
            if base and vca and "parameters" in text:
                added = vca["params_m"] - base["params_m"]
                evidence, holds = f"measured: +{added * 1e3:.1f}K parameters on DeiT-T", added < 0.3
            elif base and vca and "FLOPs" in text:
                ratio = vca["gmacs"] / base["gmacs"]
                evidence = (f"measured: {base['gmacs']:.4f} -> {vca['gmacs']:.4f} GMACs on DeiT-T at 224 "
                            f"({(ratio - 1) * 100:+.2f}%)")
                holds = round(vca["gmacs"], 1) == round(base["gmacs"], 1)
            elif "O(N n C)" in text and self.attention_cost:
                evidence, holds = self._scaling_evidence()
            verdict_text = "holds" if holds else ("does not hold" if holds is False else "not checked here")
            out.append({"claim": text, "source": c["source"], "evidence": evidence, "verdict": verdict_text,
                        "verdict_class": verdict_class(verdict_text)})
        return out


    def _scaling_evidence(self):
        """How one attention layer's MACs and time grow from the smallest to the largest token count."""
        rows = self.attention_cost["rows"]
        by = {(r["layer"], r["tokens"]): r for r in rows}
        # the claim compares VCA with MHSA; the other layers the stage measures do not enter it
        tokens = sorted({r["tokens"] for r in rows if ("mhsa", r["tokens"]) in by and ("vca", r["tokens"]) in by})
        if not tokens:
            return "VCA and MHSA were not both measured (attention_cost.layers)", None
        n0, n1 = tokens[0], tokens[-1]
        if n0 == n1:
            return "measured at one token count only; growth needs two (attention_cost.sides)", None
        ratio = {layer: {k: by[(layer, n1)][k] / by[(layer, n0)][k] for k in ("macs", "forward_backward_ms")}
                 for layer in ("mhsa", "vca")}
        tokens = n1 / n0
        evidence = (f"measured, one layer at DeiT-T width: N {n0} -> {n1} ({tokens:.0f}x tokens): VCA MACs "
                    f"{ratio['vca']['macs']:.1f}x, MHSA {ratio['mhsa']['macs']:.1f}x; forward+backward time VCA "
                    f"{ratio['vca']['forward_backward_ms']:.1f}x, MHSA {ratio['mhsa']['forward_backward_ms']:.1f}x "
                    f"({self.attention_cost['machine'].get('cpu')})")
        # linear: VCA's MACs grow no faster than the token count (within 10%), MHSA's faster
        return evidence, ratio["vca"]["macs"] <= 1.1 * tokens < ratio["mhsa"]["macs"]


def runs_frame(results: Dict[str, RunResult], runs: Dict[str, Any], models: Dict[str, Any],
               keys: List[str], shape: Dict[str, Any]) -> pd.DataFrame:
    """Every run of a branch: its model, seeds and aggregated metrics.

    Attention options are the ones the run actually used: the model's, with the scale's
    contrast-token count (``shape``) in place of the paper-shape one.
    """
    records = []
    for name, run in runs.items():
        spec = models.get(run["model"], {})
        _, options = model_options(spec.get("attention"), spec.get("options"), shape)
        record = {"run": name, "model": run["model"], "attention": spec.get("attention"),
                  "attention options": ", ".join(f"{k}={v}" for k, v in (options or {}).items()),
                  "seeds": ", ".join(map(str, run["seeds"]))}
        if "objective" in run:
            record["objective"] = run["objective"]
        m = results[name].metrics if name in results else None
        stale = results[name].stale if name in results else None
        for key in keys:
            if stale is not None:
                record[key] = stale.text
            elif m is None or key not in m:
                record[key] = "not run"
            elif m.get("n_seeds", 1) > 1:
                record[key] = f"{m[key]:.2f} ± {m[key + '_std']:.2f}"
            else:
                record[key] = f"{m[key]:.2f}"
        records.append(record)
    return pd.DataFrame.from_records(records)


# How a FID's protocol differs from the paper's, in words ({got}: the run's, {want}: the paper's).
PROTOCOL_DEVIATIONS = {
    "reference": "{got} reference statistics (the paper's: ADM's reference batch)",
    "labels": "{got} labels (the paper's: {want})",
    "decoder": "decoder {got} (the paper's: {want})",
    "train_precision": "trained in {got} (the paper's: {want})",
    "cfg_scale": "cfg {got} (the paper's: {want})",
    "num_samples": "{got} samples (the paper's: {want})",
    "fid_feature_dims": "FID over {got} feature coordinates (the paper's: all {want})",
    "sampler": "sampler {got} (the paper's: {want})",
    "sampler_steps": "{got} sampler steps (the paper's: {want})",
}

ROLES = {"baseline": "baseline (original recipe)", "twin": "baseline (lab's recipe)",
         "control": "control (lab's backbone, own attention)", "vca": "VCA (lab's recipe)"}


def _role(row: Dict[str, Any]) -> str:
    """A reference row's role; Table 2's rows are MHSA / VCA pairs without one."""
    return row.get("role") or ("vca" if row["attention"] == "VCA" else "baseline")


def sign(diff: Optional[Difference]) -> str:
    """For a difference without a paper counterpart: its sign, only where the interval resolves it."""
    if diff is None or not diff.has_interval or not diff.resolved:
        return direction(diff, None)
    return "positive (resolved)" if diff.value > 0 else "negative (resolved)"
