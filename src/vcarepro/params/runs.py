"""From params.yaml to what one stage of one named run needs. Stages call only this and the library."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List

from vcarepro.core.choices import OBJECTIVES
from vcarepro.core.errors import BadInput, UnknownName
from vcarepro.core.recipes import ClsRecipe, GenRecipe
from vcarepro.params import schema
from vcarepro.params.config import section

RUNS_DIR = Path("runs")
# Resumable training state lives outside runs/ and outside DVC: it is scratch for a
# killed run to continue from, so DVC must neither delete it before a re-run nor
# hash it into what the report depends on.
CHECKPOINTS_DIR = Path("checkpoints")
CLS_DATA = Path("data/cls")
GEN_DATA = Path("data/gen")
FID_REFERENCE = Path("data/fid_reference")
SMOKE_INPUTS = Path("data/smoke")  # the smoke scale's stand-ins (stage smoke_inputs; conf/scale/smoke.yaml points here)


def _run(params: Dict[str, Any], branch: str, name: str):
    """The run's entry as its schema model, built from what params.yaml holds (as YAML typed it)."""
    runs = section(params, f"{branch}_runs")
    if name not in runs:
        raise UnknownName(f"no run {name!r} under {branch}_runs in params.yaml; choose one of {', '.join(runs)}.")
    entry = schema.ClsRun if branch == "cls" else schema.GenRun
    run = entry.model_construct(**{**dict.fromkeys(entry.model_fields), **runs[name]})  # absent keys: None
    if run.model not in section(params, "models"):
        raise UnknownName(f"run {name!r} names model {run.model!r}, which is not under models in params.yaml.")
    seeds = run.seeds or []
    if not seeds or len(set(seeds)) != len(seeds) or not all(isinstance(s, int) for s in seeds):
        raise BadInput(f"run {name!r} needs a list of distinct integer seeds, got {seeds!r}.")
    return run


@dataclass(frozen=True)
class RunPaths:
    root: Path
    checkpoints: Path

    def seed_dir(self, seed: int) -> Path:
        return self.root / "train" / f"seed_{seed}"

    def ckpt_dir(self, seed: int) -> Path:
        return self.checkpoints / f"seed_{seed}"

    @property
    def live_dir(self) -> Path:
        return self.root / "live"

    def samples(self, seed: int) -> Path:
        return self.root / "samples" / f"seed_{seed}.npz"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.json"

    @property
    def headline(self) -> Path:
        return self.root / "headline.json"


def run_paths(branch: str, name: str) -> RunPaths:
    if not schema.safe_name(name):  # the schema refuses it first; this guards every other caller
        raise BadInput(
            f"run name {name!r} cannot become a directory under {RUNS_DIR}/{branch}; use letters, digits, "
            f"'_' or '-' and rename it in conf/."
        )
    return RunPaths(RUNS_DIR / branch / name, CHECKPOINTS_DIR / branch / name)


@dataclass(frozen=True)
class ClsRun:
    name: str
    model: Dict[str, Any]
    shape: Dict[str, Any]
    recipe: ClsRecipe  # the named recipe with the scale's overrides: what trains
    seeds: List[int]
    paths: RunPaths
    recipe_name: str  # its entry of cls_recipes


def _gen_recipe(params: Dict[str, Any], name: str, overrides: Dict[str, Any]) -> GenRecipe:
    """The generation recipe with the run's own overrides on top."""
    recipe = section(params, "gen_recipe")
    unknown = sorted(set(overrides) - set(recipe))
    if unknown:
        raise UnknownName(
            f"run {name!r} overrides {', '.join(unknown)}, which gen_recipe does not have; "
            f"fix the name or add the knob to gen_recipe in conf/config.yaml."
        )
    return GenRecipe.model_construct(**{**recipe, **overrides})


def cls_recipe(params: Dict[str, Any], recipe_name: str) -> ClsRecipe:
    """A named classification recipe with the scale's overrides on top: what a run of that recipe trains with."""
    recipes = section(params, "cls_recipes")
    if recipe_name not in recipes:
        raise UnknownName(
            f"no recipe {recipe_name!r} under cls_recipes in params.yaml; choose one of "
            f"{', '.join(recipes)} (conf/cls_recipe/)."
        )
    # null: the knob is not overridden (conf/config.yaml lists every knob so that -S works at every scale)
    overrides = {k: v for k, v in (params.get("cls_recipe_overrides") or {}).items() if v is not None}
    unknown = sorted(set(overrides) - set(recipes[recipe_name]))
    if unknown:
        raise UnknownName(
            f"cls_recipe_overrides sets {', '.join(unknown)}, which recipe {recipe_name!r} does not have; "
            f"fix the name in conf/."
        )
    recipe = ClsRecipe.model_construct(**{**recipes[recipe_name], **overrides})
    if recipe.cooldown_epochs >= recipe.epochs:
        raise BadInput(
            f"recipe {recipe_name!r} holds its last cooldown_epochs={recipe.cooldown_epochs} epochs at "
            f"min lr, which leaves nothing of epochs={recipe.epochs} (epochs counts every epoch trained); "
            f"set cls_recipe_overrides.cooldown_epochs=0 or raise epochs."
        )
    return recipe


def cls_run(params: Dict[str, Any], name: str) -> ClsRun:
    run = _run(params, "cls", name)
    return ClsRun(
        name,
        section(params, "models")[run.model],
        dict(section(params, "cls_shape") or {}),
        cls_recipe(params, run.recipe),
        list(run.seeds),
        run_paths("cls", name),
        run.recipe,
    )


@dataclass(frozen=True)
class GenRun:
    name: str
    model: Dict[str, Any]
    objective: str
    shape: Dict[str, Any]
    recipe: GenRecipe
    sampling: Dict[str, Any]
    seeds: List[int]
    paths: RunPaths


def gen_run(params: Dict[str, Any], name: str) -> GenRun:
    run = _run(params, "gen", name)
    if run.objective not in OBJECTIVES:
        raise BadInput(f"run {name!r} has objective {run.objective!r}; choose one of {', '.join(OBJECTIVES)}.")
    return GenRun(
        name,
        section(params, "models")[run.model],
        run.objective,
        dict(section(params, "gen_shape") or {}),
        _gen_recipe(params, name, run.recipe or {}),
        section(params, "sampling"),
        list(run.seeds),
        run_paths("gen", name),
    )
