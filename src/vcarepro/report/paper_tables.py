"""The paper's Tables 1-4 row by row, each paper number beside ours with a verdict (``verdicts.Cell``).

Each table's function names, in its docstring, the stage and function that made its numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from vcarepro.metrics.protocol import describe as describe_protocol
from vcarepro.report.rows import STATISTICS
from vcarepro.report.verdicts import (
    NOT_COMPARABLE,
    Cell,
    Measured,
    ShownCell,
    exact_verdict,
    measured,
    stale_of,
    verdict,
)
from vcarepro.report.workspace import Workspace

ROLES = {
    "baseline": "baseline (original recipe)",
    "twin": "baseline (lab's recipe)",
    "control": "control (lab's backbone, own attention)",
    "vca": "VCA (lab's recipe)",
}


@dataclass(frozen=True)
class Table1Row:
    model: str
    attention: str
    role: str  # ROLES' wording
    recipe: Optional[str]
    run: str
    same_as: Optional[str]  # the run of this scale that stands in for it (``Workspace.same_run``)
    top1: ShownCell
    params_m: ShownCell
    gmacs: ShownCell

    def as_dict(self) -> Dict[str, Any]:
        return {
            "model": self.model,
            "attention": self.attention,
            "role": self.role,
            "recipe": self.recipe,
            "run": self.run,
            "same_as": self.same_as,
            "top1": self.top1.as_dict(),
            "params_m": self.params_m.as_dict(),
            "gmacs": self.gmacs.as_dict(),
        }


@dataclass(frozen=True)
class Table2Row:
    model: str
    attention: str
    run: str
    fid: ShownCell
    protocol: Optional[str]  # the protocol our FID followed, in words

    def as_dict(self) -> Dict[str, Any]:
        return {
            "model": self.model,
            "attention": self.attention,
            "run": self.run,
            "fid": self.fid.as_dict(),
            "protocol": self.protocol,
        }


@dataclass(frozen=True)
class AblationRow:
    variant: str
    cls_run: str
    gen_run: str
    top1: ShownCell
    fid: ShownCell

    def as_dict(self) -> Dict[str, Any]:
        return {
            "variant": self.variant,
            "cls_run": self.cls_run,
            "gen_run": self.gen_run,
            "top1": self.top1.as_dict(),
            "fid": self.fid.as_dict(),
        }


def top1_cell(ws: Workspace, run: str, entry, conflict=None, statistic: str = "final") -> Cell:
    key, label = ws.top1_key(statistic)
    result = ws.cls_result(run)
    ours = measured(result, key, ws.scale)
    paper = ws.paper_value(entry)
    stale = stale_of(result)
    paper_label = STATISTICS[statistic][1]
    said = label if paper_label == label else f"paper: {paper_label}; ours: {label}"
    return Cell(
        paper,
        ours,
        stale.text
        if stale
        else verdict(paper, ours, comparable=ws.cls_comparable, tolerance=ws.tol_top1, lower_is_better=False),
        ws.paper_value(conflict) if conflict else None,
        statistic=said if paper.available else None,
        stale=stale,
        flags=ws.convergence("cls", run),
    )


def fid_cell(ws: Workspace, run: str, entry, conflict=None) -> Cell:
    ours = measured(ws.gen.get(run), "fid", ws.scale)
    paper = ws.paper_value(entry)
    deviations = ws.fid_protocol_deviations(run) if ws.gen_comparable else []
    stale = stale_of(ws.gen.get(run))
    judged = (
        stale.text
        if stale
        else verdict(
            paper, ours, comparable=ws.gen_comparable and not deviations, tolerance=ws.tol_fid, lower_is_better=True
        )
    )
    return Cell(
        paper,
        ours,
        judged,
        ws.paper_value(conflict) if conflict else None,
        stale=stale,
        flags=ws.convergence("gen", run),
        reason="; ".join(deviations) if deviations and judged == NOT_COMPARABLE else None,
    )


def exact_cell(ws: Workspace, run: str, entry, key: str) -> Cell:
    model = ws.model_of(run)
    value = ws.complexity.get(model, {}).get(key) if model else None
    paper = ws.paper_value(entry)
    ours = None if value is None else Measured(value, 0.0, 1, "paper shape")
    return Cell(paper, ours, exact_verdict(paper, value, ws.tol_complexity), digits=2)


def protocol_text(ws: Workspace, run: str) -> Optional[str]:
    """The protocol a run's FID followed, in words, from its metrics.json (eval_gen copied it from the samples')."""
    result = ws.gen.get(run)
    m = result.metrics if result is not None and result.metrics else None
    if not m or "reference" not in m:
        return None
    return describe_protocol(m)


def table1(ws: Workspace) -> List[Table1Row]:
    """Each Table 1 row (data/paper_reference.yaml) beside ours: top-1, parameters, GMACs.

    ``top1`` comes from each run's metrics.json (``rows.STATISTICS`` picks the key, ``rows.answering_run`` the
    run); ``params_m`` / ``gmacs`` from metrics/complexity.json at the paper's shape.
    """
    return [
        Table1Row(
            model=r["model"],
            attention=r["attention"],
            role=ROLES[r["role"]],
            recipe=ws.cls_run_entry(r["run"]).get("recipe"),
            run=r["run"],
            same_as=ws.same_run(r["run"]),
            top1=top1_cell(ws, r["run"], r.get("top1"), statistic=ws.row_statistic(r)).shown(),
            params_m=exact_cell(ws, r["run"], r.get("params_m"), "params_m").shown(),
            gmacs=exact_cell(ws, r["run"], r.get("gflops"), "gmacs").shown(),
        )
        for r in ws.ref["table1"]["rows"]
    ]


def table2(ws: Workspace) -> List[Table2Row]:
    """Each Table 2 row (data/paper_reference.yaml) beside ours: FID-50K and the protocol it followed.

    ``fid`` comes from each run's metrics.json (``eval_gen@RUN``); the protocol is the samples' ``protocol.json``,
    worded and compared with the paper's by :mod:`vcarepro.metrics.protocol`.
    """
    return [
        Table2Row(
            model=r["model"],
            attention=r["attention"],
            run=r["run"],
            fid=fid_cell(ws, r["run"], r["fid"]).shown(),
            protocol=protocol_text(ws, r["run"]),
        )
        for r in ws.ref["table2"]["rows"]
    ]


def ablation(ws: Workspace, name: str) -> List[AblationRow]:
    """Each row of ablation table ``name`` (Table 3 or 4): ours beside the paper's, per branch.

    ``top1``: the row's ``cls_run``'s metrics.json from ``eval_cls@RUN`` (``classification.evaluate`` /
    ``best_epoch_figures``, as in ``table1``), read with the table's statistic. ``fid``: the row's
    ``gen_run``'s ``runs/gen/<run>/metrics.json``, written by the ``eval_gen@RUN`` stage (stages/eval_gen.py)
    with ``vcarepro.metrics.evaluator.evaluate_samples`` over the samples ``sample_gen@RUN`` drew.
    """
    rows = []
    for r in ws.ref[name]["rows"]:
        conflict = r.get("conflict", {})
        rows.append(
            AblationRow(
                variant=r["variant"],
                cls_run=r["cls_run"],
                gen_run=r["gen_run"],
                top1=top1_cell(
                    ws, r["cls_run"], r["top1"], conflict.get("top1"), statistic=ws.ref[name].get("statistic", "final")
                ).shown(),
                fid=fid_cell(ws, r["gen_run"], r["fid"], conflict.get("fid")).shown(),
            )
        )
    return rows
