"""Which of our numbers answers a row of the paper's tables: the run, the read-out, the per-seed values.

One place for what the report's tables (``workspace.py``) and the model card (``card.py``) both decide; the
keys read are those ``eval_cls@RUN`` writes to ``runs/cls/<run>/metrics.json`` (docs/pipeline.md).
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, Mapping, Optional, Tuple

from vcarepro.metrics.aggregate import per_seed_values
from vcarepro.params.runs import cls_recipe

# Which of our top-1 figures answers a paper number, by the statistic the paper's number is
# (data/paper_reference.yaml): the metrics.json key and how the report names it.
STATISTICS = {
    "final": ("top1", "final epoch"),
    "final_ema": ("top1_ema", "final epoch, EMA weights"),
    "best": ("top1_best", "best epoch"),
    "best_ema": ("top1_best_ema", "best epoch, EMA weights"),
    "unknown": ("top1", "not stated; ours: final epoch"),
}


def role(row: Mapping[str, Any]) -> str:
    """A reference row's role; Table 2's rows are MHSA / VCA pairs without one."""
    return row.get("role") or ("vca" if row["attention"] == "VCA" else "baseline")


def seed_values(metrics: Mapping[str, Any], key: str) -> Tuple[float, ...]:
    """The per-seed values of ``key`` in a metrics.json, in seed order; one value where only the mean is
    written (a single-seed run), none where ``key`` is absent."""
    if key not in metrics:
        return ()
    return tuple(per_seed_values(metrics, key)) or (float(metrics[key]),)


def answering_run(
    run: str, params: Mapping[str, Any], paper_params: Mapping[str, Any], reference: Mapping[str, Any]
) -> Optional[str]:
    """The run of this scale whose numbers answer a paper row that names ``run``; None where none does.

    ``run`` itself where this scale trains it. Otherwise (a run of the paper scale's matrix only) a run
    of the same backbone in Table 1 that trains exactly what ``run`` would here: same model, same recipe
    as resolved at this scale. At embedded scale the original and the lab's recipe collapse into the
    embedded one, so the lab-recipe twin of a baseline is answered by the baseline run itself; where the
    recipes differ (proxy, smoke) nothing stands in for it.
    """
    here = params.get("cls_runs") or {}
    paper = paper_params.get("cls_runs") or {}
    if run in here:
        return run
    if run not in paper:
        return None
    rows = reference["table1"]["rows"]
    model = next((r["model"] for r in rows if r["run"] == run), None)
    wanted = (paper[run]["model"], cls_recipe(params, paper[run]["recipe"]))
    for row in rows:
        other = here.get(row["run"])
        if (
            row["model"] == model
            and other is not None
            and (other["model"], cls_recipe(params, other["recipe"])) == wanted
        ):
            return row["run"]
    return None


def paper_rows(reference: Mapping[str, Any]) -> Iterator[Dict[str, Any]]:
    """Every classification row of the paper's tables, with the run it names and the run it is compared with.

    Table 1: each row against its backbone's baseline row; Tables 3 and 4: an ablation against the
    table's reference row; the family: a member against the family's MHSA baseline. Each row: ``run``,
    ``table`` (title), ``label``, ``top1`` (paper entry), ``statistic``, ``baseline_run`` and
    ``baseline_top1`` (None for the row compared with itself), and ``params_m`` / ``gflops`` / ``cite``
    where the table has them.
    """
    table1 = reference["table1"]
    for r in table1["rows"]:
        base = next((b for b in table1["rows"] if b["model"] == r["model"] and b.get("role") == "baseline"), None)
        yield {
            "run": r.get("run"),
            "table": table1["title"],
            "label": f"{r['model']} {r['attention']} ({role(r)})",
            "top1": r.get("top1"),
            "statistic": r.get("statistic", "final"),
            "params_m": r.get("params_m"),
            "gflops": r.get("gflops"),
            "baseline_run": base["run"] if base is not None and base is not r else None,
            "baseline_top1": base.get("top1") if base is not None and base is not r else None,
        }
    for name in ("table3", "table4"):
        table = reference[name]
        ref_row = next((r for r in table["rows"] if r.get("reference")), None)
        for r in table["rows"]:
            other = ref_row if ref_row is not None and r is not ref_row else None
            label = r["variant"] + (" (reference row)" if other is None else "")
            yield {
                "run": r.get("cls_run"),
                "table": table["title"],
                "label": label,
                "top1": r.get("top1"),
                "statistic": table.get("statistic", "final"),
                "baseline_run": other["cls_run"] if other else None,
                "baseline_top1": other.get("top1") if other else None,
            }
    family = reference.get("family") or {}
    for r in family.get("rows", []):
        # the method's own published DeiT-T, trained with its own recipe; which epoch it quotes is not recorded
        yield {
            "run": r.get("cls_run"),
            "table": family["title"],
            "label": f"{r.get('label') or r.get('attention')} (published)",
            "top1": r.get("top1"),
            "statistic": "unknown",
            "cite": r.get("cite"),
            "params_m": r.get("params_m"),
            "gflops": r.get("gflops"),
            "baseline_run": family["baseline"]["cls_run"],
            "baseline_top1": None,
        }
