"""Build reports/index.html from files only: params, metrics, logs, samples and the paper's numbers."""
from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import Any, Dict, List

import yaml
from jinja2 import Environment, PackageLoader, select_autoescape

from ..config import compose, load_params
from .collect import collect_runs, read_json
from .figures import curves_png
from .reference import load_reference
from .tables import TableBuilder, runs_frame

CLS_CURVES = ["train/loss", "val/loss", "val/top1", "train/lr"]
GEN_CURVES = ["train/loss"]
# Sections of params.yaml that define a run; the report lists how they differ from the paper's.
RECIPE_SECTIONS = ["prepare_cls", "prepare_gen", "cls_shape", "gen_shape", "cls_recipe", "gen_recipe", "sampling"]


def flatten(d: Any, prefix: str = "") -> Dict[str, Any]:
    if isinstance(d, dict):
        out: Dict[str, Any] = {}
        for k, v in d.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out  # an empty section (the paper's shape: no overrides) contributes no knob
    return {prefix.rstrip("."): d}


def differing_knobs(params: Dict[str, Any], paper: Dict[str, Any]) -> List[Dict[str, str]]:
    ours = flatten({k: params.get(k) for k in RECIPE_SECTIONS})
    theirs = flatten({k: paper.get(k) for k in RECIPE_SECTIONS})
    keys = sorted(set(ours) | set(theirs))
    return [{"knob": k, "ours": str(ours.get(k, "paper's value")), "paper": str(theirs.get(k, "the model's own"))}
            for k in keys if ours.get(k) != theirs.get(k)]


def build_context(root: Path) -> Dict[str, Any]:
    params = load_params(root / "params.yaml")
    reference = load_reference(root / "data" / "paper_reference.yaml")
    paper = compose(["scale=paper"], config_dir=root / "conf")
    complexity = read_json(root / "metrics" / "complexity.json") or {}
    cls = collect_runs(root / "runs", "cls", list(params["cls_runs"]))
    gen = collect_runs(root / "runs", "gen", list(params["gen_runs"]))
    knobs = differing_knobs(params, paper)
    cls_comparable = params["scale"] == "paper" and not any(k["knob"].startswith(("prepare_cls", "cls_")) for k in knobs)
    gen_comparable = params["scale"] == "paper" and not any(
        k["knob"].startswith(("prepare_gen", "gen_", "sampling")) for k in knobs)
    tables = TableBuilder(reference, params, cls, gen, complexity,
                          cls_comparable=cls_comparable, gen_comparable=gen_comparable)
    cls_keys = ["top1", "top5", "loss"]
    gen_keys = ["fid", "kid_mean"]
    return {
        "generated": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "scale": params["scale"],
        "cls_comparable": cls_comparable,
        "gen_comparable": gen_comparable,
        "knobs": knobs,
        "sources": reference["sources"],
        "claims": tables.claims(),
        "table1": tables.table1(),
        "table2": tables.table2(),
        "dit_original": [{"model": r["model"], "fid": r["fid"][0], "source": r["fid"][1]}
                         for r in reference["dit_original"]],
        "table3": tables.ablation("table3"),
        "table4": tables.ablation("table4"),
        "titles": {k: reference[k]["title"] for k in ("table1", "table2", "table3", "table4")},
        "cls_runs": runs_frame(cls, params["cls_runs"], params["models"], cls_keys, params["cls_shape"]).to_dict("records"),
        "gen_runs": runs_frame(gen, params["gen_runs"], params["models"], gen_keys, params["gen_shape"]).to_dict("records"),
        "fid_extractor": params["prepare_gen"]["fid_extractor"],
        "num_samples": params["sampling"]["num_samples"],
        "complexity": [{"model": name, **{k: f"{v:.3f}" for k, v in fig.items()}} for name, fig in complexity.items()],
        "cls_curves": [(name, curves_png(name, r.curves, CLS_CURVES, xlabel="epoch")) for name, r in cls.items()],
        "gen_curves": [(name, curves_png(name, r.curves, GEN_CURVES, xlabel="step")) for name, r in gen.items()],
        "grids": [(name, sorted(r.grids.items())) for name, r in gen.items() if r.grids],
        "params_yaml": yaml.safe_dump({k: params[k] for k in ["scale", *RECIPE_SECTIONS, "cls_runs", "gen_runs"]
                                       if k in params}, sort_keys=False),
    }


def render_report(root: str | Path = ".", out: str | Path = "reports/index.html") -> Path:
    root, out = Path(root), Path(out)
    env = Environment(loader=PackageLoader("vcarepro", "templates"), autoescape=select_autoescape(["html", "j2"]),
                      trim_blocks=True, lstrip_blocks=True)
    html = env.get_template("report.html.j2").render(**build_context(root))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".html.tmp")
    tmp.write_text(html, encoding="utf-8")
    tmp.replace(out)  # atomic: a killed report stage leaves no finished-looking page
    return out
