"""A trained classification run's weights in the layout timm and the Hugging Face Hub read.

    python -m vcarepro.export --run deit_tiny-vca [--seed 0] [--out exports/deit_tiny-vca] [--force]

writes one folder per (run, seed): ``config.json`` and ``model.safetensors`` by timm's own
``save_for_hf`` (architecture, the model_args that rebuild the run's shape, the evaluation
preprocessing of its recipe), a model card ``README.md`` (architecture, recipe, metrics with the
seeds' spread and the Welch interval of the gain over the run's baseline, the paper's reference
numbers with their source marks, the scale) and the run's training curves as ``curves.png``.
Before the folder appears, the exported files are read back through timm and must give the
trained model's outputs exactly. Pushing is the user's own step (``huggingface-cli login``, then
``huggingface_hub.upload_folder``); nothing here reaches the network.
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import json
import statistics
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.nn as nn

from .config import flatten, load_params
from .errors import BadInput, MissingInput, run_stage
from .integrity import intact_file
from .io import atomic_directory
from .metrics.aggregate import per_seed_values
from .pipeline import CLS_DATA, ClsRun, cls_run

WEIGHTS = "model.safetensors"
CURVES = "curves.png"
EXPORTS_DIR = Path("exports")
REFERENCE = Path("data/paper_reference.yaml")
CARD_CURVES = ["train/loss", "val/loss", "val/top1", "train/lr"]   # the report's classification curves
# metrics.json figures the card lists, in this order, with how the card names them
CARD_METRICS = {"top1": "top-1, final epoch", "top1_best": "top-1, best epoch", "top1_ema": "top-1, final EMA",
                "top1_best_ema": "top-1, best epoch of the EMA", "top5": "top-5, final epoch",
                "loss": "validation loss, final epoch", "plateau_spread": "top-1 spread over the last 3 epochs"}
# which of our figures answers a paper number of each statistic (as the report's Table 1 reads them)
STATISTIC_KEYS = {"final": "top1", "final_ema": "top1_ema", "best": "top1_best", "best_ema": "top1_best_ema",
                  "unknown": "top1"}
PROBE_SEED = 0


def default_out(run: str, seed: int) -> Path:
    return EXPORTS_DIR / (run if seed == 0 else f"{run}-seed{seed}")


# -- the model --------------------------------------------------------------------------------------------

def trained_model(run: ClsRun, seed: int, root: Path) -> nn.Module:
    """The run's model at its trained shape with the seed's final weights, in eval mode."""
    from safetensors.torch import load_file

    from .train.classification import ClassifierSpec

    if seed not in run.seeds:
        raise BadInput(f"run {run.name!r} trains seeds {', '.join(map(str, run.seeds))}, not {seed}; "
                       f"pass one of them with --seed.")
    weights = root / run.paths.seed_dir(seed) / WEIGHTS
    if not weights.is_file():
        raise MissingInput(f"{weights} is missing: seed {seed} of {run.name} is not trained; "
                           f"run `dvc repro train_cls@{run.name}` first.")
    intact_file(weights, f"train_cls@{run.name}")  # the bytes train_cls wrote, or one sentence
    state = load_file(str(weights))
    if "head.weight" not in state:
        raise BadInput(f"{weights} has no classifier head (head.weight); it is not a train_cls output, "
                       f"retrain with `dvc repro -f -s train_cls@{run.name}`.")
    model = ClassifierSpec.for_run(run).create(num_classes=state["head.weight"].shape[0])
    model.load_state_dict(state)
    return model.eval()


def input_size(recipe: Dict[str, Any]) -> Tuple[int, int, int]:
    """The image size the run trained and was evaluated at (its recipe's, which sets the model's too)."""
    size = recipe["img_size"]
    return (3, *size) if isinstance(size, (list, tuple)) else (3, size, size)


def data_config(recipe: Dict[str, Any]) -> Dict[str, Any]:
    """The evaluation preprocessing the run was measured with (its recipe's), for timm's data config."""
    config = {"input_size": input_size(recipe)}
    for key in ("crop_pct", "crop_mode", "interpolation"):
        if recipe.get(key) is not None:
            config[key] = recipe[key]
    return config


def probe(model: nn.Module, size: Tuple[int, int, int], seed: int = PROBE_SEED) -> torch.Tensor:
    """The model's logits on a fixed random batch of two images of ``size``."""
    images = torch.randn(2, *size, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return model.eval()(images)


def rebuild(folder: Path) -> nn.Module:
    """The exported model, rebuilt from ``config.json`` (architecture, model_args) and loaded by timm."""
    import timm
    from timm.models import load_checkpoint

    config = json.loads((folder / "config.json").read_text())
    model = timm.create_model(config["architecture"], pretrained=False, **config.get("model_args", {}))
    load_checkpoint(model, str(folder / WEIGHTS), strict=True)
    return model.eval()


# -- what the card says ---------------------------------------------------------------------------------

def _per_seed(metrics: Dict[str, Any], key: str) -> List[float]:
    return per_seed_values(metrics, key) or ([float(metrics[key])] if key in metrics else [])


def _read_json(path: Path) -> Optional[Dict[str, Any]]:
    return json.loads(path.read_text()) if path.is_file() else None


def paper_rows(reference: Dict[str, Any], run: str) -> List[Dict[str, Any]]:
    """Every row of the paper's tables that this run answers, with the run it is compared with.

    Table 1: a VCA row against its backbone's baseline row; Tables 3 and 4: an ablation against the
    table's reference row; the family: a member against the family's MHSA baseline.
    """
    rows = []
    table1 = reference["table1"]
    for r in table1["rows"]:
        if r.get("run") != run:
            continue
        role = r.get("role") or ("vca" if r.get("attention") == "VCA" else "baseline")
        base = next((b for b in table1["rows"] if b["model"] == r["model"] and b.get("role") == "baseline"), None)
        rows.append({"table": table1["title"], "label": f"{r['model']} {r['attention']} ({role})",
                     "top1": r.get("top1"), "statistic": r.get("statistic", "final"),
                     "params_m": r.get("params_m"), "gflops": r.get("gflops"),
                     "baseline_run": base["run"] if base is not None and base is not r else None,
                     "baseline_top1": base.get("top1") if base is not None and base is not r else None})
    for name in ("table3", "table4"):
        table = reference[name]
        ref_row = next((r for r in table["rows"] if r.get("reference")), None)
        for r in table["rows"]:
            if r.get("cls_run") != run:
                continue
            other = ref_row if ref_row is not None and r is not ref_row else None
            label = r["variant"] + (" (reference row)" if other is None else "")
            rows.append({"table": table["title"], "label": label,
                         "top1": r.get("top1"), "statistic": table.get("statistic", "final"),
                         "baseline_run": other["cls_run"] if other else None,
                         "baseline_top1": other.get("top1") if other else None})
    family = reference.get("family") or {}
    for r in family.get("rows", []):
        if r.get("cls_run") == run:
            # the method's own published DeiT-T, trained with its own recipe; which epoch it quotes is not recorded
            rows.append({"table": family["title"], "label": f"{r.get('label') or r.get('attention')} (published)",
                         "top1": r.get("top1"), "statistic": "unknown", "cite": r.get("cite"),
                         "params_m": r.get("params_m"), "gflops": r.get("gflops"),
                         "baseline_run": family["baseline"]["cls_run"], "baseline_top1": None})
    return rows


def _baseline_here(params: Dict[str, Any], reference: Dict[str, Any], wanted: str) -> Optional[str]:
    """``wanted`` if it is a run of this scale, else the Table 1 baseline run of the same backbone that is
    (at embedded scale the lab-recipe twin is the baseline run itself, as the report says)."""
    runs = params.get("cls_runs") or {}
    if wanted in runs:
        return wanted
    model = next((r["model"] for r in reference["table1"]["rows"] if r.get("run") == wanted), "DeiT-T")
    return next((r["run"] for r in reference["table1"]["rows"]
                 if r["model"] == model and r.get("role") == "baseline" and r["run"] in runs), None)


def _gain_text(root: Path, run: ClsRun, metrics: Optional[Dict[str, Any]], baseline: Optional[str],
               paper_gain: Optional[Tuple[float, str]], key: str = "top1") -> str:
    """Ours minus the baseline run with Welch's interval, the paper's gain, and the direction verdict they support."""
    from .metrics.intervals import direction, welch

    paper = "" if paper_gain is None else f"; paper {paper_gain[0]:+.1f} [{paper_gain[1]}]"
    if baseline is None:
        return f"no baseline run at this scale{paper}"
    base = _read_json(root / "runs" / "cls" / baseline / "metrics.json")
    ours, theirs = _per_seed(metrics or {}, key), _per_seed(base or {}, key)
    if not ours or not theirs:
        return (f"minus `{baseline}`: not measured (`dvc repro eval_cls@{baseline}` and "
                f"`eval_cls@{run.name}`){paper}")
    diff = welch(ours, theirs)
    verdict = direction(diff, None if paper_gain is None else paper_gain[0])
    return f"minus `{baseline}` ({key}): {diff.text()}{paper}; {verdict}"


def _paper_gain(row: Dict[str, Any]) -> Optional[Tuple[float, str]]:
    ours, base = row.get("top1"), row.get("baseline_top1")
    if not ours or not base or ours[0] is None or base[0] is None:
        return None
    return float(ours[0]) - float(base[0]), f"{base[1]}/{ours[1]}"


def _ours(metrics: Optional[Dict[str, Any]], key: str) -> str:
    values = _per_seed(metrics or {}, key)
    if not values:
        return "not measured"
    if len(values) == 1:
        return f"{values[0]:.2f} (n=1)"
    return f"{statistics.fmean(values):.2f} ± {statistics.stdev(values):.2f} (n={len(values)})"


def _paper(entry: Any) -> str:
    if not entry or entry[0] is None:
        return "not published"
    return f"{entry[0]} [{entry[1]}]"


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return json.dumps(value) if isinstance(value, (list, dict, tuple, bool)) or value is None else str(value)


def _table(header: Tuple[str, str], rows: List[Tuple[Any, Any]]) -> str:
    lines = [f"| {header[0]} | {header[1]} |", "|---|---|"]
    lines += [f"| {k} | {_fmt(v).replace('|', '/')} |" for k, v in rows]
    return "\n".join(lines)


def model_card(*, run: ClsRun, seed: int, params: Dict[str, Any], config: Dict[str, Any],
               metrics: Optional[Dict[str, Any]], reference: Optional[Dict[str, Any]], root: Path,
               n_params: int, weights_sha256: str, has_curves: bool, folder_name: str) -> str:
    """The model card (README.md): YAML front matter for the Hub, then what the weights are and how to use them."""
    import timm

    scale = params.get("scale", "unknown")
    arch = config["architecture"]
    model_args = config.get("model_args", {})
    license_name = config.get("pretrained_cfg", {}).get("license", "mit")
    sources = (reference or {}).get("sources", {})
    out = ["---", "tags:", "- image-classification", "- timm", "- vision-transformer",
           "- visual-contrast-attention" if run.model["attention"] == "vca"
           else f"- {run.model['attention']}-attention",
           "- vca-repro", f"- scale-{scale}", "library_name: timm", "pipeline_tag: image-classification",
           f"license: {license_name}", "---", "",
           f"# {run.name} (seed {seed}): `{arch}`", ""]
    if scale == "paper":
        out += [f"**Scale: {scale}.** Trained with the paper's recipe as this pipeline reproduces it on "
                "ImageNet-1K; its numbers are the ones to set beside the paper's.", ""]
    else:
        out += [f"**Scale: {scale}. These numbers are not comparable with the paper's.** The weights come from "
                f"the `{scale}` scale of the vca-repro pipeline (small data, small shapes, short schedules: "
                f"image size {model_args.get('img_size')}, {config.get('num_classes')} classes); they show that "
                "the run trains and exports end to end, not ImageNet accuracy.", ""]
    out += ["Trained by the vca-repro pipeline for *Linear Differential Vision Transformer: Learning Visual "
            "Contrasts via Pairwise Differentials* (NeurIPS 2025, arXiv:2511.00833), run "
            f"`train_cls@{run.name}`, seed {seed} of {', '.join(map(str, run.seeds))}.", ""]

    out += ["## Architecture", "",
            f"timm model `{arch}` (pipeline model `{run.model['arch']}`, attention `{run.model['attention']}`), "
            f"{n_params / 1e6:.3f} M parameters, {config.get('num_features')} features, "
            f"pooling `{config.get('global_pool')}`. The shape differs from the registered default, so rebuild "
            "with these `model_args` (they are in `config.json`):", "",
            _table(("model_args", "value"), sorted(model_args.items()))]
    if run.model.get("options"):
        out += ["", "Attention options of the pipeline's model entry: "
                + ", ".join(f"`{k}={_fmt(v)}`" for k, v in sorted(run.model["options"].items())) + "."]
    out += [""]

    out += ["## Training recipe", "",
            f"Recipe `{run.recipe_name}` (`cls_recipes` in params.yaml) with the `{scale}` scale's overrides, "
            "as trained:", "", _table(("knob", "value"), sorted(flatten(run.recipe).items())), ""]

    out += ["## Metrics", ""]
    if metrics is None:
        out += [f"Not evaluated yet: run `dvc repro eval_cls@{run.name}` and export again.", ""]
    else:
        rows = []
        for key, label in CARD_METRICS.items():
            if key not in metrics:
                continue
            values = _per_seed(metrics, key)
            spread = _ours(metrics, key)
            this = metrics.get(f"{key}_seed{seed}")
            rows.append(f"| {label} (`{key}`) | {spread} | {'' if this is None else f'{this:.2f}'} | "
                        + ", ".join(f"{v:.2f}" for v in values) + " |")
        out += [f"Validation figures of the run (`runs/cls/{run.name}/metrics.json`): mean ± sample std over "
                f"seeds, this checkpoint's seed ({seed}), and every seed.", "",
                f"| figure | mean ± std | seed {seed} | per seed |", "|---|---|---|---|", *rows, ""]

    comparisons = paper_rows(reference, run.name) if reference else []
    gains = []
    for row in comparisons:
        if row.get("baseline_run"):
            baseline = _baseline_here(params, reference, row["baseline_run"])
            text = _gain_text(root, run, metrics, baseline, _paper_gain(row))
            if text not in gains:
                gains.append(text)
    if gains:
        out += ["Gain over the baseline (ours: final-epoch top-1, as the report's gains table, with the 95% Welch "
                "interval over the per-seed values; the paper's gain of the same rows; a direction only where our "
                "interval excludes zero):", "",
                *[f"- {g}" for g in gains], ""]

    out += ["## The paper's numbers", ""]
    if not comparisons:
        out += ["The paper has no row for this run." if reference else
                f"{REFERENCE} is missing, so the paper's numbers are not shown.", ""]
    else:
        out += ["ImageNet-1K top-1 (%) of the corresponding rows (`data/paper_reference.yaml`), with the source "
                "mark of each value" + ("; at this scale ours are not comparable with them." if scale != "paper"
                                        else "."), "",
                f"| table | row | paper top-1 | statistic | ours, same statistic ({scale}) | paper baseline top-1 "
                "| params (M) | GFLOPs |",
                "|---|---|---|---|---|---|---|---|"]
        for row in comparisons:
            key = STATISTIC_KEYS.get(row["statistic"], "top1")
            out.append(f"| {row['table']} | {row['label']} | {_paper(row.get('top1'))} | {row['statistic']} "
                       f"| `{key}` {_ours(metrics, key)} | "
                       f"{_paper(row.get('baseline_top1'))} | {_paper(row.get('params_m'))} | "
                       f"{_paper(row.get('gflops'))} |")
        used = sorted({e[1] for row in comparisons for e in (row.get("top1"), row.get("baseline_top1"),
                       row.get("params_m"), row.get("gflops")) if e and e[1]})
        out += ["", "Sources: " + "; ".join(f"{m}: {sources.get(m, '?')}" for m in used) + ".", ""]

    if has_curves:
        out += ["## Training curves", "", "Every seed of the run, as in the report (`reports/index.html`):", "",
                f"![training curves]({CURVES})", ""]

    overlay = "dict(config['pretrained_cfg'], file=f'{folder}/model.safetensors')"
    out += ["## How to load", "",
            "Import `vcarepro` first: it registers the VCA models with timm.", "",
            "```python",
            "import json, timm, vcarepro  # noqa: F401",
            f"folder = '{folder_name}'",
            "config = json.load(open(f'{folder}/config.json'))",
            "model = timm.create_model(config['architecture'], pretrained=True,",
            f"                          pretrained_cfg_overlay={overlay},",
            "                          **config['model_args'])",
            "# the same in one line: timm.create_model(f'local-dir:{folder}', pretrained=True)",
            "# or without the pretrained path:",
            "# model = timm.create_model(config['architecture'], **config['model_args'])",
            "# timm.models.load_checkpoint(model, f'{folder}/model.safetensors')",
            "model.eval()",
            "data_config = timm.data.resolve_model_data_config(model)",
            "transform = timm.data.create_transform(**data_config, is_training=False)",
            "```", "",
            "The overlay must carry the exported `pretrained_cfg` (or at least its `num_classes`): with only "
            "`file=`, timm compares the head with the registered 1000 classes and drops it.", "",
            f"The exported files were read back this way (`config.json` -> `timm.create_model` -> "
            f"`load_checkpoint`) before the folder was written and gave identical logits. "
            f"`model.safetensors` sha256: `{weights_sha256}`; timm {timm.__version__}.", ""]

    out += ["## How to share it", "",
            f"Nothing here uploads. The card's license (`{license_name}`) is the model config's; weights trained "
            "on ImageNet also carry ImageNet's terms of access, so check them before sharing. With your own "
            "Hugging Face account:", "",
            "```bash",
            "huggingface-cli login",
            "```", "", "```python",
            "from huggingface_hub import upload_folder",
            f"upload_folder(repo_id='<you>/{run.name}', folder_path='{folder_name}', repo_type='model')",
            "# or timm.models.push_to_hf_hub(model, '<you>/<name>', model_args=config['model_args']) "
            "(writes its own card)",
            "```", "",
            f"Then `timm.create_model('hf-hub:<you>/{run.name}', pretrained=True)` loads it (after `import vcarepro`).",
            ""]
    return "\n".join(out)


def curves_png(root: Path, run: ClsRun) -> Optional[bytes]:
    """The run's training curves (every seed), drawn as the report draws them; None without dvclive logs."""
    from .report.collect import read_curves
    from .report.figures import curves_png as draw

    uri = draw(run.name, read_curves(root / run.paths.live_dir), CARD_CURVES)
    return None if uri is None else base64.b64decode(uri.split(",", 1)[1])


def _drop_source_tag(config_path: Path) -> None:
    """Remove the registered weights' tag (timm's DeiT carries ``fb_in1k``): these weights are not those."""
    config = json.loads(config_path.read_text())
    if config.get("pretrained_cfg", {}).pop("tag", None) is not None:
        config_path.write_text(json.dumps(config, indent=2))


def _shown(path: Path, root: Path) -> str:
    """``path`` as a user of the project names it: relative to the project when inside it."""
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return path.as_posix()


# -- the export -----------------------------------------------------------------------------------------

def export_run(name: str, *, seed: int = 0, out: str | Path | None = None, root: str | Path = ".",
               force: bool = False) -> Path:
    """Write the folder for seed ``seed`` of classification run ``name``; returns its path.

    ``root`` is the project (params.yaml, runs/, data/); ``out`` defaults to ``exports/<run>`` under it.
    The folder appears only complete (built under a temporary name, then renamed).
    """
    from timm.models import save_for_hf

    root = Path(root)
    params = load_params(root / "params.yaml")
    run = cls_run(params, name)
    out = Path(out) if out is not None else root / default_out(name, seed)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not force:
        raise BadInput(f"{out} already exists and is not empty; pass --force to replace it or choose --out.")
    model = trained_model(run, seed, root)
    expected = probe(model, input_size(run.recipe))
    metrics = _read_json(root / run.paths.metrics)
    reference = None
    if (root / REFERENCE).is_file():
        from .report.reference import load_reference
        reference = load_reference(root / REFERENCE)
    model_config: Dict[str, Any] = {}
    classes = root / CLS_DATA / "classes.json"
    if classes.is_file():
        names = [c["name"] for c in sorted(json.loads(classes.read_text()), key=lambda c: c["index"])]
        if len(names) == model.num_classes:
            model_config["label_names"] = names
    with atomic_directory(out) as tmp:
        save_for_hf(model, str(tmp), model_config=model_config, safe_serialization=True,
                    data_config=data_config(run.recipe))
        _drop_source_tag(tmp / "config.json")
        got = probe(rebuild(tmp), input_size(run.recipe))
        if not torch.equal(got, expected):
            raise RuntimeError(f"the exported {name} does not reload to the trained model's outputs "
                               f"(max difference {(got - expected).abs().max().item():.3g}); this is a bug.")
        png = curves_png(root, run)
        if png is not None:
            (tmp / CURVES).write_bytes(png)
        config = json.loads((tmp / "config.json").read_text())
        card = model_card(run=run, seed=seed, params=params, config=config, metrics=metrics, reference=reference,
                          root=root, n_params=sum(p.numel() for p in model.parameters()),
                          weights_sha256=hashlib.sha256((tmp / WEIGHTS).read_bytes()).hexdigest(),
                          has_curves=png is not None, folder_name=_shown(out, root))
        (tmp / "README.md").write_text(card, encoding="utf-8")
    return out


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m vcarepro.export", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True, help="a classification run of params.yaml (cls_runs)")
    parser.add_argument("--seed", type=int, default=0, help="which trained seed to export (default 0)")
    parser.add_argument("--out", default=None, help="the folder to write (default exports/<run>)")
    parser.add_argument("--force", action="store_true", help="replace an existing, non-empty folder")
    args = parser.parse_args(argv)
    folder = export_run(args.run, seed=args.seed, out=args.out, force=args.force)
    print(f"export {args.run} seed {args.seed}: {folder} ({', '.join(sorted(p.name for p in folder.iterdir()))})")


if __name__ == "__main__":
    run_stage(main)
