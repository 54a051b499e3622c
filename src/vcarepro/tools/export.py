"""A trained classification run's weights in the layout timm and the Hugging Face Hub read.

    python -m vcarepro.tools.export --run deit_tiny-vca [--seed 0] [--out exports/deit_tiny-vca] [--force]

writes one folder per (run, seed): ``config.json`` and ``model.safetensors`` by timm's own
``save_for_hf`` (architecture, the model_args that rebuild the run's shape, the evaluation
preprocessing of its recipe), a model card ``README.md`` (architecture, recipe, metrics with the
seeds' spread and the Welch interval of the gain over the run's baseline, the paper's reference
numbers with their source marks, the scale) and the run's training curves as ``curves.png``; the card
and the curves are the report package's (``vcarepro.report.card``), written from files as the report reads them;
``SHA256SUMS`` of them last. ``--force`` replaces a previous export, nothing else: a folder holding any file
that is not one of these, listed in its SHA256SUMS, is refused (so ``--out ~ --force`` removes nothing).
Before the folder appears, the exported files are read back through timm and must give the
trained model's outputs exactly. Pushing is the user's own step (``huggingface-cli login``, then
``huggingface_hub.upload_folder``); nothing here reaches the network.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.nn as nn

from vcarepro.core.errors import BadInput, MissingInput, run_stage
from vcarepro.core.integrity import MANIFEST, intact_file, listing
from vcarepro.core.io import atomic_directory, write_text
from vcarepro.core.recipes import ClsRecipe
from vcarepro.params.config import compose, load_params
from vcarepro.params.runs import CLS_DATA, ClsRun, cls_run
from vcarepro.report.card import CURVES, REFERENCE, curves_png, model_card
from vcarepro.report.collect import read_json

WEIGHTS = "model.safetensors"
EXPORTED_FILES = frozenset({"config.json", WEIGHTS, "README.md", CURVES})  # and SHA256SUMS, written last
EXPORTS_DIR = Path("exports")
PROBE_SEED = 0


def default_out(run: str, seed: int) -> Path:
    return EXPORTS_DIR / (run if seed == 0 else f"{run}-seed{seed}")


# -- the model --------------------------------------------------------------------------------------------


def trained_model(run: ClsRun, seed: int, root: Path) -> nn.Module:
    """The run's model at its trained shape with the seed's final weights, in eval mode."""
    from safetensors.torch import load_file

    from vcarepro.train.classification import ClassifierSpec

    if seed not in run.seeds:
        raise BadInput(
            f"run {run.name!r} trains seeds {', '.join(map(str, run.seeds))}, not {seed}; pass one of them with --seed."
        )
    weights = root / run.paths.seed_dir(seed) / WEIGHTS
    if not weights.is_file():
        raise MissingInput(
            f"{weights} is missing: seed {seed} of {run.name} is not trained; "
            f"run `dvc repro train_cls@{run.name}` first."
        )
    intact_file(weights, f"train_cls@{run.name}")  # the bytes train_cls wrote, or one sentence
    state = load_file(str(weights))
    if "head.weight" not in state:
        raise BadInput(
            f"{weights} has no classifier head (head.weight); it is not a train_cls output, "
            f"retrain with `dvc repro -f -s train_cls@{run.name}`."
        )
    model = ClassifierSpec.for_run(run).create(num_classes=state["head.weight"].shape[0])
    model.load_state_dict(state)
    return model.eval()


def input_size(recipe: ClsRecipe) -> Tuple[int, int, int]:
    """The image size the run trained and was evaluated at (its recipe's, which sets the model's too)."""
    size = recipe.img_size
    return (3, *size) if isinstance(size, (list, tuple)) else (3, size, size)


def data_config(recipe: ClsRecipe) -> Dict[str, Any]:
    """The evaluation preprocessing the run was measured with (its recipe's), for timm's data config."""
    given = {"crop_pct": recipe.crop_pct, "crop_mode": recipe.crop_mode, "interpolation": recipe.interpolation}
    return {"input_size": input_size(recipe), **{k: v for k, v in given.items() if v is not None}}


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


def paper_params(root: Path) -> Optional[Dict[str, Any]]:
    """The paper scale's params from the project's ``conf/`` (as the report composes them), None without it."""
    return compose(["scale=paper"], config_dir=root / "conf") if (root / "conf").is_dir() else None


def _drop_source_tag(config_path: Path) -> None:
    """Remove the registered weights' tag (timm's DeiT carries ``fb_in1k``): these weights are not those."""
    config = json.loads(config_path.read_text())
    if config.get("pretrained_cfg", {}).pop("tag", None) is not None:
        write_text(config_path, json.dumps(config, indent=2))


def not_an_export(out: Path) -> Optional[str]:
    """None when ``out`` holds only a previous export: its own files, each listed in its SHA256SUMS (which no
    export before SHA256SUMS has: such a folder is removed by hand). Else the first thing in it that is not one
    (``out`` itself when it is a file). Reads the folder's top level only, lazily: ``--out ~`` stops at once."""
    if not out.is_dir():
        return "a file"
    try:  # the manifest's own reading (core.integrity), as the stages check folders
        listed = listing(out) or {}
    except (OSError, UnicodeDecodeError):  # a SHA256SUMS no export wrote
        listed = {}
    for entry in out.iterdir():
        if entry.name == MANIFEST:
            continue
        if entry.name not in EXPORTED_FILES or entry.is_symlink() or not entry.is_file() or entry.name not in listed:
            return f"'{entry.name}'"
    required = EXPORTED_FILES - {CURVES}  # curves.png only where there were curves
    return None if required <= listed.keys() else f"'{MANIFEST}'"


def _shown(path: Path, root: Path) -> str:
    """``path`` as a user of the project names it: relative to the project when inside it."""
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return path.as_posix()


# -- the export -----------------------------------------------------------------------------------------


def export_run(
    name: str, *, seed: int = 0, out: str | Path | None = None, root: str | Path = ".", force: bool = False
) -> Path:
    """Write the folder for seed ``seed`` of classification run ``name``; returns its path.

    ``root`` is the project (params.yaml, runs/, data/); ``out`` defaults to ``exports/<run>`` under it.
    The folder appears only complete (built under a temporary name, then renamed).
    """
    from timm.models import save_for_hf

    root = Path(root)
    params = load_params(root / "params.yaml")
    run = cls_run(params, name)
    given = Path(out) if out is not None else root / default_out(name, seed)
    out = _followed(given)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        foreign = not_an_export(out)
        if foreign:
            raise BadInput(
                f"{out} holds {foreign}, which no export of this tool wrote; even --force replaces only a previous "
                f"export (the files its {MANIFEST} lists), so move that away or choose another --out."
            )
        if not force:
            raise BadInput(f"{out} holds a previous export; pass --force to replace it or choose another --out.")
    model = trained_model(run, seed, root)
    expected = probe(model, input_size(run.recipe))
    metrics = read_json(root / run.paths.metrics)
    reference = None
    if (root / REFERENCE).is_file():
        from vcarepro.report.reference import load_reference

        reference = load_reference(root / REFERENCE)
    model_config: Dict[str, Any] = {}
    classes = root / CLS_DATA / "classes.json"
    if classes.is_file():
        names = [c["name"] for c in sorted(json.loads(classes.read_text()), key=lambda c: c["index"])]
        if len(names) == model.num_classes:
            model_config["label_names"] = names
    with atomic_directory(out, digests=True) as tmp:  # SHA256SUMS last: what a later --force may replace
        save_for_hf(
            model, str(tmp), model_config=model_config, safe_serialization=True, data_config=data_config(run.recipe)
        )
        _drop_source_tag(tmp / "config.json")
        got = probe(rebuild(tmp), input_size(run.recipe))
        if not torch.equal(got, expected):
            raise RuntimeError(
                f"the exported {name} does not reload to the trained model's outputs "
                f"(max difference {(got - expected).abs().max().item():.3g}); this is a bug."
            )
        png = curves_png(root, run)
        if png is not None:
            (tmp / CURVES).write_bytes(png)
        config = json.loads((tmp / "config.json").read_text())
        card = model_card(
            run=run,
            seed=seed,
            params=params,
            config=config,
            metrics=metrics,
            reference=reference,
            root=root,
            n_params=sum(p.numel() for p in model.parameters()),
            weights_sha256=hashlib.sha256((tmp / WEIGHTS).read_bytes()).hexdigest(),
            has_curves=png is not None,
            folder_name=_shown(out, root),
            paper_params=paper_params(root),
        )
        (tmp / "README.md").write_text(card, encoding="utf-8")
    return given


def _followed(out: Path) -> Path:
    """Where ``--out`` leads: a link is followed (exports/ linked onto a larger disk), so the export replaces the
    folder it points at, under the rules of any folder, and the link itself stays; a link that loops is refused."""
    if not out.is_symlink():
        return out
    try:
        return out.resolve(strict=False)
    except (RuntimeError, OSError):  # Python 3.11 raises RuntimeError for a loop, 3.13 OSError
        raise BadInput(
            f"--out {out} is a link that leads back to itself; point it at a folder or choose another --out."
        ) from None


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m vcarepro.tools.export",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--run", required=True, help="a classification run of params.yaml (cls_runs)")
    parser.add_argument("--seed", type=int, default=0, help="which trained seed to export (default 0)")
    parser.add_argument("--out", default=None, help="the folder to write (default exports/<run>)")
    parser.add_argument("--force", action="store_true", help="replace a previous export in --out (nothing else)")
    args = parser.parse_args(argv)
    folder = export_run(args.run, seed=args.seed, out=args.out, force=args.force)
    print(f"export {args.run} seed {args.seed}: {folder} ({', '.join(sorted(p.name for p in folder.iterdir()))})")


if __name__ == "__main__":
    run_stage(main)
