"""What every parameter may hold, checked when a stage starts.

Each section of params.yaml is a pydantic model (:class:`Params`): types, ranges, choices, finite numbers and no
unknown key. :func:`validate` words pydantic's first error as one sentence naming the key, the file that set it and
the fix, so a bad value stops the stage before it writes anything. User-chosen names get a safe alphabet (each
becomes a directory and a DVC stage name); model options are checked against the constructor.
"""

from __future__ import annotations

import difflib
import math
import re
import typing
from typing import Annotated, Any, Callable, Dict, Optional, Tuple, Union

from pydantic import BaseModel, Field, ValidationError, model_validator

from vcarepro.core.choices import ATTENTIONS, BENCH_LAYERS, FLOW_ODE_METHODS, FLOW_SAMPLERS, LABEL_MODES, OBJECTIVES
from vcarepro.core.errors import BadInput
from vcarepro.core.recipes import (
    Bool,
    ClsRecipe,
    ClsRecipeOverrides,
    GenRecipe,
    Int,
    Num,
    One,
    Opt,
    Pos,
    Prob,
    Rule,
    Section,
    Str,
    entry,
    is_int,
    section,
)

# Where a value came from: a name ("params.yaml"), or a function of the key's path that names the file in conf/
# (or the command-line override) that set it (vcarepro.params.config).
Source = Union[str, Callable[[Tuple[Any, ...]], str]]
# The fix every refusal ends with. Where `dvc exp run -S` composed the values, vcarepro.params.dvc_compose swaps it
# for DVC_FIX, so that the hint never tells the user to do what they just did.
FIX = "fix it in conf/ and run `python -m vcarepro.params.config`, or correct the -S override that set it"
DVC_FIX = "correct the -S override (or the conf/ file named) and run `dvc exp run` again"
FULL_DIGEST = 64  # hex digits of a sha256
SHORTEST_PREFIX = 8  # torch hub's file names end in the digest's first 8
# Names joined into paths (runs/<branch>/<run>, checkpoints/...) and DVC stage names: a safe alphabet.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,99}")  # no ".": dvc.yaml reads cls_runs.${key} as a dotted path


class ParamsError(BadInput):
    pass


def flatten(d: Any, prefix: str = "") -> Dict[str, Any]:
    """Nested params as dotted keys, the way `dvc params diff` names them."""
    if isinstance(d, dict):
        out: Dict[str, Any] = {}
        for k, v in d.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out  # an empty section (the paper's shape: no overrides) contributes no knob
    return {prefix.rstrip("."): d}


def safe_name(name: Any) -> bool:
    """Whether ``name`` may become one path component (and a DVC stage name): :data:`NAME`."""
    return isinstance(name, str) and NAME.fullmatch(name) is not None


def is_digest(value: Any) -> bool:
    """A calibration entry's ``sha256``: the whole digest or its publisher's prefix, lowercase hex. The rule both
    the params check and :func:`vcarepro.calibration.check_digest` (for its direct callers) apply."""
    return (
        isinstance(value, str)
        and SHORTEST_PREFIX <= len(value) <= FULL_DIGEST
        and all(c in "0123456789abcdef" for c in value)
    )


def IntOr(*words: str, lo: int = 0):
    return Rule(f"an integer >= {lo} or one of {', '.join(words)}", lambda v: is_int(v, lo) or v in words)


def Names(words: str, distinct: bool = False, among: Tuple[str, ...] = (), lo: Optional[int] = None):
    """A non-empty list of strings (``among`` them), or of integers >= ``lo``; ``distinct``: none twice."""

    def ok(v):
        items = isinstance(v, list) and v and all(is_int(x, lo) if lo is not None else x in among for x in v)
        return bool(items) and (not distinct or len(set(map(str, v))) == len(v))

    return Rule(words, ok)


def _strings(v, nonempty=True) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) and (x or not nonempty) for x in v)


Seeds = Names("a non-empty list of distinct integers >= 0", distinct=True, lo=0)
Hex = Rule(
    f"a hexadecimal sha256 ({FULL_DIGEST} digits) or its publisher's prefix ({SHORTEST_PREFIX} or more)", is_digest
)


Model = entry(  # a models entry: the architecture, the attention by name, and that attention's own knobs
    "Model", optional=("options",), arch=Any, attention=One(*ATTENTIONS),
    options=Rule("a mapping of the attention's knobs", lambda v: v is None or isinstance(v, dict)),
)  # fmt: skip
ClsRun = entry("ClsRun", model=Any, recipe=Any, seeds=Seeds)  # model, recipe: names _references checks
GenRun = entry(  # recipe: overrides of gen_recipe
    "GenRun", optional=("recipe",), model=Any,
    objective=One(*OBJECTIVES, words=" or ".join(OBJECTIVES)), seeds=Seeds,
    recipe=Annotated[Optional[GenRecipe], Field(description="a mapping of gen_recipe knobs")],
)  # fmt: skip
# A released checkpoint (vcarepro.calibration): where it comes from, and what it was published with.
RELEASED = dict(
    file=Str, source=Str, where=Str, options=Rule("a mapping", lambda v: isinstance(v, dict)), sha256=Opt(Hex)
)
CalibrationClassifier = entry(
    "CalibrationClassifier", optional=("options", "sha256"), layout=Str, arch=Str, attention=Str, recipe=Str,
    top1=Num(0.0, 100.0), tolerance=Num(0.0, open_lo=True), **RELEASED,
)  # fmt: skip


class _FlowHasASampler(Section):
    @model_validator(mode="after")
    def _flow_has_a_sampler(self):
        if self.objective == "flow" and self.sampler is None:
            raise ValueError("is a flow model and needs a sampler (sde or ode)")
        return self


CalibrationGenerator = entry(
    "CalibrationGenerator", _FlowHasASampler, ("sampler", "sha256"), layout=Str, arch=Str,
    objective=One(*OBJECTIVES), learn_sigma=Bool,
    image_size=Rule("a multiple of 8 (the SD VAE's downsampling)", lambda v: is_int(v, 8) and v % 8 == 0),
    cfg_scale=Num(0.0), steps=Int(1), fid=Num(0.0), tolerance=Num(0.0, open_lo=True),
    file=Str, source=Str, where=Str, sampler=One(*FLOW_SAMPLERS), sha256=RELEASED["sha256"],
)  # fmt: skip


class _References(Section):
    @model_validator(mode="after")
    def _references(self, info):
        """What one section names in another: a run's model and recipe, a model's arch and options, a shape."""
        source, classes = info.context["source"], info.context["model_classes"]
        models, recipes = self.models or {}, self.cls_recipes or {}
        for name, clf in ((self.calibrate and self.calibrate.classifiers) or {}).items():
            where = f"calibrate.classifiers.{name}"
            if classes:
                _check_model(clf.arch, clf.attention, clf.options, where, source)
            if clf.recipe not in recipes:
                _refuse(source, where, "recipe", f"must name an entry of cls_recipes, got {clf.recipe!r}")
        for name, spec in models.items():
            if classes:
                _check_model(spec.arch, spec.attention, spec.options, f"models.{name}", source)
        for branch in ("cls_runs", "gen_runs"):
            for name, run in (getattr(self, branch) or {}).items():
                if run.model not in models:
                    got = f"({', '.join(models)}), got {run.model!r}{_close(run.model, models)}"
                    _refuse(source, f"{branch}.{name}", "model", f"must name an entry of models {got}")
                shape = getattr(self, f"{branch[:3]}_shape") or {}
                if shape and classes:
                    from vcarepro.models import constructor_arguments

                    consumer, takes, _ = constructor_arguments(models[run.model].arch, models[run.model].attention)
                    for key in shape:
                        if key not in takes:
                            of = f"{consumer}, the model of {branch}.{name}"
                            raise _unknown_key(source, f"{branch[:3]}_shape", key, of, takes)
                if branch == "cls_runs" and run.recipe not in recipes:
                    got = f"({', '.join(recipes)}), got {run.recipe!r}{_close(run.recipe, recipes)}"
                    _refuse(source, f"{branch}.{name}", "recipe", f"must name an entry of cls_recipes {got}")
        return self


Params = section(  # params.yaml, section by section
    "Params", _References, scale=One("embedded", "proxy", "paper", "smoke"),
    smoke=section(
        "Smoke", seed=Int(0), classes=Int(2), train_per_class=Int(1), val_per_class=Int(1), reference_images=Int(2)
    ),
    distributed=section(
        "Distributed", nnodes=IntOr("env", lo=1), nproc_per_node=IntOr("gpu", lo=1), node_rank=IntOr("env"),
        rdzv_endpoint=Str, launcher=One("torchrun", "srun"), grace=Int(0), seed_processes=Int(1),
        rdzv_timeout=Int(1),  # whole seconds, as the launcher takes them
    ),
    cluster=section(
        "Cluster", partition=Opt(Str), account=Opt(Str), qos=Opt(Str), gpu=Bool, nodes=Int(1), gpus_per_node=Int(1),
        cpus_per_task=Int(1), mem_gb=Opt(Int(1)), train_minutes=Int(1), stage_minutes=Int(1), signal_delay_s=Int(30),
        max_requeues=Int(0), poll_seconds=Pos, setup=Rule("a list of shell lines", lambda v: _strings(v, False)),
        local_stages=Rule("a list of stage names (report, or train_cls@<run>)", _strings),
    ),
    numerics=section("Numerics", cpu=One("portable", "native"), gpu=One("deterministic", "fast"), threads=Int(1)),
    progress=section("Progress", interval_s=Num(0.0)),  # 0: a line at every update (tests)
    cls_reference=section("ClsReference", max_train_images=Int(0), c=Pos, image_size=Opt(Int(1))),
    complexity=section(
        "Complexity", cls_img_size=Int(1), cls_num_classes=Int(1), gen_latent_size=Int(1), gen_latent_channels=Int(1),
        gen_num_classes=Int(1), throughput_batch=Int(0), processes=Int(1),
    ),
    prepare_cls=section(
        "PrepareCls", source=One("imagenet", "digits"), imagenet_root=Str, subset_count=Opt(Int(1)), expect_full=Bool,
        subset_classes=Rule("null or a list of wnids", lambda v: v is None or (bool(v) and _strings(v, False))),
        max_bad_fraction=Prob, workers=Int(0), drop_empty_classes=Bool, split_seed=Int(0),
        other_copy=Opt(Rule(
            "a sentence: why archives without ImageNet's published MD5s are used",
            lambda v: isinstance(v, str) and v.strip() != "",
        )),
        val_fraction=Num(0.0, 1.0, open_lo=True, open_hi=True),
    ),
    prepare_gen=section(
        "PrepareGen", source=One("vae_latents", "pixels"), image_size=Int(8), vae=Str, vae_batch_size=Int(1),
        shard_size=Int(1), fid_extractor=One("inception", "digits"), inception_weights=Str, extractor_epochs=Int(0),
        seed=Int(0),
    ),
    gen_recipe=GenRecipe,
    sampling=section(
        "Sampling", num_samples=Int(1), batch_size=Int(1), ddpm_steps=Int(1), labels=One(*LABEL_MODES), vae_decoder=Str,
        flow_sampler=One(*FLOW_SAMPLERS), flow_ode_method=One(*FLOW_ODE_METHODS), flow_steps=Int(2), cfg_scale=Num(0.0),
    ),
    attention_cost=section(  # layers: what attention_cost can measure (vcarepro.tools.bench), the family and controls
        "AttentionCost", sides=Names("a list of integers >= 1", lo=1), dim=Int(1), heads=Int(1), contrast_tokens=Int(1),
        batch=Int(1), min_run_time=Pos, compile=Bool,
        layers=Names(f"a non-empty list of distinct names from {', '.join(BENCH_LAYERS)}", True, BENCH_LAYERS),
    ),
    fid_reference=section(
        "FidReference", adm_npz=Opt(Str), own_statistics=Bool, keep_features=Int(2), batch_size=Int(1), workers=Int(0),
        seed=Int(0),
    ),
    eval_gen=section(
        "EvalGen", isc_split_size=Int(1), kid_subset_size=Int(2), kid_subsets=Int(1), feature_dims=Opt(Int(1)),
        prc_k=Int(1), prc_distance_dtype=One("float16", "float32", "float64"),
    ),
    calibrate=section(
        "Calibrate", checkpoints=Rule("a list of entry names", lambda v: _strings(v, nonempty=False)), dir=Str,
        trust_pickle=Bool, batch_size=Int(1), workers=Int(0), num_samples=Int(1), sample_batch_size=Int(1),
        steps=Opt(Int(1)), vae_decoder=Opt(Str), seed=Int(0),
        classifiers=Optional[Dict[str, CalibrationClassifier]], generators=Optional[Dict[str, CalibrationGenerator]],
    ),
    report=section(
        "Report", reproduce_tolerance_top1=Num(0.0), reproduce_tolerance_fid=Num(0.0), complexity_tolerance=Num(0.0)
    ),
    family_seeds=Names("a non-empty list of distinct integers >= 0", distinct=True, lo=0),
    models=Dict[str, Model], cls_runs=Optional[Dict[str, ClsRun]], gen_runs=Optional[Dict[str, GenRun]],
    cls_shape=Optional[Dict[str, Any]], gen_shape=Optional[Dict[str, Any]],
    cls_recipes=Optional[Dict[str, ClsRecipe]], cls_recipe_overrides=Optional[ClsRecipeOverrides],
)  # fmt: skip


def _at(source: Source, *path: Any) -> str:
    return source(tuple(path)) if callable(source) else source


def _close(key: Any, valid) -> str:
    """`` (did you mean X?)`` for the valid name nearest ``key``, or nothing where none is near."""
    close = difflib.get_close_matches(str(key), sorted(map(str, valid)), n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def _refuse(source: Source, where: str, key: str, says: str) -> None:
    raise ParamsError(f"{_at(source, *where.split('.'), key)}: {where}.{key} {says}; {FIX}.")


def _unknown_key(source: Source, where: str, key: str, consumer: str, valid) -> ParamsError:
    valid = sorted(valid)
    return ParamsError(
        f"{_at(source, *where.split('.'), key)}: {where}.{key} is not an argument of {consumer}{_close(key, valid)}, "
        f"which takes {', '.join(valid) if valid else 'none'}; {FIX}."
    )


def _fields(model) -> str:
    """What an entry holds: its required fields, then the optional ones in parentheses."""
    required = [k for k, f in model.model_fields.items() if f.is_required()]
    optional = ", ".join(k for k, f in model.model_fields.items() if not f.is_required())
    return ", ".join(required) + (f" (and {optional})" if required and optional else optional)


def _walk(loc: Tuple[Any, ...]):
    """(the field of the key at ``loc``, the type a value there has): a mapping's entry names are skipped."""
    held, field, i = Params, None, 0
    while i < len(loc):
        if not (isinstance(held, type) and issubclass(held, BaseModel)) or loc[i] not in held.model_fields:
            return field, None
        field, i = held.model_fields[loc[i]], i + 1
        held = field.annotation
        held = (
            next((a for a in typing.get_args(held) if a is not type(None)), held)
            if typing.get_origin(held) is Union
            else held
        )
        if typing.get_origin(held) is dict and i < len(loc):
            held, i = typing.get_args(held)[1], i + 1  # an entry of a named mapping
    return field, held


def _sentence(err: Dict[str, Any], errors, source: Source) -> str:
    """pydantic's ``err`` as the one sentence a refusal says (``errors``: its siblings, listed together)."""
    loc, kind, value = err["loc"], err["type"], err.get("input")
    key, at = ".".join(map(str, loc)), _at(source, *loc)
    parent, leaf = loc[:-1], str(loc[-1]) if loc else ""
    where, holder = ".".join(map(str, parent)), _walk(parent)[1] if parent else Params
    siblings = [str(e["loc"][-1]) for e in errors if e["type"] == kind and e["loc"][:-1] == parent]
    if kind == "extra_forbidden":  # unknown keys named in order, the first of them blamed and matched
        siblings = sorted(siblings)
        leaf, at = siblings[0], _at(source, *parent, siblings[0])
        key = ".".join(map(str, (*parent, leaf)))
        if not parent:
            return f"{at}: {leaf} is not a known section{_close(leaf, Params.model_fields)}; {FIX}."
        if loc[0] == "models" and len(loc) == 3:
            moved = " (the attention's knobs now live under options:)"
            hint = moved if "vca" in siblings else _close(leaf, Model.model_fields)
            holds = f"a model entry holds only {', '.join(Model.model_fields)}"
            return f"{at}: {where} has {', '.join(siblings)}{hint}; {holds}; {FIX}."
        if loc[0] in ("cls_runs", "gen_runs") and len(loc) == 3:
            hint = _close(leaf, holder.model_fields)
            return f"{at}: {key} is not a key of a {loc[0]} entry{hint}, which holds {_fields(holder)}; {FIX}."
        if loc[0] == "gen_runs" and len(loc) == 4:
            return f"{at}: {key} overrides nothing in gen_recipe{_close(leaf, GenRecipe.model_fields)}; {FIX}."
        if loc[0] == "calibrate" and len(loc) == 4:
            hint = _close(siblings[0], holder.model_fields)
            return f"{at}: {where} has unknown {', '.join(siblings)}{hint}; an entry holds {_fields(holder)}; {FIX}."
        if loc[0] in ("cls_recipes", "cls_recipe_overrides"):
            return f"{at}: {key} is not a known parameter{_close(leaf, ClsRecipe.model_fields)}; {FIX}."
        hint = _close(key, [f"{where}.{k}" for k in holder.model_fields])
        return f"{at}: {key} is not a known parameter{hint}; {FIX}."
    if kind == "missing":
        if loc[0] == "cls_recipes":
            return (
                f"{_at(source, *parent)}: {where} lacks {', '.join(siblings)}; every named recipe holds every knob "
                f"(conf/cls_recipe/{loc[1]}.yaml inherits them from its defaults); {FIX}."
            )
        if loc[0] == "calibrate":
            holds = f"an entry holds {_fields(holder)}"
            return f"{_at(source, *parent)}: {where} lacks {', '.join(siblings)}; {holds}; {FIX}."
        noun = "model" if loc[0] == "models" else loc[0]
        return f"{at}: {key} is missing; a {noun} entry holds {_fields(holder)}; {FIX}."
    field, held = _walk(loc)
    if kind == "value_error" and not (field and field.description):  # a check across an entry's fields
        return f"{at}: {key} {err['ctx']['error']}; {FIX}."
    if field is None or not field.description:  # a section or an entry that is not a mapping
        holds = f" holding {_fields(held)}" if isinstance(held, type) and issubclass(held, BaseModel) else ""
        return f"{at}: {key} must be a mapping{holds}, got {value!r}; {FIX}."
    return f"{at}: {key} must be {field.description}, got {value!r}; {FIX}."


def validate(params: Dict[str, Any], source: Source = "params.yaml", *, model_classes: bool = True) -> None:
    """Raise :class:`ParamsError` (one sentence) at the first value that breaks its rule.

    ``source`` names where the values came from: a string, or a function of the offending key's path (a tuple)
    that names the file in conf/ (or the override) that set it. ``model_classes=False`` leaves out what only the model
    classes can tell (a model's options, a shape override), which imports torch and timm: the torch-free check that
    ``dvc exp run -S`` makes before any stage runs (:mod:`vcarepro.params.dvc_compose`); the stages check it all.
    """
    calibrate = params.get("calibrate")
    named = {section: params.get(section) for section in ("models", "cls_runs", "gen_runs", "cls_recipes")}
    if isinstance(calibrate, dict):  # an entry's name names its work files
        named.update({f"calibrate.{group}": calibrate.get(group) for group in ("classifiers", "generators")})
    for where, entries in named.items():
        for name in entries if isinstance(entries, dict) else ():  # not a mapping: pydantic says so below
            _check_name(where, name, source)
    _check_finite(params, (), source)
    try:
        Params.model_validate(params, context={"source": source, "model_classes": model_classes})
    except ValidationError as err:
        errors = err.errors()
        for e in errors:  # a check across sections raised its own sentence
            if isinstance((e.get("ctx") or {}).get("error"), ParamsError):
                raise e["ctx"]["error"] from None
        rank = {"extra_forbidden": 0, "missing": 1}
        first = min(errors, key=lambda e: rank.get(e["type"], 2))
        raise ParamsError(_sentence(first, errors, source)) from None


def _check_finite(tree: Any, path: Tuple[Any, ...], source: Source) -> None:
    """NaN and infinities anywhere, free sections and lists too: no knob, whatever its rule, takes one."""
    if isinstance(tree, dict):
        for key, value in tree.items():
            _check_finite(value, (*path, key), source)
    elif isinstance(tree, (list, tuple)):
        for value in tree:
            _check_finite(value, path, source)
    elif isinstance(tree, float) and not math.isfinite(tree):
        key = ".".join(map(str, path))
        raise ParamsError(f"{_at(source, *path)}: {key} must be a finite number, got {tree!r}; {FIX}.")


def _check_name(where: str, name: Any, source: Source) -> None:
    if not safe_name(name):
        raise ParamsError(
            f"{_at(source, *where.split('.'), name)}: {where} has an entry named {name!r}; a name "
            f"is 1 to 100 letters, digits, '_' or '-' (starting with a letter or digit), since it "
            f"becomes a directory and a DVC stage name; rename it in conf/ and run `python -m vcarepro.params.config`."
        )


def _check_model(arch: Any, attention: Any, options: Any, where: str, source: Source) -> None:
    """A model's arch is known and takes its attention, and every key of its options is one it takes."""
    from vcarepro.models import CLASSIFIER_ARCHS, constructor_arguments
    from vcarepro.models.dit import DIT_CONFIGS

    try:
        consumer, _, takes = constructor_arguments(arch, attention)
    except KeyError:
        archs = [*CLASSIFIER_ARCHS, *DIT_CONFIGS]
        _refuse(source, where, "arch", f"must be one of {', '.join(archs)}, got {arch!r}{_close(arch, archs)}")
    except BadInput as err:  # an attention the arch does not come with
        raise ParamsError(
            f"{_at(source, *where.split('.'), 'attention')}: {where}: {str(err).rstrip('.')}; {FIX}."
        ) from None
    for key in options or {}:
        if key not in takes:
            raise _unknown_key(source, f"{where}.options", key, f"{consumer} with attention {attention!r}", takes)
