"""What a stage's result depends on, read from the stage's own definition in dvc.yaml.

A checkpoint resumes only under the facts DVC re-runs the stage on (docs/faults.md), so they are asked of DVC,
not listed by hand, and dependencies hashed with DVC's own md5s from its state database. Outside a DVC
project (a stage script run by hand in a scratch folder) the code checkout's dvc.yaml is read, filled from the local
params.yaml: what another stage writes is read from that folder alone, the pipeline's sources from the checkout.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any, Dict, List, Tuple

from vcarepro.core.errors import BadInput

REPO_ROOT = Path(__file__).resolve().parents[3]  # the checkout this code runs from (src/vcarepro/<folder>/../..)
PIPELINE = "dvc.yaml"
PARAMS = "params.yaml"
_INTERPOLATION = re.compile(r"\$\{\s*([^}]+?)\s*\}")


def stage_facts(stage: str, root: str | Path = ".") -> Dict[str, Any]:
    """``{"stage", "deps": {path: hash}, "params": {key: value}}`` for ``stage`` (e.g. ``train_cls@deit_tiny-vca``).

    A dependency that does not exist hashes as None (DVC itself refuses to run the stage then).
    """
    root = Path(root)
    if (root / ".dvc").is_dir() and (root / PIPELINE).is_file():
        deps, params = _from_dvc(stage, root)
    else:
        deps, params = _from_definition(stage, root)
    # JSON values: what a checkpoint stores and compares (no tuples, no YAML node types)
    return json.loads(json.dumps({"stage": stage, "deps": deps, "params": params}, sort_keys=True))


def digest(*parts: Any) -> str:
    """A short stable hash of JSON-able ``parts`` (facts, a seed, ...)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


# -- inside a DVC project: DVC's own stage loader and hashes -----------------------------------------------------


def _from_dvc(stage: str, root: Path) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    from dvc.dependency.param import ParamsDependency
    from dvc.dvcfile import ProjectFile
    from dvc.exceptions import DvcException
    from dvc.repo import Repo
    from dvc.stage.loader import StageLoader

    deps: Dict[str, Any] = {}
    params: Dict[str, Any] = {}
    try:
        with Repo(str(root)) as repo:
            pipeline = ProjectFile(repo, str(root.resolve() / PIPELINE))
            # dvc.lock is not read: the facts are what is here now, not what was recorded
            loaded = StageLoader(pipeline, pipeline.contents)[stage]
            for dep in loaded.deps:
                if isinstance(dep, ParamsDependency):
                    params.update(dep.get_hash().value)
                    continue
                try:
                    deps[dep.def_path] = dep.get_hash().value
                except FileNotFoundError:
                    deps[dep.def_path] = None
    except DvcException as err:
        raise BadInput(
            f"cannot read what stage {stage} depends on from {root / PIPELINE} ({err}); "
            f"fix dvc.yaml or params.yaml (`dvc status {stage}` shows the same)."
        ) from None
    return deps, params


# -- outside one: the same definition, resolved and hashed here ----------------------------------------------------


def _pipeline(root: Path) -> Tuple[Path, Dict[str, Any], Dict[str, Any]]:
    """(dvc.yaml's path, its stages, the vars from ``root/params.yaml``): root's own pipeline, else the code's."""
    import yaml

    from vcarepro.params.config import load_params

    pipeline = root / PIPELINE if (root / PIPELINE).is_file() else REPO_ROOT / PIPELINE
    stages = (yaml.safe_load(pipeline.read_text()) or {}).get("stages") or {}
    return pipeline, stages, dict(load_params(root / PARAMS))


def _expanded(group: str, definition: Dict[str, Any], context: Dict[str, Any]) -> Dict[str, Tuple[Dict, Dict]]:
    """``{stage name: (its definition, its context)}``, one per ``foreach`` entry or the one stage."""
    if "foreach" not in definition:
        return {group: (definition, context)}
    items = _resolve(definition["foreach"], context)
    if not isinstance(items, dict):
        raise BadInput(f"{group}'s foreach ({definition['foreach']}) in {PIPELINE} names no section of {PARAMS}.")
    return {f"{group}@{k}": (definition["do"], {**context, "key": k, "item": v}) for k, v in items.items()}


def stage_definition(stage: str, root: str | Path = ".") -> Tuple[List[str], List[str]]:
    """(deps, params) of ``stage`` as DVC resolves them: ``foreach`` over a params section, ``${key}``, ``${item.x}``.

    Reads ``root/dvc.yaml`` if there is one, else the code's own; the vars come from ``root/params.yaml``.
    """
    return _definition(stage, *_pipeline(Path(root)))


def _definition(
    stage: str, pipeline: Path, stages: Dict[str, Any], context: Dict[str, Any]
) -> Tuple[List[str], List[str]]:
    group, _, key = stage.partition("@")
    if group not in stages:
        raise BadInput(f"{pipeline} has no stage {group!r}; name one of {', '.join(stages)}.")
    if key and "foreach" not in stages[group]:
        raise BadInput(f"stage {group} in {pipeline} has no foreach, so {stage} names nothing; drop @{key}.")
    runs = _expanded(group, stages[group], context)
    if stage not in runs:
        raise BadInput(
            f"stage {stage} is not one of {group}'s entries in {pipeline}; name a run of its "
            f"foreach ({stages[group]['foreach']})."
        )
    definition, context = runs[stage]
    deps = [_resolve(d, context) for d in definition.get("deps") or []]
    params = []
    for entry in definition.get("params") or []:
        # `- params.yaml:` (the whole file) names no key, as DVC lists it; `- file: [keys]` names its keys
        named = [k for keys in entry.values() for k in keys or []] if isinstance(entry, dict) else [entry]
        params.extend(_resolve(p, context) for p in named)
    return deps, params


def _products(stages: Dict[str, Any], context: Dict[str, Any]) -> List[str]:
    """Every path a stage of the pipeline writes (outs, metrics, plots), resolved."""
    written = []
    for group, definition in stages.items():
        for body, where in _expanded(group, definition, context).values():
            for field in ("outs", "metrics", "plots"):
                for entry in body.get(field) or []:
                    written.extend(_resolve(p, where) for p in (entry if isinstance(entry, dict) else [entry]))
    return written


def _lookup(context: Dict[str, Any], dotted: str) -> Any:
    value: Any = context
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            raise BadInput(
                f"${{{dotted}}} in {PIPELINE} names nothing in {PARAMS}; regenerate it with "
                f"`python -m vcarepro.params.config`."
            )
        value = value[part]
    return value


def _resolve(text: Any, context: Dict[str, Any]) -> Any:
    if not isinstance(text, str):
        raise BadInput(f"{PIPELINE} holds {text!r} where a path or a param name belongs; write it as a string.")
    whole = _INTERPOLATION.fullmatch(text)
    if whole:
        return _lookup(context, whole.group(1))
    return _INTERPOLATION.sub(lambda m: str(_lookup(context, m.group(1))), text)


def _from_definition(stage: str, root: Path) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    pipeline, stages, values = _pipeline(root)
    dep_paths, keys = _definition(stage, pipeline, stages, values)
    params = {key: _lookup(values, key) for key in keys}
    sources = pipeline.parent
    products = _products(stages, values)
    deps = {}
    for path in dep_paths:
        written = any(path == p or path.startswith(p + "/") or p.startswith(path + "/") for p in products)
        # another stage's output is this folder's or missing; a source is the pipeline's own
        where = (root if written else sources) / path
        deps[path] = _content_hash(where) if where.exists() else None
    return deps, params


def _content_hash(path: Path) -> str:
    if path.is_file():
        return hashlib.md5(path.read_bytes()).hexdigest()
    listing = hashlib.md5()
    for file in sorted(p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        listing.update(f"{file.relative_to(path).as_posix()}\0{_content_hash(file)}\n".encode())
    return listing.hexdigest() + ".dir"
