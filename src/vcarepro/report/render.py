"""Build reports/index.html from files only: params, metrics, logs, samples and the paper's numbers."""

from __future__ import annotations

from operator import attrgetter
from pathlib import Path
from typing import Any, Dict, List, Optional

import yaml
from jinja2 import Environment, PackageLoader, select_autoescape

from vcarepro.core import environment as software
from vcarepro.core import numerics
from vcarepro.core.choices import model_options
from vcarepro.core.environment import MACHINE_RECORD
from vcarepro.core.io import write_bytes, write_json
from vcarepro.core.recipes import input_path
from vcarepro.metrics.protocol import describe as describe_protocol
from vcarepro.params.config import compose, flatten, load_params
from vcarepro.params.runs import CLS_DATA, cls_recipe, cls_run, gen_run
from vcarepro.report import claims as claim_checks
from vcarepro.report import family as family_tables
from vcarepro.report import gains as gain_tables
from vcarepro.report import paper_tables
from vcarepro.report.calibration import calibration_section
from vcarepro.report.changes import changes_since
from vcarepro.report.collect import collect_runs, data_copy, read_json, real_grid
from vcarepro.report.convergence import FLAT_LOSS_FRACTION, FLAT_TOP1_POINTS
from vcarepro.report.environment import describe_environment
from vcarepro.report.export import records, write_tables
from vcarepro.report.figures import CLS_CURVES, GEN_CURVES, attention_cost_png, curves_png, gains_png
from vcarepro.report.howto import scale_matrices
from vcarepro.report.reference import load_reference
from vcarepro.report.rows import role
from vcarepro.report.runs_table import runs_frame
from vcarepro.report.summary import STATUSES, status_key, summary
from vcarepro.report.verdicts import ShownCell, verdict_class
from vcarepro.report.workspace import Workspace

# One name per quantity in the page, the CSV and the Markdown (the glossary defines each)
RUN_COLUMNS = {
    "top1": "top-1 (%)",
    "top5": "top-5 (%)",
    "loss": "val loss",
    "plateau_spread": "plateau spread (points)",
    "fid": "FID",
    "kid_mean": "KID",
    "inception_score": "IS",
    "precision": "precision",
    "recall": "recall",
}
COMPLEXITY_COLUMNS = {"params_m": "params (M)", "gmacs": "GMACs", "throughput_img_s": "images/s"}
# Sections of params.yaml that define a run; the report lists how they differ from the paper's.
RECIPE_SECTIONS = [
    "prepare_cls",
    "prepare_gen",
    "cls_shape",
    "gen_shape",
    "cls_recipes",
    "cls_recipe_overrides",
    "gen_recipe",
    "sampling",
]
# What an override section's absent knob means.
UNSET = {
    "cls_shape": "the model's own",
    "gen_shape": "the model's own",
    "cls_recipe_overrides": "each run's named recipe",
}


def _set_knobs(params: Dict[str, Any]) -> Dict[str, Any]:
    """The flat knobs of the recipe sections, less the overrides left null (null: each run's recipe decides)."""
    return {
        k: v
        for k, v in flatten({k: params.get(k) for k in RECIPE_SECTIONS}).items()
        if not (v is None and k.split(".")[0] in UNSET)
    }


def differing_knobs(params: Dict[str, Any], paper: Dict[str, Any]) -> List[Dict[str, str]]:
    ours, theirs = _set_knobs(params), _set_knobs(paper)
    keys = sorted(set(ours) | set(theirs))
    unset = lambda k: UNSET.get(k.split(".")[0], "absent")  # noqa: E731
    return [
        {"knob": k, "ours": str(ours.get(k, unset(k))), "paper": str(theirs.get(k, unset(k)))}
        for k in keys
        if ours.get(k) != theirs.get(k)
    ]


def recipes_collapse(params: Dict[str, Any]) -> bool:
    """Whether every named classification recipe trains the same at this scale (the embedded one does)."""
    resolved = [cls_recipe(params, name) for name in params.get("cls_recipes") or {}]
    return all(r == resolved[0] for r in resolved)


def run_recipe(params: Dict[str, Any], branch: str, name: str) -> Dict[str, Any]:
    """Everything that defines one run as it trains: recipe (with its overrides), shape, attention options, sampling."""
    run = cls_run(params, name) if branch == "cls" else gen_run(params, name)
    shape, options = model_options(run.model.get("attention"), run.model.get("options"), run.shape)
    out = {"recipe": run.recipe.model_dump(exclude_unset=True), "shape": shape, "options": options}
    if branch == "cls":
        out["recipe_name"] = run.recipe_name
    if branch == "gen":
        out["sampling"] = run.sampling
    return flatten(out)


# Knob prefixes of a run's recipe that the knob table compares (attention options belong to the model, and the
# runs table lists each run's).
RECIPE_KNOBS = ("recipe.", "shape.", "sampling.")


def knob_reasons(params: Dict[str, Any], conf: Path) -> Dict[str, str]:
    """The reason conf/ gives for each value of ``params`` (a ``why:`` beside it, :mod:`vcarepro.params.config`), by
    dotted key, from this scale's composition; only where ``params`` still hold the value that file set (a ``-S``
    override that changed it has no reason of conf's)."""
    from vcarepro.params.config import _conf_files, _lookup, conf_reasons

    found: Dict[str, str] = {}
    for _, tree in _conf_files([f"scale={params['scale']}"], Path(conf).resolve()):
        for path, (text, value) in conf_reasons(tree).items():
            if _lookup(params, path) == value:
                found[".".join(path)] = text
    return found


def _knob_keys(params: Dict[str, Any], branch: str, run: str, knob: str) -> List[str]:
    """The params.yaml key a knob of :func:`run_recipe` (``recipe.lr``, ``shape.img_size``, ...) takes its value
    from (as :mod:`vcarepro.params.runs` resolves it): an override where one is set, else the recipe."""
    section, _, rest = knob.partition(".")
    if section == "recipe" and branch == "cls":
        if (params.get("cls_recipe_overrides") or {}).get(rest) is not None:
            return [f"cls_recipe_overrides.{rest}"]
        return [f"cls_recipes.{params['cls_runs'][run]['recipe']}.{rest}"]
    if section == "recipe":
        if rest in (params["gen_runs"][run].get("recipe") or {}):
            return [f"gen_runs.{run}.recipe.{rest}"]
        return [f"gen_recipe.{rest}"]
    if section == "shape":
        return [f"{branch}_shape.{rest}"]
    return [knob] if section == "sampling" else []


def recipe_knobs(
    params: Dict[str, Any], paper: Dict[str, Any], reasons: Optional[Dict[str, str]] = None
) -> Dict[str, Any]:
    """One table per branch of every recipe knob that differs anywhere: each paper recipe, then this run's.

    Columns are the distinct recipes of the branch's runs at paper scale ("paper: deit") and the distinct
    recipes they train with here ("this run: 7 runs"), each naming its runs; rows are the knobs whose
    values are not the same in every column. This replaces one list per run.
    """
    out = {}
    for branch in ("cls", "gen"):
        runs = list(params[f"{branch}_runs"])
        columns: List[Dict[str, Any]] = []

        def add(label: str, name: str, knobs: Dict[str, Any]) -> None:
            for col in columns:
                if col["label"].split(":")[0] == label.split(":")[0] and col["knobs"] == knobs:
                    col["runs"].append(name)
                    return
            columns.append({"label": label, "runs": [name], "knobs": knobs})

        for name in runs:
            source = paper if name in paper[f"{branch}_runs"] else None
            if source is None:
                continue
            knobs = {k: v for k, v in run_recipe(source, branch, name).items() if k.startswith(RECIPE_KNOBS)}
            label = (
                f"paper: {source[f'{branch}_runs'][name].get('recipe', 'gen_recipe')}"
                if branch == "cls"
                else "paper: gen_recipe"
            )
            add(label, name, knobs)
        for name in runs:
            knobs = {k: v for k, v in run_recipe(params, branch, name).items() if k.startswith(RECIPE_KNOBS)}
            add("this run", name, knobs)
        keys = sorted({k for col in columns for k in col["knobs"]})
        ours = [col["runs"][0] for col in columns if col["label"] == "this run"]

        def why(knob: str) -> str:
            """conf/'s reason for this scale's value of ``knob`` (its runs' first column that has one)."""
            for run in ours:
                for key in _knob_keys(params, branch, run, knob):
                    if (reasons or {}).get(key):
                        return reasons[key]
            return ""

        rows = [
            {"knob": k, "cells": [str(col["knobs"].get(k, "—")) for col in columns], "why": why(k)}
            for k in keys
            if len({repr(col["knobs"].get(k)) for col in columns}) > 1
        ]
        for col in columns:
            n = len(col["runs"])
            col["label"] = f"{col['label']} ({'all ' if n == len(runs) and n > 1 else ''}{n} run{'s' if n > 1 else ''})"
        out[branch] = {"columns": [{"label": c["label"], "runs": c["runs"]} for c in columns], "rows": rows}
    return out


def measured_cell(cell: ShownCell) -> bool:
    """A table cell with our number in it, or the mark that the run's numbers are stale."""
    return cell.ours is not None or cell.stale is not None


def measured_row(row: Any) -> bool:
    """A difference row (gains, decompositions) with our difference in it, or the mark that a side is stale."""
    return row.ours is not None or bool(row.stale)


HOWTO_KEYS = "abcdefghijklmnopqrstuvwxyz"
COMPLEXITY_COMMAND = "dvc repro complexity"  # counts every model of every scale at the paper's shape


def paper_row(*fields: str):
    """Whether a row has a paper number in one of ``fields`` (a ``ShownCell`` or a difference row's "paper")."""

    def paper(value: Any) -> Optional[str]:
        return value.paper if isinstance(value, ShownCell) else value

    return lambda r: any(paper(getattr(r, f)) is not None for f in fields)


def fold(
    rows: List[Any], measured, label, runs, ws: Workspace, keep=lambda r: False, command: Optional[str] = None
) -> Dict[str, Any]:
    """A table's rows as the page shows them, and a how-to-run line for each distinct way to run what is missing.

    A row ``keep`` holds stays whether or not we ran it (a paper number never folds); a row of ours with nothing
    measured shows one "not run" mark keyed to the how-to line below the table; other unmeasured rows are named in
    that line only. Each shown row comes as (row, its howto key or None).
    """
    notes: Dict[str, Dict[str, Any]] = {}
    shown = []
    for r in rows:
        if measured(r):
            shown.append((r, None))
            continue
        text = command or ws.how_to_run(runs(r))
        note = notes.get(text)
        if note is None:
            note = notes[text] = {
                "key": HOWTO_KEYS[len(notes) % len(HOWTO_KEYS)],
                "command": text,
                "plan": ws.plans.get(text) or [{"runs": None, "options": [{"where": None, "command": text}]}],
                "labels": [],
                "n": 0,
                "n_hidden": 0,
            }
        note["n"] += 1
        if label(r) not in note["labels"]:
            note["labels"].append(label(r))
        if keep(r):
            shown.append((r, note["key"]))
        else:
            note["n_hidden"] += 1
    for note in notes.values():
        note["n_shown"] = note["n"] - note["n_hidden"]
    return {"rows": shown, "howto": list(notes.values()), "n_not_run": sum(n["n"] for n in notes.values())}


# The paper's ablation tables, each with its table of gains
ABLATIONS = ("table3", "table4")
# The metrics of each branch's runs table, in their columns' order
RUN_KEYS = {
    "cls": ["top1", "top5", "loss", "plateau_spread"],
    "gen": ["fid", "kid_mean", "inception_score", "precision", "recall"],
}


def _folded(ws: Workspace, tables: Dict[str, Any]) -> Dict[str, Any]:
    """The paper's tables (1-4) whole at every scale, each row with a paper number in the tables derived from them;
    what folds is our cells of a row not run, and rows with neither a paper number nor ours (:func:`fold`)."""
    model, paper, kept = attrgetter("model"), paper_row("paper"), lambda r: True
    own_run, difference_runs = (lambda r: [r.run]), (lambda r: r.runs.split(" − "))

    def vca_and_baseline(row) -> List[str]:
        rows = [x for t in ("table1", "table2") for x in ws.ref[t]["rows"] if x["model"] == row.model]
        return [x["run"] for x in rows if role(x) in ("baseline", "vca")]

    computed = [r for r in tables["table1"] if paper_row("params_m", "gmacs")(r)]
    return {
        "table1": fold(tables["table1"], lambda r: measured_cell(r.top1), model, own_run, ws, keep=kept),
        "compute": fold(
            computed,
            lambda r: r.params_m.ours is not None or r.gmacs.ours is not None,
            model,
            own_run,
            ws,
            keep=kept,
            command=COMPLEXITY_COMMAND,
        ),
        "decomposition": fold(tables["decomposition"], measured_row, model, difference_runs, ws, keep=paper),
        "table2": fold(tables["table2"], lambda r: measured_cell(r.fid), model, own_run, ws, keep=kept),
        "gains": fold(tables["gains"], measured_row, model, vca_and_baseline, ws, keep=paper),
        # Tables 3 and 4: one table per branch, each cell its own run
        **{
            f"{k}_{metric}": fold(
                tables[k], lambda r, cell=cell: measured_cell(cell(r)), attrgetter("variant"), run, ws, keep=kept
            )
            for k in ABLATIONS
            for metric, cell, run in (
                ("top1", attrgetter("top1"), lambda r: [r.cls_run]),
                ("fid", attrgetter("fid"), lambda r: [r.gen_run]),
            )
        },
        **{
            f"{k}_gains": fold(
                tables[f"{k}_gains"],
                measured_row,
                lambda r: f"{r.model} ({'top-1' if r.metric == 'top1' else 'FID'})",
                difference_runs,
                ws,
                keep=paper,
            )
            for k in ABLATIONS
        },
        "family": fold(
            tables["family"],
            lambda r: any(m.value is not None or m.stale for m in (r.top1, r.fid)),
            attrgetter("label"),
            lambda r: [r.cls_run, r.gen_run],
            ws,
        ),
        "family_decomposition": fold(
            tables["family_decomposition"], measured_row, lambda r: f"{r.branch}: {r.part}", difference_runs, ws
        ),
    }


def _workspace(root: Path, cls_reference: Optional[Dict[str, Any]]) -> Workspace:
    """The run's files: params, the paper's numbers and params, every run's results and the measurements;
    ``cls_reference``: the simple reference's figures where they were computed."""
    params = load_params(root / "params.yaml")
    reference = load_reference(root / "data" / "paper_reference.yaml")
    # every scale's run list, for the how-to-run lines of what this scale did not run (report/howto.py)
    matrices = scale_matrices(root / "conf")
    paper = matrices["paper"][False] if "paper" in matrices else compose(["scale=paper"], config_dir=root / "conf")
    complexity = read_json(root / "metrics" / "complexity.json") or {}
    # wall times live in timings/ (no DVC output, so absent after `dvc pull`); used only where they belong to
    # the results beside them: images/s for exactly these models, attention times measured with this config
    throughput = (read_json(root / "timings" / "complexity.json") or {}).get("throughput_img_s") or {}
    if complexity and set(throughput) == set(complexity):
        for name, value in throughput.items():
            complexity[name]["throughput_img_s"] = value
    attention_cost = read_json(root / "timings" / "attention_cost.json")
    macs = read_json(root / "metrics" / "attention_macs.json")
    if attention_cost and (
        not macs
        or attention_cost.get("config") != macs.get("config")
        or [(r["layer"], r["tokens"], r["macs"]) for r in attention_cost.get("rows", [])]
        != [(r["layer"], r["tokens"], r["macs"]) for r in macs.get("rows", [])]
    ):
        attention_cost = None  # left from another configuration
    knobs = differing_knobs(params, paper)
    # a run whose numbers other params produced comes without them, marked stale (vcarepro.params.provenance)
    return Workspace(
        reference,
        params,
        collect_runs(root / "runs", "cls", list(params["cls_runs"]), params),
        collect_runs(root / "runs", "gen", list(params["gen_runs"]), params),
        complexity,
        attention_cost,
        attention_macs=macs,
        cls_comparable=params["scale"] == "paper"
        and not any(k["knob"].startswith(("prepare_cls", "cls_")) for k in knobs),
        gen_comparable=params["scale"] == "paper"
        and not any(k["knob"].startswith(("prepare_gen", "gen_", "sampling")) for k in knobs),
        paper_params=paper,
        reference_top1=(cls_reference["logreg_top1"], "logistic-regression") if cls_reference else None,
        matrices=matrices,
    )


def _tables(ws: Workspace) -> Dict[str, Any]:
    """The rows of every table of the page but the runs tables, by the name each is exported under (``TABLES``)."""
    tables = {"gains": gain_tables.gains(ws), **{f"{k}_gains": gain_tables.ablation_gains(ws, k) for k in ABLATIONS}}
    measured = claim_checks.Measurements(ws.complexity, ws.attention_macs, ws.attention_cost)
    tables["claims"] = claim_checks.claims(ws.ref["claims"], measured)
    tables.update(
        table1=paper_tables.table1(ws),
        table2=paper_tables.table2(ws),
        decomposition=gain_tables.decomposition(ws),
        family=family_tables.family(ws),
        family_decomposition=family_tables.family_decomposition(ws),
        **{k: paper_tables.ablation(ws, k) for k in ABLATIONS},
    )
    ablation_gains = {k: tables[f"{k}_gains"] for k in ABLATIONS}
    tables["summary"] = summary(ws, tables["gains"], ablation_gains, tables["claims"])
    tables["stale"] = [
        {"run": r.name, "branch": r.branch, "stage": r.stale.stage, "status": r.stale.text, "differs": r.stale.detail}
        for r in [*ws.cls.values(), *ws.gen.values()]
        if r.stale is not None
    ]
    return tables


def _runs_tables(ws: Workspace) -> Dict[str, Any]:
    """The runs tables: each run's model, options, seeds, metrics and convergence; a classification run's input path."""
    params = ws.params
    cls_frame = runs_frame(ws.cls, params["cls_runs"], params["models"], RUN_KEYS["cls"], params["cls_shape"])
    if len(cls_frame):  # which path fed each run's training images: timm's PIL transform, or the fast path
        paths = [{"pil": "PIL"}.get(p, p) for p in (input_path(cls_run(params, r).recipe) for r in cls_frame["run"])]
        cls_frame.insert(int(cls_frame.columns.get_loc("seeds")), "input path", paths)
    gen_frame = runs_frame(ws.gen, params["gen_runs"], params["models"], RUN_KEYS["gen"], params["gen_shape"])
    for frame, branch in ((cls_frame, "cls"), (gen_frame, "gen")):
        if len(frame):
            frame["convergence"] = [
                "; ".join(f.removeprefix(f"{run} ") for f in ws.convergence(branch, run)) or "—" for run in frame["run"]
            ]
    return {
        "run_metrics": {branch: [RUN_COLUMNS[k] for k in keys] for branch, keys in RUN_KEYS.items()},
        "cls_runs": cls_frame.rename(columns=RUN_COLUMNS).to_dict("records"),
        "gen_runs": gen_frame.rename(columns=RUN_COLUMNS).to_dict("records"),
    }


def _environment(root: Path) -> Dict[str, Any]:
    """The environment section: this machine and its software beside those that recorded dvc.lock."""
    environment = describe_environment(root)
    return {
        "generated": environment["date"],
        "environment": environment,
        "machines": machines(root),
        "cpu_guarantee": numerics.CPU_GUARANTEE,
        "gpu_guarantee": numerics.GPU_GUARANTEE,
    }


def _figures(root: Path, ws: Workspace, gains, cls_reference: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """The page's figures: gains, attention cost, each run's curves (with the simple reference's line where it was
    computed) and sample grids, the real images' grid."""
    reference_line = {"val/top1": (cls_reference["logreg_top1"], "logistic regression")} if cls_reference else {}
    return {
        "gains_png": gains_png(records(gains)),
        "attention_cost_png": attention_cost_png(ws.attention_cost),
        "cls_curves": [
            (name, curves_png(name, r.curves, CLS_CURVES, xlabel="epoch", references=reference_line), r.stale)
            for name, r in ws.cls.items()
        ],
        "gen_curves": [
            (name, curves_png(name, r.curves, GEN_CURVES, xlabel="step"), r.stale) for name, r in ws.gen.items()
        ],
        "grids": [(name, sorted(r.grids.items()), r.stale) for name, r in ws.gen.items() if r.grids or r.stale],
        "real_grid": real_grid(root / "data" / "gen"),
    }


def _summary_notes(ws: Workspace, summary_rows) -> Dict[str, Any]:
    """What the summary and the glossary say beside the tables: the statuses used, the readout and the sources."""
    used = {status_key(r["status"]) for r in summary_rows}
    return {
        "statuses": [{"status": k, "meaning": v, "used": k in used} for k, v in STATUSES.items()],
        "readout_rule": ws.readout_rule,
        "comparisons": ws.comparisons,
        "sources": ws.ref["sources"],
        "unverified": ws.ref["unverified"],
        "flat_top1_points": FLAT_TOP1_POINTS,
        "flat_loss_fraction": FLAT_LOSS_FRACTION,
    }


def _changes(root: Path, ws: Workspace, stale) -> Dict[str, Any]:
    """What changed since the last commit."""
    run_metrics = {"cls": {n: r.metrics for n, r in ws.cls.items()}, "gen": {n: r.metrics for n, r in ws.gen.items()}}
    return {"changes": changes_since(root, ws.params, run_metrics, stale={r["run"]: r["status"] for r in stale})}


def _recipes(root: Path, ws: Workspace) -> Dict[str, Any]:
    """The scale, its knobs against the paper's, and the params that define the runs."""
    params, paper = ws.params, ws.paper_params
    return {
        "scale": params["scale"],
        # the smoke scale runs a distinct subset of the paper matrix; the preflight steps the rest
        "preflight_only": (
            [f"{b}@{r}" for b in ("cls", "gen") for r in paper[f"{b}_runs"] if r not in params[f"{b}_runs"]]
            if params["scale"] == "smoke"
            else []
        ),
        "cls_comparable": ws.cls_comparable,
        "gen_comparable": ws.gen_comparable,
        "recipe_knobs": recipe_knobs(params, paper, knob_reasons(params, root / "conf")),
        "calibration": {**calibration_section(root, params["scale"]), "dir": params["calibrate"]["dir"]},
        "recipes_collapse": recipes_collapse(params),
        "params_yaml": yaml.safe_dump(
            {k: params[k] for k in ["scale", *RECIPE_SECTIONS, "cls_runs", "gen_runs"] if k in params}, sort_keys=False
        ),
    }


def _paper_notes(ws: Workspace) -> Dict[str, Any]:
    """What the paper's tables say beside their rows: titles, protocols, references, the family's switch."""
    params, reference = ws.params, ws.ref
    return {
        "titles": {k: reference[k]["title"] for k in ("table1", "table2", *ABLATIONS, "family")},
        "complexity_tolerance": params["report"]["complexity_tolerance"],
        "fid_space": (
            f"the first {params['eval_gen']['feature_dims']} Inception coordinates"
            if params["eval_gen"].get("feature_dims")
            else "every Inception coordinate"
        ),
        "fid_protocol_text": describe_protocol(reference["fid_protocol"]),
        "fid_extractor": params["prepare_gen"]["fid_extractor"],
        "num_samples": params["sampling"]["num_samples"],
        "dit_original": [
            {"model": r["model"], "fid": r["fid"][0], "source": r["fid"][1]} for r in reference["dit_original"]
        ],
        "ablation_reference": {k: ws.reference_row(k)["variant"] for k in ABLATIONS},
        "family_on": any(
            r["cls_run"] in params["cls_runs"] or r["gen_run"] in params["gen_runs"]
            for r in reference["family"]["rows"]
        ),
        "family_seeds": params["family_seeds"],
        "attention_cost_config": (ws.attention_cost or {}).get("config") or params["attention_cost"],
        "complexity": [
            {"model": name, **{COMPLEXITY_COLUMNS.get(k, k): f"{v:.3f}" for k, v in fig.items()}}
            for name, fig in ws.complexity.items()
        ],
    }


def build_context(root: Path) -> Dict[str, Any]:
    """What the page's template renders, section by section, from the run's files (:func:`_workspace`)."""
    cls_reference = read_json(root / "metrics" / "cls_reference.json")
    computed = cls_reference if cls_reference and cls_reference.get("computed") else None
    ws = _workspace(root, computed)
    tables = _tables(ws)
    return {
        **tables,
        **_runs_tables(ws),
        **_environment(root),
        **_changes(root, ws, tables["stale"]),
        **_summary_notes(ws, tables["summary"]),
        **_recipes(root, ws),
        "folded": _folded(ws, tables),
        "plans": ws.plans,  # each how-to-run text of the page (the summary's commands) -> its commands
        "summary_words": ws.summary_words,  # a claim -> the words beside its number (summary._words)
        **_paper_notes(ws),
        "cls_reference": cls_reference,
        "data_copy": data_copy(root / CLS_DATA),
        **_figures(root, ws, tables["gains"], computed),
    }


MACHINE_FIELDS = "cpu vendor isa cores gpu python libc mkl onednn profile aten_capability threads libraries".split()


def _shown(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in sorted(value.items()))
    if isinstance(value, list):
        return " ".join(value)
    return "" if value is None else str(value)


def machines(root: Path) -> List[Dict[str, str]]:
    """The machine that recorded dvc.lock beside this one, field by field, for the environment section."""
    recorded = read_json(root / MACHINE_RECORD) or {}
    here = numerics.describe_machine()
    rows = []
    for key in MACHINE_FIELDS:
        ours = _shown(here.get(key))
        theirs = _shown(recorded.get(key)) if recorded else "no record (dvc.lock.machine.json)"
        rows.append({"field": key, "recorded": theirs, "here": ours, "same": ours == theirs})
    rows.append(package_row(software.recorded_packages(root), here.get("packages") or {}))
    return rows


def package_row(recorded: Optional[Dict[str, str]], here: Dict[str, str]) -> Dict[str, object]:
    """Every installed package against those dvc.lock was recorded under: each version that differs, and how many
    are installed on one side only (a GPU node without the test extra; :mod:`vcarepro.core.environment`)."""
    if recorded is None:
        return {
            "field": "packages",
            "recorded": f"not recorded ({MACHINE_RECORD} has none: python -m vcarepro.tools.lockcheck record)",
            "here": f"{len(here)}",
            "same": False,
        }
    moved = software.differences(recorded, here, versions_only=True)
    notes = list(moved)
    only_recorded, only_here = len(set(recorded) - set(here)), len(set(here) - set(recorded))
    if only_recorded:
        notes.append(f"{only_recorded} recorded, not installed")
    if only_here:
        notes.append(f"{only_here} installed, not recorded")
    shown = "; ".join(notes)
    return {
        "field": "packages",
        "recorded": f"{len(recorded)}",
        "here": shown or f"the same {len(here)}, at the same versions",
        "same": not moved,
    }


# Every table goes out as CSV and Markdown (tables/); those whose every number follows from DVC-tracked results (True)
# also go into reports/results.json, the report stage's DVC output (its hash reproduces). The page, the exports and
# the claims (which quote wall times and name this CPU) are the run's record, written beside it and kept out of
# dvc.lock.
TABLES = {
    "summary": True,
    "stale": True,
    "table1": True,
    "decomposition": True,
    "table2": True,
    "table3": True,
    "table4": True,
    "gains": True,
    "table3_gains": True,
    "table4_gains": True,
    "family": True,
    "family_decomposition": True,
    "claims": False,
    "cls_runs": True,
    "gen_runs": True,
    "complexity": False,
}
RESULT_TABLES = [name for name, tracked in TABLES.items() if tracked]


def render_report(root: str | Path = ".", out: str | Path = "reports/index.html") -> Path:
    """Write the HTML page to ``out`` and its tables as CSV and Markdown under ``out``'s folder, in ``tables/``."""
    root, out = Path(root), Path(out)
    env = Environment(
        loader=PackageLoader("vcarepro", "templates"),
        autoescape=select_autoescape(["html", "j2"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["verdict_class"] = verdict_class
    # a convergence flag's kind, for the one-line mark ("... seed 2: ends below the ... reference" -> "below reference")
    env.filters["flagseed"] = lambda flag: flag.split(":")[0]  # "deit_tiny-mhsa seed 2"
    env.filters["flagword"] = lambda flag: (
        "below reference" if "below" in flag else "not flattened" if "flattened" in flag else "loss still falling"
    )
    env.filters["status_class"] = lambda status: verdict_class(status_key(status))
    context = build_context(root)
    out.parent.mkdir(parents=True, exist_ok=True)
    written = write_tables({name: records(context[name]) for name in TABLES}, out.parent / "tables")
    exported = sorted({path.stem for path in written}, key=list(TABLES).index)
    html = env.get_template("report.html.j2").render(**context, exported=exported)
    write_bytes(out, html.encode("utf-8"))
    # last: a report stopped before this (a full disk, Ctrl-C) never leaves results.json newer than the page
    write_json(out.parent / "results.json", {name: records(context[name]) for name in RESULT_TABLES})
    return out
