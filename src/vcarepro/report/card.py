"""The model card (README.md) of an exported classification run, written from files as the report reads them.

``vcarepro.tools.export`` writes the weights and ``config.json`` and calls ``model_card`` / ``curves_png`` here.
What the card says comes from the report's own sources: the metrics.json readers (``collect``), the read-out
per paper statistic, the paper rows and the run that answers each (``rows``), the curve list (``figures``).
It imports no training code: the run is a ``params.runs.ClsRun``, the weights' facts come in as arguments.
"""

from __future__ import annotations

import base64
import json
import statistics
from importlib.metadata import version
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from vcarepro.metrics.intervals import direction, welch
from vcarepro.params.config import flatten
from vcarepro.params.runs import ClsRun
from vcarepro.report.collect import read_curves, read_json
from vcarepro.report.figures import CLS_CURVES
from vcarepro.report.figures import curves_png as draw_curves
from vcarepro.report.rows import STATISTICS, answering_run, paper_rows, seed_values

CURVES = "curves.png"
REFERENCE = Path("data/paper_reference.yaml")

# metrics.json figures the card lists, in this order, with how the card names them
CARD_METRICS = {
    "top1": "top-1, final epoch",
    "top1_best": "top-1, best epoch",
    "top1_ema": "top-1, final EMA",
    "top1_best_ema": "top-1, best epoch of the EMA",
    "top5": "top-5, final epoch",
    "loss": "validation loss, final epoch",
    "plateau_spread": "top-1 spread over the last 3 epochs",
}


def run_rows(reference: Dict[str, Any], run: str) -> List[Dict[str, Any]]:
    """Every row of the paper's tables that names this run, with the run it is compared with (``rows.paper_rows``)."""
    return [row for row in paper_rows(reference) if row["run"] == run]


def _gain_text(
    root: Path,
    run: ClsRun,
    metrics: Optional[Dict[str, Any]],
    baseline: Optional[str],
    paper_gain: Optional[Tuple[float, str]],
    key: str = "top1",
) -> str:
    """Ours minus the baseline run with Welch's interval, the paper's gain, and the direction verdict they support."""
    paper = "" if paper_gain is None else f"; paper {paper_gain[0]:+.1f} [{paper_gain[1]}]"
    if baseline is None:
        return f"no baseline run at this scale{paper}"
    base = read_json(root / "runs" / "cls" / baseline / "metrics.json")
    ours, theirs = seed_values(metrics or {}, key), seed_values(base or {}, key)
    if not ours or not theirs:
        return f"minus `{baseline}`: not measured (`dvc repro eval_cls@{baseline}` and `eval_cls@{run.name}`){paper}"
    diff = welch(ours, theirs)
    verdict = direction(diff, None if paper_gain is None else paper_gain[0])
    return f"minus `{baseline}` ({key}): {diff.text()}{paper}; {verdict}"


def _paper_gain(row: Dict[str, Any]) -> Optional[Tuple[float, str]]:
    ours, base = row.get("top1"), row.get("baseline_top1")
    if not ours or not base or ours[0] is None or base[0] is None:
        return None
    return float(ours[0]) - float(base[0]), f"{base[1]}/{ours[1]}"


def _ours(metrics: Optional[Dict[str, Any]], key: str) -> str:
    values = seed_values(metrics or {}, key)
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


def model_card(
    *,
    run: ClsRun,
    seed: int,
    params: Dict[str, Any],
    config: Dict[str, Any],
    metrics: Optional[Dict[str, Any]],
    reference: Optional[Dict[str, Any]],
    root: Path,
    n_params: int,
    weights_sha256: str,
    has_curves: bool,
    folder_name: str,
    paper_params: Optional[Dict[str, Any]] = None,
) -> str:
    """The model card (README.md): YAML front matter for the Hub, then what the weights are and how to use them.

    ``paper_params``: the paper scale's params (``compose(["scale=paper"])``), from which a compared run that
    this scale does not train is answered as the report answers it (``rows.answering_run``); without them
    such a run has no stand-in.
    """
    scale = params.get("scale", "unknown")
    license_name = config.get("pretrained_cfg", {}).get("license", "mit")
    comparisons = run_rows(reference, run.name) if reference else []
    gains = _gains(root, run, metrics, comparisons, params, paper_params, reference)
    return "\n".join(
        [
            *_heading(run, seed, scale, config, license_name),
            *_architecture(run, config, n_params),
            *_recipe(run, scale),
            *_metrics(run, seed, metrics, gains),
            *_papers_numbers(comparisons, metrics, scale, reference),
            *(_curves() if has_curves else []),
            *_how_to_load(folder_name, weights_sha256),
            *_how_to_share(run, folder_name, license_name),
        ]
    )


def _heading(run: ClsRun, seed: int, scale: str, config: Dict[str, Any], license_name: str) -> List[str]:
    """The Hub's front matter, the title, and what the scale makes of the numbers."""
    arch, model_args = config["architecture"], config.get("model_args", {})
    out = [
        "---",
        "tags:",
        "- image-classification",
        "- timm",
        "- vision-transformer",
        "- visual-contrast-attention" if run.model["attention"] == "vca" else f"- {run.model['attention']}-attention",
        "- vca-repro",
        f"- scale-{scale}",
        "library_name: timm",
        "pipeline_tag: image-classification",
        f"license: {license_name}",
        "---",
        "",
        f"# {run.name} (seed {seed}): `{arch}`",
        "",
    ]
    if scale == "paper":
        out += [
            f"**Scale: {scale}.** Trained with the paper's recipe as this pipeline reproduces it on "
            "ImageNet-1K; its numbers are the ones to set beside the paper's.",
            "",
        ]
    else:
        out += [
            f"**Scale: {scale}. These numbers are not comparable with the paper's.** The weights come from "
            f"the `{scale}` scale of the vca-repro pipeline (small data, small shapes, short schedules: "
            f"image size {model_args.get('img_size')}, {config.get('num_classes')} classes); they show that "
            "the run trains and exports end to end, not ImageNet accuracy.",
            "",
        ]
    return out + [
        "Trained by the vca-repro pipeline for *Linear Differential Vision Transformer: Learning Visual "
        "Contrasts via Pairwise Differentials* (NeurIPS 2025, arXiv:2511.00833), run "
        f"`train_cls@{run.name}`, seed {seed} of {', '.join(map(str, run.seeds))}.",
        "",
    ]


def _architecture(run: ClsRun, config: Dict[str, Any], n_params: int) -> List[str]:
    model_args = config.get("model_args", {})
    out = [
        "## Architecture",
        "",
        f"timm model `{config['architecture']}` (pipeline model `{run.model['arch']}`, attention "
        f"`{run.model['attention']}`), {n_params / 1e6:.3f} M parameters, {config.get('num_features')} features, "
        f"pooling `{config.get('global_pool')}`. The shape differs from the registered default, so rebuild "
        "with these `model_args` (they are in `config.json`):",
        "",
        _table(("model_args", "value"), sorted(model_args.items())),
    ]
    if run.model.get("options"):
        out += [
            "",
            "Attention options of the pipeline's model entry: "
            + ", ".join(f"`{k}={_fmt(v)}`" for k, v in sorted(run.model["options"].items()))
            + ".",
        ]
    return out + [""]


def _recipe(run: ClsRun, scale: str) -> List[str]:
    return [
        "## Training recipe",
        "",
        f"Recipe `{run.recipe_name}` (`cls_recipes` in params.yaml) with the `{scale}` scale's overrides, as trained:",
        "",
        _table(("knob", "value"), sorted(flatten(run.recipe.model_dump(exclude_unset=True)).items())),
        "",
    ]


def _gains(root, run, metrics, comparisons, params, paper_params, reference) -> List[str]:
    """Ours minus each compared row's baseline run (``_gain_text``), once each."""
    gains: List[str] = []
    for row in comparisons:
        if row.get("baseline_run"):
            baseline = answering_run(row["baseline_run"], params, paper_params or {}, reference)
            text = _gain_text(root, run, metrics, baseline, _paper_gain(row))
            if text not in gains:
                gains.append(text)
    return gains


def _metrics(run: ClsRun, seed: int, metrics: Optional[Dict[str, Any]], gains: List[str]) -> List[str]:
    out = ["## Metrics", ""]
    if metrics is None:
        out += [f"Not evaluated yet: run `dvc repro eval_cls@{run.name}` and export again.", ""]
    else:
        rows = []
        for key, label in CARD_METRICS.items():
            if key not in metrics:
                continue
            values = seed_values(metrics, key)
            spread = _ours(metrics, key)
            this = metrics.get(f"{key}_seed{seed}")
            rows.append(
                f"| {label} (`{key}`) | {spread} | {'' if this is None else f'{this:.2f}'} | "
                + ", ".join(f"{v:.2f}" for v in values)
                + " |"
            )
        out += [
            f"Validation figures of the run (`runs/cls/{run.name}/metrics.json`): mean ± sample std over "
            f"seeds, this checkpoint's seed ({seed}), and every seed.",
            "",
            f"| figure | mean ± std | seed {seed} | per seed |",
            "|---|---|---|---|",
            *rows,
            "",
        ]
    if gains:
        out += [
            "Gain over the baseline (ours: final-epoch top-1, as the report's gains table, with the 95% Welch "
            "interval over the per-seed values; the paper's gain of the same rows; a direction only where our "
            "interval excludes zero):",
            "",
            *[f"- {g}" for g in gains],
            "",
        ]
    return out


def _papers_numbers(comparisons, metrics, scale: str, reference: Optional[Dict[str, Any]]) -> List[str]:
    out = ["## The paper's numbers", ""]
    if not comparisons:
        return out + [
            "The paper has no row for this run."
            if reference
            else f"{REFERENCE} is missing, so the paper's numbers are not shown.",
            "",
        ]
    out += [
        "ImageNet-1K top-1 (%) of the corresponding rows (`data/paper_reference.yaml`), with the source "
        "mark of each value" + ("; at this scale ours are not comparable with them." if scale != "paper" else "."),
        "",
        f"| table | row | paper top-1 | statistic | ours, same statistic ({scale}) | paper baseline top-1 "
        "| params (M) | GFLOPs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in comparisons:
        key = STATISTICS.get(row["statistic"], STATISTICS["final"])[0]
        out.append(
            f"| {row['table']} | {row['label']} | {_paper(row.get('top1'))} | {row['statistic']} "
            f"| `{key}` {_ours(metrics, key)} | "
            f"{_paper(row.get('baseline_top1'))} | {_paper(row.get('params_m'))} | "
            f"{_paper(row.get('gflops'))} |"
        )
    entries = ("top1", "baseline_top1", "params_m", "gflops")
    used = sorted({e[1] for row in comparisons for e in map(row.get, entries) if e and e[1]})
    sources = (reference or {}).get("sources", {})
    return out + ["", "Sources: " + "; ".join(f"{m}: {sources.get(m, '?')}" for m in used) + ".", ""]


def _curves() -> List[str]:
    return [
        "## Training curves",
        "",
        "Every seed of the run, as in the report (`reports/index.html`):",
        "",
        f"![training curves]({CURVES})",
        "",
    ]


def _how_to_load(folder_name: str, weights_sha256: str) -> List[str]:
    overlay = "dict(config['pretrained_cfg'], file=f'{folder}/model.safetensors')"
    return [
        "## How to load",
        "",
        "Import `vcarepro.models` first: it registers the VCA models with timm.",
        "",
        "```python",
        "import json, timm, vcarepro.models  # noqa: F401",
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
        "```",
        "",
        "The overlay must carry the exported `pretrained_cfg` (or at least its `num_classes`): with only "
        "`file=`, timm compares the head with the registered 1000 classes and drops it.",
        "",
        f"The exported files were read back this way (`config.json` -> `timm.create_model` -> "
        f"`load_checkpoint`) before the folder was written and gave identical logits. "
        f"`model.safetensors` sha256: `{weights_sha256}`; timm {version('timm')}.",
        "",
    ]


def _how_to_share(run: ClsRun, folder_name: str, license_name: str) -> List[str]:
    return [
        "## How to share it",
        "",
        f"Nothing here uploads. The card's license (`{license_name}`) is the model config's; weights trained "
        "on ImageNet also carry ImageNet's terms of access, so check them before sharing. With your own "
        "Hugging Face account:",
        "",
        "```bash",
        "huggingface-cli login",
        "```",
        "",
        "```python",
        "from huggingface_hub import upload_folder",
        f"upload_folder(repo_id='<you>/{run.name}', folder_path='{folder_name}', repo_type='model')",
        "# or timm.models.push_to_hf_hub(model, '<you>/<name>', model_args=config['model_args']) (writes its own card)",
        "```",
        "",
        f"Then `timm.create_model('hf-hub:<you>/{run.name}', pretrained=True)` loads it "
        "(after `import vcarepro.models`).",
        "",
    ]


def curves_png(root: Path, run: ClsRun) -> Optional[bytes]:
    """The run's training curves (every seed), drawn as the report draws them; None without dvclive logs."""
    uri = draw_curves(run.name, read_curves(root / run.paths.live_dir), CLS_CURVES)
    return None if uri is None else base64.b64decode(uri.split(",", 1)[1])
