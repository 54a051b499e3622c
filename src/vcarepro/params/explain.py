"""``vcarepro explain RUN [overrides...]`` (``python -m vcarepro.params.explain``): every resolved knob of a run, its
value, the conf/ file (or command-line override) that set it, and the stages that declare it in dvc.yaml."""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from vcarepro.core.errors import USER_ERROR_STATUS, UserError
from vcarepro.core.recipes import ClsRecipe, GenRecipe, input_path
from vcarepro.params import config, runs
from vcarepro.params.stage_facts import PARAMS, PIPELINE, _resolve, stage_definition

WIDTH = 120  # the table fits this many columns (a long value may push its own row past it)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="vcarepro explain",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Every resolved knob of a run (an entry of cls_runs or gen_runs): its value, the conf/ file "
        "(or command-line override) that set it, and the stages whose dvc.yaml params declare it.\n\n"
        "  vcarepro explain deit_tiny-vca                # conf/ as it is (what params.yaml holds)\n"
        "  vcarepro explain deit_tiny-vca scale=paper    # Hydra overrides, as vcarepro config takes them",
    )
    parser.add_argument("run", help="a key of cls_runs or gen_runs")
    parser.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="Hydra overrides of conf/ (nothing is written)"
    )
    parser.add_argument("--json", action="store_true", help="print the knobs as JSON")
    args = parser.parse_intermixed_args(sys.argv[1:] if argv is None else argv)
    try:
        result = explain(args.run, args.overrides, config.project_root())
    except UserError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        return USER_ERROR_STATUS
    print(json.dumps(result, indent=1) if args.json else render(result))
    return 0


_ABSENT = object()


def _get(tree: Any, path: Sequence[Any]) -> Any:
    for key in path:
        if not isinstance(tree, dict) or key not in tree:
            return _ABSENT
        tree = tree[key]
    return tree


def _leaves(value: Any, path: Tuple[str, ...]) -> List[Tuple[Tuple[str, ...], Any]]:
    """(path, value) of every leaf under ``path``; an empty mapping is a leaf of its own (cls_shape: {})."""
    if isinstance(value, dict) and value:
        return [leaf for key, sub in value.items() for leaf in _leaves(sub, (*path, str(key)))]
    return [(path, value)]


def _covers(declared: str, key: str) -> bool:
    """A stage that declares ``declared`` reads ``key`` (or part of it)."""
    return key == declared or key.startswith(declared + ".") or declared.startswith(key + ".")


class _Sources:
    """Which conf/ file, or command-line override, set a key: vcarepro.params.config's own finder (the one its refusals
    use), with Hydra's defaults list computed once for every key."""

    def __init__(self, overrides: Sequence[str], conf: Path, params: Dict[str, Any]):
        self.config = config
        self.conf = conf
        self.overrides = [
            o for o in config._parse(list(overrides)) if not o.is_delete() and not config._is_group(o, conf)
        ]
        self.files = config._conf_files(list(overrides), conf)
        self.params = params

    def override(self, path: Tuple[Any, ...]) -> Optional[str]:
        for override in reversed(self.overrides):
            keys = tuple(override.key_or_group.split("."))
            if keys == path[: len(keys)] or path == keys[: len(path)]:
                return override.input_line
        return None

    def file(self, path: Tuple[Any, ...]) -> Tuple[Optional[str], Any]:
        """The file that set ``path`` and the value it wrote there (an interpolation stays as written)."""
        name = self.config._locate(self.files, path, self.params, same_value=False)
        written = next(
            (
                held
                for file, tree in reversed(self.files)
                if file == name
                for held in [_get(tree, path)]
                if held is not _ABSENT
            ),
            _ABSENT,
        )
        return name, written

    def earlier(self, path: Tuple[Any, ...], name: str) -> Optional[Dict[str, Any]]:
        """The file before ``name`` in the composition that held another value at ``path`` (what ``name``
        overrides: conf/config.yaml's paper value under a scale's), else None."""
        order = [file for file, _ in self.files]
        if name not in order:
            return None
        mine = _get(dict(self.files)[name], path)
        for file, tree in reversed(self.files[: order.index(name)]):
            held = _get(tree, path)
            if held is not _ABSENT and held is not None and held != mine:
                return {"file": file, "value": held}
        return None

    def sentence(self, path: Tuple[Any, ...]) -> str:
        """For vcarepro.params.schema.validate, worded as vcarepro.params.config words it."""
        by = self.override(path)
        if by:
            return f"the command-line override `{by}`"
        return self.file(path)[0] or f"the composition of {self.conf.name}/"

    def where(self, path: Tuple[Any, ...]) -> Dict[str, Any]:
        by = self.override(path)
        name, written = self.file(path)
        found: Dict[str, Any] = {
            "set_by": f"command line `{by}`" if by else name or f"the composition of {self.conf.name}/",
            "file": name,
            "override": by,
        }
        if by and name:
            found["file_value"] = written
        if name and not by:
            why = next((self.config.reason(tree, path) for file, tree in reversed(self.files) if file == name), None)
            if why:
                found["why"] = why  # the `why:` beside the value in the file that set it
            earlier = self.earlier(path, name)
            if earlier:
                found["over"] = earlier
        if isinstance(written, str) and "${" in written:
            found["written"] = written  # e.g. seeds: ${family_seeds}, and where that is set
            whole = re.fullmatch(r"\$\{\s*([\w.-]+)\s*\}", written)
            if whole:
                found["written_from"] = self.where(tuple(whole.group(1).split(".")))["set_by"]
        return found


def _stages(
    project: Path, params: Dict[str, Any], branch: str, run: str
) -> Tuple[List[str], List[str], Dict[str, List[str]]]:
    """The run's own stages (``train_cls@run``, ...), every stage without foreach, and what each declares under
    ``params:``, as :func:`vcarepro.params.stage_facts.stage_definition` resolves dvc.yaml over these params."""
    import yaml

    pipeline = project / PIPELINE if (project / PIPELINE).is_file() else config.REPO_ROOT / PIPELINE
    stages = (yaml.safe_load(pipeline.read_text()) or {}).get("stages") or {}
    own, shared = [], []
    for group, definition in stages.items():
        if "foreach" not in definition:
            shared.append(group)
        else:
            items = _resolve(definition["foreach"], params)
            if isinstance(items, dict) and run in items:
                own.append(f"{group}@{run}")
    declared = {}
    with tempfile.TemporaryDirectory(prefix="vcarepro-explain-") as tmp:
        # the resolver reads root/params.yaml and root/dvc.yaml: these params, that pipeline
        (Path(tmp) / PARAMS).write_text(yaml.safe_dump(params, sort_keys=False))
        (Path(tmp) / PIPELINE).write_text(pipeline.read_text())
        for stage in own + shared:
            declared[stage] = stage_definition(stage, tmp)[1]
    # a stage that names no key (check_params, which reads the whole file only to refuse a typo) sets no knob
    shared = [s for s in shared if declared[s]]
    return own, shared, declared


def _empty_groups(branch: str, run: str, entry: Dict[str, Any]) -> Tuple[Dict[str, Dict[str, Any]], Tuple[str, ...]]:
    """The knob groups, in order (a declared param not claimed by one of the first four joins its section's group),
    and the params the recipe group claims."""
    run_key, model_key, shape_key = f"{branch}_runs.{run}", f"models.{entry['model']}", f"{branch}_shape"
    if branch == "cls":
        recipe_keys: Tuple[str, ...] = (f"cls_recipes.{entry['recipe']}", "cls_recipe_overrides")
        recipe_title = f"cls_recipes.{entry['recipe']}, cls_recipe_overrides on top"
    else:
        recipe_keys = ("gen_recipe",)
        recipe_title = "gen_recipe" + (f", {run_key}.recipe on top" if entry.get("recipe") else "")
    groups = {
        "run": {"title": run_key, "prefix": run_key, "knobs": []},
        "model": {"title": model_key, "prefix": model_key, "knobs": []},
        "recipe": {"title": recipe_title, "prefix": "", "knobs": []},
        "shape": {"title": shape_key, "prefix": shape_key, "knobs": []},
        "numerics": {"title": "numerics", "prefix": "numerics", "knobs": []},
    }
    return groups, recipe_keys


class _Knobs:
    """The knobs explained, by group, each key once, with the file or override that set it and the stages reading it
    (of ``stages``, those whose ``declared`` params cover it)."""

    def __init__(self, groups: Dict[str, Dict[str, Any]], sources: "_Sources", stages: List[str], declared) -> None:
        self.groups, self.sources, self.stages, self.declared, self.seen = groups, sources, stages, declared, set()

    def add(self, group: str, path: Tuple[str, ...], value: Any, knob: Optional[str] = None, **extra: Any) -> None:
        key = ".".join(path)
        if key in self.seen:
            return
        self.seen.add(key)
        self.groups.setdefault(group, {"title": group, "prefix": group, "knobs": []})
        prefix = self.groups[group]["prefix"]
        knob = knob or (key[len(prefix) + 1 :] if key.startswith(prefix + ".") else key)
        self.groups[group]["knobs"].append(
            {
                "group": group,
                "knob": knob,
                "key": key,
                "value": value,
                **self.sources.where(path),
                **extra,
                "read_by": [s for s in self.stages if any(_covers(p, key) for p in self.declared[s])],
            }
        )


def explain(run: str, overrides: Sequence[str] = (), project: Path = config.REPO_ROOT) -> Dict[str, Any]:
    """Every knob ``run`` resolves to under ``overrides`` of ``project``/conf, as :func:`render` prints it.

    The knobs are what the run's own stages (train_cls@run, eval_cls@run; train_gen, sample_gen, eval_gen)
    declare as params in dvc.yaml, with the recipe resolved as :mod:`vcarepro.params.runs` resolves it.
    """
    from vcarepro.core.errors import UnknownName

    overrides = list(overrides)
    conf = project / "conf" if (project / "conf").is_dir() else config.REPO_ROOT / "conf"
    params = config.compose(overrides, conf)
    sources = _Sources(overrides, conf, params)
    config.validate(params, sources.sentence)  # what `vcarepro config` would refuse is refused here too
    scale = params.get("scale")
    branch = next((b for b in ("cls", "gen") if run in (params.get(f"{b}_runs") or {})), None)
    if branch is None:
        raise UnknownName(_unknown_run(run, overrides, params, conf))
    resolved = runs.cls_run(params, run) if branch == "cls" else runs.gen_run(params, run)
    entry = params[f"{branch}_runs"][run]
    model = entry["model"]
    own, shared, declared = _stages(project, params, branch, run)
    skipped: Dict[str, str] = {}  # knobs the run never applies: listed apart, each with its switch
    if branch == "cls":
        from vcarepro.train.classification import unapplied

        skipped = unapplied(resolved.recipe)

    groups, recipe_keys = _empty_groups(branch, run, entry)
    run_key, model_key, shape_key = (groups[name]["prefix"] for name in ("run", "model", "shape"))
    knobs = _Knobs(groups, sources, own + shared, declared)
    for stage in own:
        for param in declared[stage]:
            path = tuple(param.split("."))
            if param == run_key:
                for leaf, value in _leaves(entry, path):
                    if not (branch == "gen" and leaf[len(path)] == "recipe"):  # the recipe group shows those
                        knobs.add("run", leaf, value)
            elif param == model_key:
                for leaf, value in _leaves(params["models"][model], path):
                    knobs.add("model", leaf, value)
            elif param in recipe_keys or param.startswith("gen_recipe."):
                if not groups["recipe"]["knobs"]:
                    _recipe_knobs(knobs.add, params, branch, run, entry, resolved.recipe, skipped)
            elif param == shape_key:
                for leaf, value in _leaves(params.get(shape_key) or {}, path):
                    knobs.add("shape", leaf, value)
            else:
                value = _get(params, path)
                for leaf, sub in _leaves(value, path) if value is not _ABSENT else []:
                    knobs.add(path[0], leaf, sub)
    return {
        "run": run,
        "kind": {"cls": "classification", "gen": "generation"}[branch],
        "branch": branch,
        "scale": scale,
        "overrides": overrides,
        "conf": str(conf),
        "stages": own,
        "every_stage": own + shared,
        "groups": [
            {"group": name, "title": g["title"], "knobs": g["knobs"]} for name, g in groups.items() if g["knobs"]
        ],
        "unapplied": skipped,
        "input_path": input_path(resolved.recipe) if branch == "cls" else None,
    }


def _recipe_knobs(
    add,
    params: Dict[str, Any],
    branch: str,
    run: str,
    entry: Dict[str, Any],
    recipe: ClsRecipe | GenRecipe,
    skipped: Dict[str, str],
) -> None:
    """The recipe the run trains with (params.runs.cls_run / gen_run resolved it), each knob where its value lives:
    the override where one replaced the named recipe's value (which is kept beside it), else the recipe."""
    if branch == "cls":
        name = entry["recipe"]
        over = {k: v for k, v in (params.get("cls_recipe_overrides") or {}).items() if v is not None}
        base, base_path, over_path = params["cls_recipes"][name], ("cls_recipes", name), ("cls_recipe_overrides",)
        from vcarepro.train.classification import scaled_lrs

        at_optimizer = scaled_lrs(recipe)
    else:
        name = "gen_recipe"
        over = entry.get("recipe") or {}
        base, base_path, over_path = params["gen_recipe"], ("gen_recipe",), ("gen_runs", run, "recipe")
        at_optimizer = {}
    for knob, value in recipe.model_dump(exclude_unset=True).items():
        if knob in skipped:
            continue  # explain lists it apart, with the switch that leaves it out
        extra: Dict[str, Any] = {}
        if knob in at_optimizer and at_optimizer[knob] != value:
            extra["at_optimizer"] = at_optimizer[knob]
        if knob in over:
            extra["replaces"] = {"key": ".".join((*base_path, knob)), "value": base.get(knob), "recipe": name}
            add("recipe", (*over_path, knob), value, knob=knob, **extra)
        else:
            add("recipe", (*base_path, knob), value, knob=knob, **extra)


def _unknown_run(run: str, overrides: List[str], params: Dict[str, Any], conf: Path) -> str:

    runs = [*(params.get("cls_runs") or {}), *(params.get("gen_runs") or {})]
    close = difflib.get_close_matches(run, runs, n=3, cutoff=0.5)
    where = f"scale {params.get('scale')}" + (f" with {' '.join(overrides)}" if overrides else "")
    elsewhere = []
    others = [o for o in overrides if not o.startswith("scale=")]
    for scale in sorted(p.stem for p in (conf / "scale").glob("*.yaml")):
        if scale == params.get("scale"):
            continue
        try:
            other = config.compose([*others, f"scale={scale}"], conf)
        except UserError:
            continue
        if run in (other.get("cls_runs") or {}) or run in (other.get("gen_runs") or {}):
            elsewhere.append(scale)
    hint = (
        f"; it is a run of scale {', '.join(elsewhere)} (add scale={elsewhere[0]})"
        if elsewhere
        else f"; did you mean {', '.join(close)}?"
        if close
        else f"; choose one of {', '.join(runs)}."
    )
    return f"no run {run!r} in cls_runs or gen_runs at {where}{hint}" + ("" if hint.endswith((".", "?")) else ".")


# ----------------------------------------------------------------------------- explain's table


def _show(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value)


def _readers(stages: List[str], every: List[str]) -> str:
    if stages and set(stages) == set(every):
        return "every stage"
    return ", ".join(stages) if stages else "no stage"


def _note(knob: Dict[str, Any]) -> str:
    notes = []
    if knob.get("override") and knob.get("file"):
        notes.append(f"over {knob['file']}'s {_show(knob.get('file_value'))}")
    if knob.get("written"):
        notes.append(
            f"written {knob['written']}" + (f", set in {knob['written_from']}" if knob.get("written_from") else "")
        )
    if knob.get("replaces"):
        was = knob["replaces"]
        notes.append(
            f"{was['recipe']}'s is the same"
            if was["value"] == knob["value"]
            else f"overrides {was['recipe']}'s {_show(was['value'])}"
        )
    if knob.get("over") and not knob.get("replaces"):
        notes.append(f"over {knob['over']['file']}'s {_show(knob['over']['value'])}")
    if "at_optimizer" in knob:
        notes.append(f"x batch_size/512 = {knob['at_optimizer']:.6g} at the optimizer")
    return f" ({'; '.join(notes)})" if notes else ""


def render(result: Dict[str, Any]) -> str:
    """explain's result as a plain table, grouped, each group headed by the stages that read all of its knobs."""
    every = result["every_stage"]
    how = (
        f"with {' '.join(result['overrides'])}"
        if result["overrides"]
        else "as it is (the default composition, which params.yaml holds)"
    )
    path = {"pil": "PIL", "fast": "fast"}.get(result["input_path"])
    trains = f"; its training images come through the {path} input path" if path else ""
    lines = textwrap.wrap(
        f"{result['run']}: a {result['kind']} run at scale {result['scale']}, conf/ {how}; "
        f"its stages: {', '.join(result['stages'])}{trains}",
        WIDTH,
        subsequent_indent="  ",
    )
    knobs = [k for g in result["groups"] for k in g["knobs"]]
    name_w = max(len(k["knob"]) for k in knobs)
    value_w = min(max(len(_show(k["value"])) for k in knobs), 16)  # a longer value pushes its own row
    lines += ["", f"  {'knob':<{name_w}}  {'value':<{value_w}}  set by (conf/ file or command-line override)"]
    for group in result["groups"]:
        common = [s for s in every if all(s in k["read_by"] for k in group["knobs"])]
        title = group["group"] if group["title"] == group["group"] else f"{group['group']}: {group['title']}"
        head = f"{title}  (read by {_readers(common, every)})"
        lines += [""] + textwrap.wrap(head, WIDTH, subsequent_indent="    ", break_on_hyphens=False)
        for knob in group["knobs"]:
            also = [s for s in knob["read_by"] if s not in common]
            text = knob["set_by"] + _note(knob) + (f" (also read by {', '.join(also)})" if also else "")
            text += f": why: {knob['why']}" if knob.get("why") else ""
            row = f"  {knob['knob']:<{name_w}}  {_show(knob['value']):<{value_w}}  "
            # what does not fit continues under the set-by column
            lines += textwrap.wrap(
                text,
                max(WIDTH, len(row) + 40),
                initial_indent=row,
                subsequent_indent=" " * (6 + name_w + value_w),
                break_on_hyphens=False,
            )
    skipped: Dict[str, List[str]] = {}
    for knob, why in (result.get("unapplied") or {}).items():
        skipped.setdefault(why, []).append(knob)
    for why, knobs in skipped.items():
        lines += [""] + textwrap.wrap(
            f"not applied by this run ({why}): {', '.join(knobs)}", WIDTH, subsequent_indent="    "
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())


if __name__ == "__main__":
    sys.exit(main())
