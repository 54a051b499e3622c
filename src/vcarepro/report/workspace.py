"""What every report table reads (the paper's numbers, the runs' results, the tolerances) and decides alike:
which run answers a row, how it is read, its seeds' convergence, how to run what is missing."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from vcarepro.core.errors import BadInput
from vcarepro.metrics.protocol import deviations as protocol_deviations
from vcarepro.report import convergence
from vcarepro.report.collect import RunResult
from vcarepro.report.howto import HowToRun, Matrices, plan_text
from vcarepro.report.reference import PaperValue, paper_value, unverified_sources
from vcarepro.report.rows import STATISTICS, answering_run

# The read-out rule: which of our top-1 figures every cell, difference and interval uses, per scale.
READOUT_RULES = {
    "paper": "each row is read as its source reports it (the statistic under the paper's number: final or best "
    "epoch, raw or EMA weights), and every difference and interval uses the same read-out as its cells",
    "other": "the final epoch's weights, for every run, cell, difference and interval: picking the best epoch on "
    "the only held-out split would select on the test data and read optimistically",
}


class Workspace:
    """The inputs of the tables, and what they record for the page: ``comparisons`` (table -> the m of its Holm
    correction) and ``plans`` (each how-to-run text -> its plan)."""

    def __init__(
        self,
        reference: Dict[str, Any],
        params: Dict[str, Any],
        cls: Dict[str, RunResult],
        gen: Dict[str, RunResult],
        complexity: Dict[str, Dict[str, float]],
        attention_cost: Optional[Dict[str, Any]] = None,
        *,
        cls_comparable: bool,
        gen_comparable: bool,
        paper_params: Optional[Dict[str, Any]] = None,
        reference_top1: Optional[Tuple[float, str]] = None,
        attention_macs: Optional[Dict[str, Any]] = None,
        matrices: Optional[Matrices] = None,
    ) -> None:
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
        self.plans: Dict[str, List[Dict[str, Any]]] = {}  # how_to_run's text -> its plan (the page renders it)
        # a summary claim -> what the page says beside its number and no export carries (summary.py)
        self.summary_words: Dict[str, Dict[str, str]] = {}

    def paper_value(self, entry) -> PaperValue:
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
        """The convergence flags of a run's seeds (``convergence.flags``)."""
        if (branch, run) not in self._convergence:
            result = (self.cls_result(run) if branch == "cls" else self.gen.get(run)) if run else None
            entry = (self.params.get(f"{branch}_runs", {}).get(result.name) if result is not None else None) or {}
            seeds = entry.get("seeds") or []
            self._convergence[branch, run] = convergence.flags(branch, result, seeds, self.reference_top1)
        return self._convergence[branch, run]

    def checked(self, branch: str, run: Optional[str]) -> Tuple[Tuple[str, int], ...]:
        """((the run's name, how many seeds its number rests on),), or () without numbers: what
        ``convergence.unconverged`` needs to tell every seed flagged from some."""
        result = (self.cls_result(run) if branch == "cls" else self.gen.get(run)) if run else None
        n = convergence.seeds_checked(branch, result)
        return ((result.name, n),) if result is not None and n else ()

    def has_results(self, run: str) -> bool:
        """Whether ``run`` (or the run that answers it here) has numbers on disk, current or stale."""
        result = self.cls_result(run) or self.gen.get(run)  # run names are distinct across the branches
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

    def same_run(self, run: str) -> Optional[str]:
        """The run of this scale that stands in for ``run`` (a paper-scale run absent here), or None:
        ``rows.answering_run``, where the rule is stated once for the tables and the model card."""
        answer = answering_run(run, self.params, self.paper_params, self.ref)
        return None if answer == run else answer

    def run_used(self, run: str) -> str:
        """The run whose numbers stand for ``run`` at this scale (the baseline itself for its lab-recipe twin)."""
        return self.same_run(run) or run

    def cls_result(self, run: str) -> Optional[RunResult]:
        return self.cls.get(run) or self.cls.get(self.same_run(run) or "")

    def result(self, metric: str, run: str) -> Optional[RunResult]:
        """The results ``metric`` (top1 or fid) of ``run`` is read from."""
        return self.cls_result(run) if metric == "top1" else self.gen.get(run)

    def cls_run_entry(self, run: str) -> Dict[str, Any]:
        """A classification run's params entry at this scale, or at paper scale where it runs only there."""
        for runs in (self.params.get("cls_runs", {}), self.paper_params.get("cls_runs", {})):
            if run in runs:
                return runs[run]
        return {}

    def model_of(self, run: str) -> Optional[str]:
        return self.cls_run_entry(run).get("model") or (run if run in self.params.get("models", {}) else None)

    def row_statistic(self, row: Dict[str, Any]) -> str:
        """Which top-1 a Table 1 row is read as: its own statistic, or for the rows the paper did not run (the
        lab-recipe baseline, the control; trained with the lab's recipe) the statistic of its backbone's VCA row."""
        if row.get("statistic"):
            return row["statistic"]
        if row.get("role") in ("twin", "control"):
            vca = next((r for r in self.ref["table1"]["rows"] if r["model"] == row["model"] and r["role"] == "vca"), {})
            return vca.get("statistic", "final")
        return "final"

    def fid_protocol_deviations(self, run: str) -> List[str]:
        """How the run's FID was measured differently from the paper's protocol (data/paper_reference.yaml)."""
        result = self.gen.get(run)
        metrics = result.metrics if result is not None and result.metrics else {}
        if not metrics:
            return []
        return protocol_deviations(
            metrics, self.ref["fid_protocol"], self.params.get("gen_runs", {}).get(run, {}).get("objective")
        )

    def reference_row(self, name: str) -> Dict[str, Any]:
        """The row of ablation table ``name`` that the others are compared with (``reference: true``)."""
        reference = [r for r in self.ref[name]["rows"] if r.get("reference")]
        if len(reference) != 1:
            raise BadInput(f"{name} in data/paper_reference.yaml needs exactly one row with reference: true.")
        return reference[0]
