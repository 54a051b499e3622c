"""Report tables: paper value beside ours, with a verdict that never compares across scales."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import pandas as pd

from vcarepro.metrics.aggregate import per_seed_values
from vcarepro.metrics.intervals import Difference, direction, holm, holm_adjusted, seeds_note, welch
from vcarepro.core.choices import model_options
from vcarepro.metrics.protocol import deviations as protocol_deviations, describe as describe_protocol
from vcarepro.params.provenance import Stale
from vcarepro.report.collect import RunResult
from vcarepro.report.howto import HowToRun, Matrices, plan_text, scale_command
from vcarepro.report.reference import PaperValue, paper_value, unverified_sources
from vcarepro.report.rows import STATISTICS, answering_run, role as _role, seed_values
from vcarepro.core.errors import BadInput

REPRODUCED = "reproduced"
BETTER = "better than paper"
SHORT = "short of paper"
NOT_COMPARABLE = "not comparable"
NOT_RUN = "not run"
NOT_FINITE = "not a finite number"
NO_PAPER_VALUE = "paper value not available"
# How a user runs the attention family (conf/family/all.yaml) at embedded scale when the report shows it as not run
FAMILY_COMMAND = scale_command("embedded", True, "embedded")
# How a user runs the rows that only the paper scale's run list holds (a branch of its own; docs/scales.md)
PAPER_COMMAND = scale_command("paper", False, "embedded")
MATCHES = "matches paper"
DIFFERS = "differs from paper"


STALE_PREFIX = "stale: "
# appended to a verdict judged against a second-hand paper value (data/paper_reference.yaml `unverified`)
UNVERIFIED = " (unverified value)"

# The read-out rule: which of our top-1 figures every cell, difference and interval uses, per scale.
READOUT_RULES = {
    "paper": "each row is read as its source reports it (the statistic under the paper's number: final or best "
             "epoch, raw or EMA weights), and every difference and interval uses the same read-out as its cells",
    "other": "the final epoch's weights, for every run, cell, difference and interval: picking the best epoch on "
             "the only held-out split would select on the test data and read optimistically",
}
# Convergence: a classification seed whose validation top-1 spans more than this over its last three evaluations
# has not flattened; one whose final top-1 is below the non-neural reference (cls_reference) ends below it.
FLAT_TOP1_POINTS = 1.0
# a generation seed whose mean training loss over the last tenth of its logged steps is more than this fraction
# below the tenth before is still falling
FLAT_LOSS_FRACTION = 0.05


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
                    seed_values(m, key))


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
    flags: Tuple[str, ...] = ()       # convergence flags of the seeds ours is computed from

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
            "unverified": self.paper.available and not self.paper.verified,
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
            "flags": list(self.flags),
        }


class TableBuilder:
    def __init__(self, reference: Dict[str, Any], params: Dict[str, Any], cls: Dict[str, RunResult],
                 gen: Dict[str, RunResult], complexity: Dict[str, Dict[str, float]],
                 attention_cost: Optional[Dict[str, Any]] = None, *, cls_comparable: bool,
                 gen_comparable: bool, paper_params: Optional[Dict[str, Any]] = None,
                 reference_top1: Optional[Tuple[float, str]] = None,
                 attention_macs: Optional[Dict[str, Any]] = None, matrices: Optional[Matrices] = None) -> None:
        self.ref = reference
        self.sources = reference["sources"]
        self.unverified = unverified_sources(reference)
        self.reference_top1 = reference_top1  # (value, name) of the non-neural reference on the same split
        self.params = params
        self.paper_params = paper_params or params
        self.cls, self.gen = cls, gen
        self.complexity = complexity
        self.attention_cost = attention_cost
        self.attention_macs = attention_macs  # metrics/attention_macs.json: exact MACs (times: attention_cost)
        self.scale = params["scale"]
        self.cls_comparable, self.gen_comparable = cls_comparable, gen_comparable
        tol = params["report"]
        self.tol_top1, self.tol_fid = tol["reproduce_tolerance_top1"], tol["reproduce_tolerance_fid"]
        self.tol_complexity = tol["complexity_tolerance"]
        self.comparisons: Dict[str, int] = {}  # table -> differences with an interval in its Holm correction
        # (branch, run) -> its convergence flags: every cell, gain row and family difference of a run asks
        self._convergence: Dict[Tuple[str, Optional[str]], Tuple[str, ...]] = {}
        # every scale's run list (howto.scale_matrices); without it, this scale's and the paper scale's
        if matrices is None:
            matrices = {self.scale: {False: params}}
            if paper_params is not None:
                matrices.setdefault("paper", {False: paper_params})
        paper_all = matrices.get("paper", {}).get(True) or self.paper_params
        self._howto = HowToRun(params, matrices, lambda run, where: answering_run(run, where, paper_all, reference))
        self.plans: Dict[str, List[Dict[str, Any]]] = {}   # how_to_run's text -> its plan (the page renders it)

    def _pv(self, entry) -> PaperValue:
        return paper_value(entry, self.sources, self.unverified)

    @property
    def readout_rule(self) -> str:
        return READOUT_RULES["paper" if self.scale == "paper" else "other"]

    def top1_key(self, statistic: Optional[str]) -> Tuple[str, str]:
        """The metrics.json key and name of our top-1 for a row whose paper number is ``statistic`` (READOUT_RULES)."""
        if self.scale == "paper":
            return STATISTICS[statistic or "final"]
        return "top1", "final epoch"

    def convergence(self, branch: str, run: Optional[str]) -> Tuple[str, ...]:
        """The convergence flags of a run's seeds: not flattened, or ending below the non-neural reference."""
        if (branch, run) not in self._convergence:
            self._convergence[branch, run] = self._flags(branch, run)
        return self._convergence[branch, run]

    def _flags(self, branch: str, run: Optional[str]) -> Tuple[str, ...]:
        result = (self.cls_result(run) if branch == "cls" else self.gen.get(run)) if run else None
        if result is None or not result.metrics:
            return ()
        name, m, flags = result.name, result.metrics, []
        if branch == "cls":
            spread = per_seed_values(m, "plateau_spread")
            final = per_seed_values(m, "top1") or [m["top1"]]
            seeds = self._seeds("cls", name, len(final))
            for i, seed in enumerate(seeds):
                if i < len(spread) and spread[i] > FLAT_TOP1_POINTS:
                    flags.append(f"{name} seed {seed}: not flattened (last 3 evaluations span {spread[i]:.1f} points)")
                if self.reference_top1 and final[i] < self.reference_top1[0]:
                    flags.append(f"{name} seed {seed}: ends below the {self.reference_top1[1]} reference "
                                 f"({final[i]:.1f} < {self.reference_top1[0]:.1f})")
        else:
            for seed, points in sorted(result.curves.get("train/loss", {}).items()):
                tenth = len(points) // 10
                if tenth < 2:
                    continue
                last = sum(v for _, v in points[-tenth:]) / tenth
                before = sum(v for _, v in points[-2 * tenth:-tenth]) / tenth
                if before > 0 and (before - last) / before > FLAT_LOSS_FRACTION:
                    flags.append(f"{name} seed {seed}: training loss still falling "
                                 f"({(before - last) / before:.0%} over the last tenth of its steps)")
        return tuple(flags)

    def has_results(self, run: str) -> bool:
        """Whether ``run`` (or the run that answers it here) has numbers on disk, current or stale."""
        result = self.cls_result(run) or self.gen.get(run)   # run names are distinct across the branches
        return result is not None and (result.metrics is not None or result.stale is not None)

    def run_plan(self, runs) -> List[Dict[str, Any]]:
        """How to run those of ``runs`` (names of cls or gen runs) that have no numbers (``howto.HowToRun.plan``)."""
        missing = [r for r in dict.fromkeys(runs) if r and not self.has_results(r)]
        return self._howto.plan(missing)

    def how_to_run(self, runs) -> str:
        """The command that would run ``runs`` (names of cls or gen runs), for a "not run" line: this scale's
        ``dvc repro`` for runs of its list, else the scale(s) whose list has them, with their command."""
        plan = self.run_plan(runs)
        text = plan_text(plan)
        self.plans[text] = plan
        return text

    def _seeds(self, branch: str, name: str, n: int) -> List[Any]:
        seeds = list((self.params.get(f"{branch}_runs", {}).get(name) or {}).get("seeds") or [])
        return seeds if len(seeds) == n else list(range(n))

    def same_run(self, run: str) -> Optional[str]:
        """The run of this scale that stands in for ``run`` (a paper-scale run absent here), or None:
        ``rows.answering_run``, where the rule is stated once for the tables and the model card."""
        answer = answering_run(run, self.params, self.paper_params, self.ref)
        return None if answer == run else answer

    def cls_result(self, run: str) -> Optional[RunResult]:
        return self.cls.get(run) or self.cls.get(self.same_run(run) or "")

    def top1_cell(self, run: str, entry, conflict=None, statistic: str = "final") -> Cell:
        key, label = self.top1_key(statistic)
        result = self.cls_result(run)
        ours = measured(result, key, self.scale)
        paper = self._pv(entry)
        stale = stale_of(result)
        paper_label = STATISTICS[statistic][1]
        said = label if paper_label == label else f"paper: {paper_label}; ours: {label}"
        return Cell(paper, ours, stale.text if stale else verdict(
                        paper, ours, comparable=self.cls_comparable, tolerance=self.tol_top1, lower_is_better=False),
                    self._pv(conflict) if conflict else None, statistic=said if paper.available else None,
                    stale=stale, flags=self.convergence("cls", run))

    def fid_protocol_deviations(self, run: str) -> List[str]:
        """How the run's FID was measured differently from the paper's protocol (data/paper_reference.yaml)."""
        result = self.gen.get(run)
        metrics = result.metrics if result is not None and result.metrics else {}
        if not metrics:
            return []
        return protocol_deviations(metrics, self.ref["fid_protocol"],
                                   self.params.get("gen_runs", {}).get(run, {}).get("objective"))

    def fid_cell(self, run: str, entry, conflict=None) -> Cell:
        ours = measured(self.gen.get(run), "fid", self.scale)
        paper = self._pv(entry)
        deviations = self.fid_protocol_deviations(run) if self.gen_comparable else []
        stale = stale_of(self.gen.get(run))
        cell = Cell(paper, ours, stale.text if stale else verdict(
                        paper, ours, comparable=self.gen_comparable and not deviations, tolerance=self.tol_fid,
                        lower_is_better=True), self._pv(conflict) if conflict else None, stale=stale,
                    flags=self.convergence("gen", run))
        if deviations and cell.verdict == NOT_COMPARABLE:
            cell.reason = "; ".join(deviations)
        return cell

    def protocol_text(self, run: str) -> Optional[str]:
        """The protocol a run's FID followed, in words, from its metrics.json (eval_gen copied it from the samples')."""
        result = self.gen.get(run)
        m = result.metrics if result is not None and result.metrics else None
        if not m or "reference" not in m:
            return None
        return describe_protocol(m)

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

    def row_statistic(self, row: Dict[str, Any]) -> str:
        """Which top-1 a Table 1 row is read as: its own statistic, or for the rows the paper did not run (the
        lab-recipe baseline, the control; trained with the lab's recipe) the statistic of its backbone's VCA row."""
        if row.get("statistic"):
            return row["statistic"]
        if row.get("role") in ("twin", "control"):
            vca = next((r for r in self.ref["table1"]["rows"] if r["model"] == row["model"] and r["role"] == "vca"), {})
            return vca.get("statistic", "final")
        return "final"

    def table1(self) -> List[Dict[str, Any]]:
        """Each Table 1 row (data/paper_reference.yaml) beside ours: top-1, parameters, GMACs.

        Where each number is made: ``top1`` is ``runs/cls/<run>/metrics.json``, written by the ``eval_cls@RUN``
        stage (stages/eval_cls.py): the final weights' top-1 by ``vcarepro.train.classification.evaluate``,
        the best epoch's (``top1_best``, ``top1_best_ema``) by ``classification.best_epoch_figures`` from the
        per-epoch validation ``train_cls`` logged, averaged over seeds by ``metrics.aggregate.aggregate_seeds``;
        which key a row reads is ``top1_key`` (``rows.STATISTICS``), which run answers it ``rows.answering_run``.
        ``params_m`` / ``gmacs`` are ``metrics/complexity.json``, written by the ``complexity`` stage
        (stages/complexity.py) with ``vcarepro.metrics.complexity.model_complexity`` at the paper's shape.
        """
        rows = []
        for r in self.ref["table1"]["rows"]:
            same = self.same_run(r["run"])
            rows.append({"model": r["model"], "attention": r["attention"], "role": ROLES[r["role"]],
                         "recipe": self._cls_run_entry(r["run"]).get("recipe"), "run": r["run"],
                         "same_as": same,
                         "top1": self.top1_cell(r["run"], r.get("top1"), statistic=self.row_statistic(r)).as_dict(),
                         "params_m": self.exact_cell(r["run"], r.get("params_m"), "params_m").as_dict(),
                         "gmacs": self.exact_cell(r["run"], r.get("gflops"), "gmacs").as_dict()})
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
            stat = self.row_statistic  # the cells' read-out (twin and control: as the VCA row)
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
                ma = measured(ra, self.top1_key(stat(a))[0], self.scale)
                mb = measured(rb, self.top1_key(stat(b))[0], self.scale)
                diff = difference(ma, mb)
                total = a is vca and b is base
                same = ra is not None and ra is rb
                stale = None if same else stale_of(ra, rb)
                row = {"model": model, "part": label, "runs": f"{a['run']} − {b['run']}",
                       "paper": f"{paper_gain:+.1f}" if paper_gain is not None and total else None,
                       "ours": "0 (the same run at this scale)" if same else (diff and diff.text()),
                       "scale": None if diff is None else self.scale, "verdict": None, "seeds_note": None,
                       "p_holm": None, "stale": stale and stale.detail,
                       "flags": [] if same else [*self.convergence("cls", a["run"]), *self.convergence("cls", b["run"])]}
                if not same:
                    row["_tests"] = [_test(diff, "verdict", "seeds_note", "p_holm", stale,
                                           paper_gain if total else SIGN,
                                           pair=(self.top1_key(stat(a))[0], ra and ra.name,
                                                 self.top1_key(stat(b))[0], rb and rb.name))]
                rows.append(row)
        return self._correct(rows, "decomposition")

    def table2(self) -> List[Dict[str, Any]]:
        """Each Table 2 row (data/paper_reference.yaml) beside ours: FID-50K and the protocol it followed.

        Where each number is made: ``fid`` is ``runs/gen/<run>/metrics.json``, written by the ``eval_gen@RUN``
        stage (stages/eval_gen.py) with ``vcarepro.metrics.evaluator.evaluate_samples`` over the ``.npz`` samples
        ``sample_gen@RUN`` drew (``vcarepro.train.sampling``), against ``fid_reference``'s statistics; the
        protocol is the samples' ``protocol.json`` that eval_gen copied (``vcarepro.metrics.protocol``), worded by
        ``protocol.describe`` and compared with the paper's by ``protocol.deviations``.
        """
        return [{"model": r["model"], "attention": r["attention"], "run": r["run"],
                 "fid": self.fid_cell(r["run"], r["fid"]).as_dict(), "protocol": self.protocol_text(r["run"])}
                for r in self.ref["table2"]["rows"]]

    def ablation(self, name: str) -> List[Dict[str, Any]]:
        """Each row of ablation table ``name`` (Table 3 or 4): ours beside the paper's, per branch.

        ``top1``: the row's ``cls_run``'s metrics.json from ``eval_cls@RUN`` (``classification.evaluate`` /
        ``best_epoch_figures``, as in ``table1``), read with the table's statistic. ``fid``: the row's
        ``gen_run``'s ``runs/gen/<run>/metrics.json``, written by the ``eval_gen@RUN`` stage (stages/eval_gen.py)
        with ``vcarepro.metrics.evaluator.evaluate_samples`` over the samples ``sample_gen@RUN`` drew.
        """
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
        for table, metric, results in (("table1", "top1", self.cls_result), ("table2", "fid", self.gen.get)):
            by_model: Dict[str, Dict[str, Any]] = {}
            for r in self.ref[table]["rows"]:
                by_model.setdefault(r["model"], {})[_role(r)] = r
            for model, pair in by_model.items():
                if "baseline" not in pair or "vca" not in pair:
                    continue
                base, vca = pair["baseline"], pair["vca"]
                rows.append(self._gain_row(self.ref[table]["title"], model, metric, base[metric], vca[metric],
                                           results(base["run"]), results(vca["run"]),
                                           base.get("statistic"), vca.get("statistic")))
        return self._correct(rows, "gains")

    def ablation_gains(self, name: str) -> List[Dict[str, Any]]:
        """Each ablation row minus the table's reference row (``reference: true``), per branch, with intervals."""
        table, ref = self.ref[name], self.reference_row(name)
        rows = []
        for r in table["rows"]:
            if r is ref:
                continue
            for metric, run_key, results in (("top1", "cls_run", self.cls), ("fid", "gen_run", self.gen)):
                row = self._gain_row(table["title"], r["variant"], metric, ref[metric], r[metric],
                                     results.get(ref[run_key]), results.get(r[run_key]),
                                     table.get("statistic"), table.get("statistic"))
                row["runs"] = f"{r[run_key]} − {ref[run_key]}"
                rows.append(row)
        return self._correct(rows, f"{name}_gains")

    def reference_row(self, name: str) -> Dict[str, Any]:
        """The row of ablation table ``name`` that the others are compared with (``reference: true``)."""
        reference = [r for r in self.ref[name]["rows"] if r.get("reference")]
        if len(reference) != 1:
            raise BadInput(f"{name} in data/paper_reference.yaml needs exactly one row with reference: true.")
        return reference[0]

    def _gain_row(self, table: str, label: str, metric: str, paper_base, paper_other,
                  base: Optional[RunResult], other: Optional[RunResult], stat_base: Optional[str] = None,
                  stat_other: Optional[str] = None) -> Dict[str, Any]:
        """other minus base: the paper's difference, ours with its 95% interval, and the verdict they support.

        Top-1 is read per side as its cell is (``top1_key``); the verdict is set by ``_correct`` (Holm).
        """
        pb, po = self._pv(paper_base), self._pv(paper_other)
        paper_gain = po.value - pb.value if pb.available and po.available else None
        key_base = self.top1_key(stat_base)[0] if metric == "top1" else metric
        key_other = self.top1_key(stat_other)[0] if metric == "top1" else metric
        diff = difference(measured(other, key_other, self.scale), measured(base, key_base, self.scale))
        stale = stale_of(base, other)
        branch = "cls" if metric == "top1" else "gen"
        # judged against the paper only where both sides are: paper scale, its recipe and (FID) its protocol
        comparable = self.cls_comparable if metric == "top1" else self.gen_comparable and not any(
            self.fid_protocol_deviations(r.name) for r in (base, other) if r is not None)
        return {
            "table": table, "model": label, "metric": metric,
            "label": f"{label} ({'top-1' if metric == 'top1' else 'FID'}){' [stale]' if stale else ''}",
            "paper_value": paper_gain, "ours_value": None if diff is None else diff.value,
            "ours_low": None if diff is None else diff.low, "ours_high": None if diff is None else diff.high,
            "paper": None if paper_gain is None else f"{paper_gain:+.1f}",
            "source": (None if paper_gain is None else pb.source if pb.source == po.source
                       else f"{pb.source}/{po.source}"),
            "ours": None if diff is None else diff.text(),
            "scale": None if diff is None else self.scale,
            "unverified": bool(paper_gain is not None and not (pb.verified and po.verified)),
            "direction": None, "seeds_note": None, "p_holm": None,
            "stale": stale and stale.detail,
            "flags": [*self.convergence(branch, base and base.name), *self.convergence(branch, other and other.name)],
            "comparable": comparable,
            "_tests": [_test(diff, "direction", "seeds_note", "p_holm", stale, paper_gain,
                             pair=(key_other, other and other.name, key_base, base and base.name))],
        }

    def _correct(self, rows: List[Dict[str, Any]], table: str) -> List[Dict[str, Any]]:
        """Verdicts for every difference of one table after Holm's correction over the table's comparisons.

        ``self.comparisons[table]`` keeps how many differences with an interval entered the correction.
        """
        entries = [(row, t) for row in rows for t in row.pop("_tests", [])]
        p_values = [None if t["diff"] is None or t["stale"] else t["diff"].p_value for _, t in entries]
        # each distinct comparison once: its first appearance carries its p-value into the correction
        keys = [t["pair"] or i for i, (_, t) in enumerate(entries)]
        first = {}
        for i, (key, p) in enumerate(zip(keys, p_values)):
            if p is not None:
                first.setdefault(key, i)
        distinct = [p if first.get(key) == i else None for i, (key, p) in enumerate(zip(keys, p_values))]
        decided_once, adjusted_once = holm(distinct), holm_adjusted(distinct)
        decided = [decided_once[first[k]] if k in first else None for k in keys]
        adjusted = [adjusted_once[first[k]] if k in first else None for k in keys]
        self.comparisons[table] = len(first)
        for (row, t), resolved, p_holm in zip(entries, decided, adjusted):
            if t["stale"] is not None:
                row[t["verdict"]] = t["stale"].text
                continue
            row[t["verdict"]] = (sign(t["diff"], resolved) if t["paper"] is SIGN
                                 else direction(t["diff"], t["paper"], resolved))
            row[t["note"]] = seeds_note(t["diff"], resolved)
            row[t["p"]] = None if p_holm is None else f"{p_holm:.3f}"
            if t.get("resolved_key"):
                row[t["resolved_key"]] = resolved
        return rows

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

        Where each number is made: ``top1`` by ``eval_cls@RUN`` (``classification.evaluate``, final epoch), ``fid``
        by ``eval_gen@RUN`` (``metrics.evaluator.evaluate_samples``), each run's metrics.json; the parameter and
        GMAC counts (ours of the published model and of the drop-in) by the ``complexity`` stage
        (``metrics.complexity.model_complexity``, metrics/complexity.json); the MHSA baseline's run is
        ``rows.answering_run`` of the family's ``baseline.cls_run``.
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
            # the published "GFLOPs" count multiply-accumulates: the report names them GMACs throughout
            for key, entry in (("top1", r.get("top1")), ("params_m", r.get("params_m")), ("gmacs", r.get("gflops"))):
                pv = self._pv(entry)
                row[f"published_{key}"] = None if not pv.available else f"{pv.value:.1f}"
                row[f"published_{key}_source"] = pv.source
                row[f"published_{key}_unverified"] = pv.available and not pv.verified
            for key, paper_key in (("params_m", "params_m"), ("gmacs", "gflops")):
                value = published.get(key)
                row[f"ours_published_{key}"] = None if value is None else f"{value:.2f}"
                row[f"ours_published_{key}_verdict"] = (
                    None if value is None else exact_verdict(self._pv(r.get(paper_key)), value, self.tol_complexity))
                row[f"dropin_{key}"] = None if key not in dropin else f"{dropin[key]:.2f}"
            row["_tests"] = []
            for metric, run_key, base_run, vca_run in (("top1", "cls_run", base["cls_run"], vca["cls_run"]),
                                                       ("fid", "gen_run", base["gen_run"], vca["gen_run"])):
                results = self.cls_result if metric == "top1" else self.gen.get
                ours = measured(results(r[run_key]), metric, self.scale)
                row[metric] = None if ours is None else ours.text(2 if metric == "fid" else 1)
                row[f"{metric}_scale"] = None if ours is None else self.scale
                row[f"{metric}_flags"] = list(self.convergence("cls" if metric == "top1" else "gen", r[run_key]))
                stale = self._branch_stale(metric, r[run_key])
                row[f"{metric}_stale"], row[f"{metric}_stale_detail"] = (stale.text, stale.detail) if stale else (None, None)
                for label, a, b in (("vs_mhsa", r[run_key], base_run), ("vca_minus", vca_run, r[run_key])):
                    key = f"{metric}_{label}"
                    row[key] = row[f"{key}_verdict"] = row[f"{key}_note"] = row[f"{key}_p_holm"] = None
                    row[f"{key}_flags"] = []
                    if a == b:
                        continue
                    diff = self._branch_difference(metric, a, b)
                    row[key] = None if diff is None else diff.text()
                    kind = "cls" if metric == "top1" else "gen"
                    row[f"{key}_flags"] = [] if diff is None else [*self.convergence(kind, a), *self.convergence(kind, b)]
                    row["_tests"].append(_test(diff, f"{key}_verdict", f"{key}_note", f"{key}_p_holm",
                                               self._branch_stale(metric, a, b), SIGN,
                                               pair=(metric, self._run_used(a), metric, self._run_used(b))))
            rows.append(row)
        return self._correct(rows, "family")

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
                kind = "cls" if metric == "top1" else "gen"
                rows.append({"branch": branch, "metric": "top-1" if metric == "top1" else "FID (lower is better)",
                             "part": label, "runs": f"{self._run_used(a[run_key])} − {self._run_used(b[run_key])}",
                             "ours": None if diff is None else diff.text(),
                             "scale": None if diff is None else self.scale, "verdict": None, "seeds_note": None,
                             "p_holm": None, "stale": stale and stale.detail,
                             "flags": [*self.convergence(kind, a[run_key]), *self.convergence(kind, b[run_key])],
                             "_tests": [_test(diff, "verdict", "seeds_note", "p_holm", stale, SIGN,
                                              pair=(metric, self._run_used(a[run_key]), metric,
                                                    self._run_used(b[run_key])))]})
        return self._correct(rows, "family_decomposition")

    def claims(self) -> List[Dict[str, str]]:
        """The abstract's claims, checked with the complexity stage's measurements at paper shape."""
        base, vca = self.complexity.get("deit_tiny-mhsa"), self.complexity.get("deit_tiny-vca")
        out = []
        for c in self.ref["claims"]:
            text, evidence, holds, tolerance, timing = c["claim"], "not measured by this pipeline", None, None, None
            if "O(N n C)" in text and not (self.attention_macs or self.attention_cost):
                evidence = "not measured in this workspace: dvc repro attention_cost"
            elif ("parameters" in text or "FLOPs" in text) and not (base and vca):
                evidence = "not measured in this workspace: dvc repro complexity"
            if base and vca and "parameters" in text:
                added = vca["params_m"] - base["params_m"]
                evidence, holds = f"+{added * 1e3:.1f}K parameters on DeiT-T", added < 0.3
                tolerance = "exact counts at the paper's shape; holds if fewer than 0.3M are added"
            elif base and vca and "FLOPs" in text:
                ratio = vca["gmacs"] / base["gmacs"]
                evidence = (f"{base['gmacs']:.4f} -> {vca['gmacs']:.4f} GMACs on DeiT-T at 224 px "
                            f"({(ratio - 1) * 100:+.2f}%)")
                holds = round(vca["gmacs"], 1) == round(base["gmacs"], 1)
                tolerance = "holds if equal at one decimal, the precision at which the paper prints GMACs"
            elif "O(N n C)" in text and (self.attention_macs or self.attention_cost):
                evidence, holds, timing = self._scaling_evidence()
                tolerance = ("holds if VCA's MACs grow no faster than the token count (within 10%) and MHSA's "
                             "faster")
            verdict_text = ("holds" if holds else "does not hold" if holds is False else
                            "not run" if evidence.startswith("not measured in this workspace") else "not checked here")
            out.append({"claim": text, "source": c["source"], "paper": c.get("paper"), "evidence": evidence,
                        "verdict": verdict_text,
                        "verdict_class": verdict_class(verdict_text), "tolerance": tolerance, "timing": timing})
        return out


    def _scaling_evidence(self):
        """How one attention layer's MACs (exact, a DVC output) and, where measured here, time grow with N."""
        source = self.attention_macs or self.attention_cost
        rows = source["rows"]
        by = {(r["layer"], r["tokens"]): r for r in rows}
        times = {(r["layer"], r["tokens"]): r.get("forward_backward_ms") for r in (self.attention_cost or {}).get("rows", [])}
        # the claim compares VCA with MHSA; the other layers the stage measures do not enter it
        tokens = sorted({r["tokens"] for r in rows if ("mhsa", r["tokens"]) in by and ("vca", r["tokens"]) in by})
        if not tokens:
            return "VCA and MHSA were not both measured (attention_cost.layers)", None, None
        n0, n1 = tokens[0], tokens[-1]
        if n0 == n1:
            return "measured at one token count only; growth needs two (attention_cost.sides)", None, None
        macs = {layer: by[(layer, n1)]["macs"] / by[(layer, n0)]["macs"] for layer in ("mhsa", "vca")}
        growth = n1 / n0
        evidence = (f"one layer at DeiT-T width, N {n0} -> {n1} ({growth:.0f}x tokens): VCA MACs "
                    f"{macs['vca']:.1f}x, MHSA {macs['mhsa']:.1f}x")
        timing = None  # wall times: this machine's record (the claims export), never in results.json or the verdict
        if all(times.get((layer, n)) for layer in ("mhsa", "vca") for n in (n0, n1)):
            t = {layer: times[(layer, n1)] / times[(layer, n0)] for layer in ("mhsa", "vca")}
            timing = (f"forward+backward time VCA {t['vca']:.1f}x, MHSA {t['mhsa']:.1f}x "
                      f"({self.attention_cost['machine'].get('cpu')})")
        # linear: VCA's MACs grow no faster than the token count (within 10%), MHSA's faster
        return evidence, macs["vca"] <= 1.1 * growth < macs["mhsa"], timing


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


ROLES = {"baseline": "baseline (original recipe)", "twin": "baseline (lab's recipe)",
         "control": "control (lab's backbone, own attention)", "vca": "VCA (lab's recipe)"}


SIGN = object()  # a _test's paper gain where the difference has no paper counterpart: its sign is the verdict


def _test(diff: Optional[Difference], verdict: str, note: str, p: str, stale: Optional[Stale], paper,
          pair: Tuple = ()) -> Dict[str, Any]:
    """One comparison of a table row, decided by TableBuilder._correct: where its verdict, note and p go.

    ``pair`` names what is compared (read-out and run of each side): a comparison a table shows twice (the
    family's "VCA minus MHSA" in both rows, a decomposition whose recipe part is zero) counts once in Holm's m.
    """
    return {"diff": diff, "verdict": verdict, "note": note, "p": p, "stale": stale, "paper": paper, "pair": pair}


def sign(diff: Optional[Difference], resolved: Optional[bool] = None) -> str:
    """For a difference without a paper counterpart: its sign, only where the interval (or Holm) resolves it."""
    if diff is None or not diff.has_interval or not (diff.resolved if resolved is None else resolved):
        return direction(diff, None, resolved)
    return "positive (resolved)" if diff.value > 0 else "negative (resolved)"
