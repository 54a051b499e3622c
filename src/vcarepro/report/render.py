"""Build reports/index.html from files only: params, metrics, logs, samples and the paper's numbers."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

import yaml
from jinja2 import Environment, PackageLoader, select_autoescape

from ..config import compose, load_params
from ..pipeline import cls_recipe, cls_run, gen_run, model_options
from .changes import changes_since
from .calibration import calibration_section
from .collect import collect_runs, read_json
from .environment import describe_environment
from .. import numerics
from .export import write_tables
from .figures import attention_cost_png, curves_png, gains_png
from ..config import flatten
from ..io import write_json
from .reference import load_reference
from .tables import FAMILY_COMMAND, TableBuilder, runs_frame, verdict_class

CLS_CURVES = ["train/loss", "val/loss", "val/top1", "train/lr"]
GEN_CURVES = ["train/loss"]
# Sections of params.yaml that define a run; the report lists how they differ from the paper's.
RECIPE_SECTIONS = ["prepare_cls", "prepare_gen", "cls_shape", "gen_shape", "cls_recipes", "cls_recipe_overrides",
                   "gen_recipe", "sampling"]
# What an override section's absent knob means.
UNSET = {"cls_shape": "the model's own", "gen_shape": "the model's own",
         "cls_recipe_overrides": "each run's named recipe"}


def _set_knobs(params: Dict[str, Any]) -> Dict[str, Any]:
    """The flat knobs of the recipe sections, less the overrides left null (null: each run's recipe decides)."""
    return {k: v for k, v in flatten({k: params.get(k) for k in RECIPE_SECTIONS}).items()
            if not (v is None and k.split(".")[0] in UNSET)}


def differing_knobs(params: Dict[str, Any], paper: Dict[str, Any]) -> List[Dict[str, str]]:
    ours, theirs = _set_knobs(params), _set_knobs(paper)
    keys = sorted(set(ours) | set(theirs))
    unset = lambda k: UNSET.get(k.split(".")[0], "absent")  # noqa: E731
    return [{"knob": k, "ours": str(ours.get(k, unset(k))), "paper": str(theirs.get(k, unset(k)))}
            for k in keys if ours.get(k) != theirs.get(k)]


def recipes_collapse(params: Dict[str, Any]) -> bool:
    """Whether every named classification recipe trains the same at this scale (the embedded one does)."""
    resolved = [cls_recipe(params, name) for name in params.get("cls_recipes") or {}]
    return all(r == resolved[0] for r in resolved)


def run_recipe(params: Dict[str, Any], branch: str, name: str) -> Dict[str, Any]:
    """Everything that defines one run as it trains: recipe (with its overrides), shape, attention options, sampling."""
    run = cls_run(params, name) if branch == "cls" else gen_run(params, name)
    shape, options = model_options(run.model.get("attention"), run.model.get("options"), run.shape)
    out = {"recipe": run.recipe, "shape": shape, "options": options}
    if branch == "cls":
        out["recipe_name"] = run.recipe_name
    if branch == "gen":
        out["sampling"] = run.sampling
    return flatten(out)


def run_recipe_diffs(params: Dict[str, Any], paper: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Per run: the knobs whose value differs from the same run at paper scale (or the paper recipe)."""
    out = []
    for branch, runs in (("cls", params["cls_runs"]), ("gen", params["gen_runs"])):
        for name in runs:
            reference = paper if name in paper[f"{branch}_runs"] else \
                {**paper, f"{branch}_runs": {**paper[f"{branch}_runs"], name: params[f"{branch}_runs"][name]},
                 "models": {**paper["models"], **params["models"]}}
            ours, theirs = run_recipe(params, branch, name), run_recipe(reference, branch, name)
            diffs = [{"knob": k, "ours": str(ours.get(k, "the model's own")), "paper": str(theirs.get(k, "the model's own"))}
                     for k in sorted(set(ours) | set(theirs)) if ours.get(k) != theirs.get(k)]
            out.append({"run": name, "branch": branch, "diffs": diffs})
    return out


def fid_protocol_text(protocol: Dict[str, Any]) -> str:
    samplers = ", ".join(f"{name} {steps} steps ({objective})" for objective, (name, steps) in protocol["samplers"].items())
    return (f"{protocol['num_samples']} samples with {protocol['labels']} labels, {samplers}, cfg {protocol['cfg_scale']}, "
            f"decoded by {protocol['decoder']}, models trained in {protocol['train_precision']}, FID against "
            f"{'ADM' if protocol['reference'] == 'adm' else 'our own'} reference statistics")


def build_context(root: Path) -> Dict[str, Any]:
    params = load_params(root / "params.yaml")
    reference = load_reference(root / "data" / "paper_reference.yaml")
    paper = compose(["scale=paper"], config_dir=root / "conf")
    complexity = read_json(root / "metrics" / "complexity.json") or {}
    # wall times live in timings/ (no DVC output, so absent after `dvc pull`); used only where they belong to
    # the results beside them: images/s for exactly these models, attention times measured with this config
    throughput = (read_json(root / "timings" / "complexity.json") or {}).get("throughput_img_s") or {}
    if complexity and set(throughput) == set(complexity):
        for name, value in throughput.items():
            complexity[name]["throughput_img_s"] = value
    attention_cost = read_json(root / "timings" / "attention_cost.json")
    macs = read_json(root / "metrics" / "attention_macs.json")
    if attention_cost and (not macs or attention_cost.get("config") != macs.get("config")
                           or [(r["layer"], r["tokens"], r["macs"]) for r in attention_cost.get("rows", [])]
                           != [(r["layer"], r["tokens"], r["macs"]) for r in macs.get("rows", [])]):
        attention_cost = None  # left from another configuration
    cls_reference = read_json(root / "metrics" / "cls_reference.json")
    reference_line = ({"val/top1": (cls_reference["logreg_top1"], "logistic regression")}
                      if cls_reference and cls_reference.get("computed") else {})
    # a run whose numbers other params produced comes without them, marked stale (vcarepro.provenance)
    cls = collect_runs(root / "runs", "cls", list(params["cls_runs"]), params)
    gen = collect_runs(root / "runs", "gen", list(params["gen_runs"]), params)
    stale = [{"run": r.name, "branch": r.branch, "stage": r.stale.stage, "status": r.stale.text,
              "differs": r.stale.detail} for r in [*cls.values(), *gen.values()] if r.stale is not None]
    knobs = differing_knobs(params, paper)
    cls_comparable = params["scale"] == "paper" and not any(k["knob"].startswith(("prepare_cls", "cls_")) for k in knobs)
    gen_comparable = params["scale"] == "paper" and not any(
        k["knob"].startswith(("prepare_gen", "gen_", "sampling")) for k in knobs)
    tables = TableBuilder(reference, params, cls, gen, complexity, attention_cost,
                          cls_comparable=cls_comparable, gen_comparable=gen_comparable, paper_params=paper)
    cls_keys = ["top1", "top5", "loss", "plateau_spread"]
    gen_keys = ["fid", "kid_mean", "inception_score", "precision", "recall"]
    gains = tables.gains()
    environment = describe_environment(root)
    run_metrics = {"cls": {n: r.metrics for n, r in cls.items()}, "gen": {n: r.metrics for n, r in gen.items()}}
    return {
        "generated": environment["date"],
        "environment": environment,
        "machines": machines(root),
        "cpu_guarantee": numerics.CPU_GUARANTEE,
        "gpu_guarantee": numerics.GPU_GUARANTEE,
        "changes": changes_since(root, params, run_metrics, stale={r["run"]: r["status"] for r in stale}),
        "stale": stale,
        "gains": gains,
        "cls_reference": cls_reference,
        "gains_png": gains_png(gains),
        "attention_cost_png": attention_cost_png(attention_cost),
        "run_diffs": run_recipe_diffs(params, paper),
        "scale": params["scale"],
        # the smoke scale runs a distinct subset of the paper matrix; the preflight steps the rest
        "preflight_only": ([f"{b}@{r}" for b in ("cls", "gen") for r in paper[f"{b}_runs"]
                            if r not in params[f"{b}_runs"]] if params["scale"] == "smoke" else []),
        "fid_space": (f"the first {params['eval_gen']['feature_dims']} Inception coordinates"
                      if params["eval_gen"].get("feature_dims") else "every Inception coordinate"),
        "cls_comparable": cls_comparable,
        "gen_comparable": gen_comparable,
        "knobs": knobs,
        "sources": reference["sources"],
        "claims": tables.claims(),
        "calibration": {**calibration_section(root, params["scale"]), "dir": params["calibrate"]["dir"]},
        "table1": tables.table1(),
        "decomposition": tables.decomposition(),
        "recipes_collapse": recipes_collapse(params),
        "complexity_tolerance": params["report"]["complexity_tolerance"],
        "table2": tables.table2(),
        "fid_protocol_text": fid_protocol_text(reference["fid_protocol"]),
        "dit_original": [{"model": r["model"], "fid": r["fid"][0], "source": r["fid"][1]}
                         for r in reference["dit_original"]],
        "table3": tables.ablation("table3"),
        "table4": tables.ablation("table4"),
        **{f"{k}_gains": tables.ablation_gains(k) for k in ("table3", "table4")},
        "ablation_reference": {k: tables.reference_row(k)["variant"] for k in ("table3", "table4")},
        "titles": {k: reference[k]["title"] for k in ("table1", "table2", "table3", "table4", "family")},
        "family": tables.family(),
        "family_decomposition": tables.family_decomposition(),
        "family_on": any(r["cls_run"] in params["cls_runs"] or r["gen_run"] in params["gen_runs"]
                         for r in reference["family"]["rows"]),
        "family_command": FAMILY_COMMAND,
        "family_seeds": params["family_seeds"],
        "attention_cost_config": (attention_cost or {}).get("config") or params["attention_cost"],
        "cls_runs": runs_frame(cls, params["cls_runs"], params["models"], cls_keys, params["cls_shape"]).to_dict("records"),
        "gen_runs": runs_frame(gen, params["gen_runs"], params["models"], gen_keys, params["gen_shape"]).to_dict("records"),
        "fid_extractor": params["prepare_gen"]["fid_extractor"],
        "num_samples": params["sampling"]["num_samples"],
        "complexity": [{"model": name, **{k: f"{v:.3f}" for k, v in fig.items()}} for name, fig in complexity.items()],
        "cls_curves": [(name, curves_png(name, r.curves, CLS_CURVES, xlabel="epoch", references=reference_line),
                        r.stale) for name, r in cls.items()],
        "gen_curves": [(name, curves_png(name, r.curves, GEN_CURVES, xlabel="step"), r.stale) for name, r in gen.items()],
        "grids": [(name, sorted(r.grids.items()), r.stale) for name, r in gen.items() if r.grids or r.stale],
        "params_yaml": yaml.safe_dump({k: params[k] for k in ["scale", *RECIPE_SECTIONS, "cls_runs", "gen_runs"]
                                       if k in params}, sort_keys=False),
    }


MACHINE_RECORD = "dvc.lock.machine.json"  # the machine that recorded dvc.lock (python -m vcarepro.lockcheck record)


def machines(root: Path) -> List[Dict[str, str]]:
    """The machine that recorded dvc.lock beside this one, field by field, for the environment section."""
    recorded = read_json(root / MACHINE_RECORD) or {}
    here = numerics.describe_machine()
    rows = []
    for key in ("cpu", "vendor", "isa", "cores", "gpu", "python", "libc", "mkl", "onednn", "profile", "aten_capability",
                "threads", "libraries"):
        def show(value):
            if isinstance(value, dict):
                return ", ".join(f"{k} {v}" for k, v in sorted(value.items()))
            if isinstance(value, list):
                return " ".join(value)
            return "" if value is None else str(value)
        ours, theirs = show(here.get(key)), show(recorded.get(key)) if recorded else "no record (dvc.lock.machine.json)"
        rows.append({"field": key, "recorded": theirs, "here": ours, "same": ours == theirs})
    return rows


# The tables whose every number follows from DVC-tracked results: reports/results.json, the report stage's DVC
# output (its hash reproduces). The page, the CSV / Markdown and the claims (which quote wall times and name this
# CPU) are the run's record, written beside it and kept out of dvc.lock.
RESULT_TABLES = ["stale", "table1", "decomposition", "table2", "table3", "table4", "gains", "table3_gains",
                 "table4_gains", "family", "family_decomposition", "cls_runs", "gen_runs"]
EXPORTED_TABLES = ["stale", "table1", "decomposition", "table2", "table3", "table4", "gains", "table3_gains",
                   "table4_gains", "family", "family_decomposition", "claims", "cls_runs", "gen_runs", "complexity"]


def render_report(root: str | Path = ".", out: str | Path = "reports/index.html") -> Path:
    """Write the HTML page to ``out`` and its tables as CSV and Markdown under ``out``'s folder, in ``tables/``."""
    root, out = Path(root), Path(out)
    env = Environment(loader=PackageLoader("vcarepro", "templates"), autoescape=select_autoescape(["html", "j2"]),
                      trim_blocks=True, lstrip_blocks=True)
    env.filters["verdict_class"] = verdict_class
    context = build_context(root)
    out.parent.mkdir(parents=True, exist_ok=True)
    written = write_tables({name: context[name] for name in EXPORTED_TABLES}, out.parent / "tables")
    write_json(out.parent / "results.json", {name: context[name] for name in RESULT_TABLES})
    exported = sorted({path.stem for path in written}, key=EXPORTED_TABLES.index)
    html = env.get_template("report.html.j2").render(**context, exported=exported)
    tmp = out.with_suffix(".html.tmp")
    tmp.write_text(html, encoding="utf-8")
    tmp.replace(out)  # atomic and last: a killed report stage leaves no finished-looking page
    return out
