"""What every parameter may hold, checked when a stage starts.

A bad value stops the stage before it writes anything, in one sentence naming the key and the fix. User-chosen
names get a safe alphabet (each becomes a directory and a DVC stage name); model options are checked against
the constructor; a run entry holds exactly :data:`RUN_FIELDS`.
"""

from __future__ import annotations

import difflib
import inspect
import math
import numbers
import re
import typing
from functools import lru_cache
from typing import Any, Callable, Dict, Optional, Tuple, Union

from vcarepro.core.choices import (
    ATTENTIONS,
    BENCH_LAYERS,
    FLOW_ODE_METHODS,
    FLOW_PATHS,
    FLOW_SAMPLERS,
    INPUT_PATHS,
    LABEL_MODES,
    OBJECTIVES,
)
from vcarepro.core.errors import BadInput

Rule = Tuple[str, Callable[[Any], bool]]
# Where a value came from: a name ("params.yaml"), or a function of the key's path that names the file in conf/
# (or the command-line override) that set it (vcarepro.params.config).
Source = Union[str, Callable[[Tuple[Any, ...]], str]]


def flatten(d: Any, prefix: str = "") -> Dict[str, Any]:
    """Nested params as dotted keys, the way `dvc params diff` names them (and :data:`RULES` keys them)."""
    if isinstance(d, dict):
        out: Dict[str, Any] = {}
        for k, v in d.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out  # an empty section (the paper's shape: no overrides) contributes no knob
    return {prefix.rstrip("."): d}


def _int(lo: int = 0) -> Rule:
    return (f"an integer >= {lo}", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= lo)


def _num(lo: float = 0.0, hi: Optional[float] = None, open_lo: bool = False, open_hi: bool = False) -> Rule:
    lo_txt = f"{'>' if open_lo else '>='} {lo:g}"
    hi_txt = "" if hi is None else f" and {'<' if open_hi else '<='} {hi:g}"

    def ok(v):
        if not isinstance(v, numbers.Real) or isinstance(v, bool) or not math.isfinite(v):
            return False
        return (v > lo if open_lo else v >= lo) and (hi is None or (v < hi if open_hi else v <= hi))

    return (f"a number {lo_txt}{hi_txt}", ok)


def _choice(*options: str) -> Rule:
    return (f"one of {', '.join(options)}", lambda v: v in options)


def _optional(rule: Rule) -> Rule:
    return (f"null or {rule[0]}", lambda v: v is None or rule[1](v))


def _int_or(*words: str, lo: int = 0) -> Rule:
    return (
        f"an integer >= {lo} or one of {', '.join(words)}",
        lambda v: (isinstance(v, int) and not isinstance(v, bool) and v >= lo) or v in words,
    )


_STR: Rule = ("a string", lambda v: isinstance(v, str) and v != "")
_BOOL: Rule = ("true or false", lambda v: isinstance(v, bool))
_PROB = _num(0.0, 1.0)
_DECAY = _num(0.0, 1.0, open_hi=True)
_POS = _num(0.0, open_lo=True)
# the layers attention_cost can measure (vcarepro.tools.bench.BENCH_LAYERS): the family and its two controls
_BENCH_LAYERS = BENCH_LAYERS

# Every knob of a classification recipe: each entry of cls_recipes holds all of them, cls_recipe_overrides any.
CLS_RECIPE_RULES: Dict[str, Rule] = {
    "img_size": _int(8),
    "epochs": _int(1),
    "cooldown_epochs": _int(0),
    "batch_size": _int(1),
    "accum_steps": _int(1),
    "opt": _STR,
    "lr": _POS,
    "weight_decay": _num(0.0),
    "sched": _STR,
    "lr_step": _choice("epoch", "update"),
    "warmup_epochs": _int(0),
    "warmup_lr": _num(0.0),
    "min_lr": _num(0.0),
    "scale_warmup_min_lr": _BOOL,
    "drop_path": _DECAY,
    "auto_augment": _optional(_STR),
    "color_jitter": _num(0.0),
    "train_interpolation": _choice("bicubic", "bilinear", "nearest", "random"),
    "interpolation": _choice("bicubic", "bilinear", "nearest"),
    "scale": (
        "a list [min, max] with 0 < min <= max <= 1",
        lambda v: isinstance(v, list) and len(v) == 2 and all(_POS[1](x) for x in v) and v[0] <= v[1] <= 1,
    ),
    "hflip": _PROB,
    "reprob": _PROB,
    "mixup": _num(0.0),
    "cutmix": _num(0.0),
    "mixup_switch_prob": _PROB,
    "smoothing": _DECAY,
    "repeated_aug": _BOOL,
    "ema_decay": _DECAY,
    "clip_grad": _optional(_num(0.0)),
    "precision": _choice("fp32", "tf32", "bf16", "fp16"),
    "compile": _optional(_STR),
    "crop_pct": _num(0.0, 1.0, open_lo=True),
    "crop_mode": _choice("center", "squash"),
    "workers": _int(0),
    "eval_every": _int(1),
    "train_augment": _BOOL,
    "cache_images": _BOOL,
    "input_path": _choice(*INPUT_PATHS),
}

RULES: Dict[str, Rule] = {
    "scale": _choice("embedded", "proxy", "paper", "smoke"),
    "smoke.seed": _int(0),
    "smoke.classes": _int(2),
    "smoke.train_per_class": _int(1),
    "smoke.val_per_class": _int(1),
    "smoke.reference_images": _int(2),
    "distributed.nnodes": _int_or("env", lo=1),
    "distributed.nproc_per_node": _int_or("gpu", lo=1),
    "distributed.node_rank": _int_or("env"),
    "distributed.rdzv_endpoint": _STR,
    "distributed.launcher": _choice("torchrun", "srun"),
    "distributed.rdzv_timeout": _int(1),  # whole seconds, as the launcher takes them
    "distributed.grace": _int(0),
    "distributed.seed_processes": _int(1),
    "cluster.partition": _optional(_STR),
    "cluster.account": _optional(_STR),
    "cluster.qos": _optional(_STR),
    "numerics.cpu": _choice("portable", "native"),
    "numerics.gpu": _choice("deterministic", "fast"),
    "numerics.threads": _int(1),
    "progress.interval_s": _num(0.0),  # 0: a line at every update (tests)
    "cluster.gpu": _BOOL,
    "cluster.nodes": _int(1),
    "cluster.gpus_per_node": _int(1),
    "cluster.cpus_per_task": _int(1),
    "cluster.mem_gb": _optional(_int(1)),
    "cluster.train_minutes": _int(1),
    "cluster.stage_minutes": _int(1),
    "cluster.signal_delay_s": _int(30),
    "cluster.max_requeues": _int(0),
    "cluster.poll_seconds": _POS,
    "cluster.local_stages": (
        "a list of stage names (report, or train_cls@<run>)",
        lambda v: isinstance(v, list) and all(isinstance(x, str) and x for x in v),
    ),
    "cluster.setup": ("a list of shell lines", lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v)),
    "cls_reference.max_train_images": _int(0),
    "cls_reference.c": _POS,
    "cls_reference.image_size": _optional(_int(1)),
    "complexity.cls_img_size": _int(1),
    "complexity.cls_num_classes": _int(1),
    "complexity.gen_latent_size": _int(1),
    "complexity.gen_latent_channels": _int(1),
    "complexity.gen_num_classes": _int(1),
    "complexity.throughput_batch": _int(0),
    "complexity.processes": _int(1),
    "prepare_cls.source": _choice("imagenet", "digits"),
    "prepare_cls.imagenet_root": _STR,
    "prepare_cls.subset_classes": (
        "null or a list of wnids",
        lambda v: v is None or (isinstance(v, list) and v and all(isinstance(w, str) for w in v)),
    ),
    "prepare_cls.subset_count": _optional(_int(1)),
    "prepare_cls.expect_full": _BOOL,
    "prepare_cls.max_bad_fraction": _PROB,
    "prepare_cls.workers": _int(0),
    "prepare_cls.drop_empty_classes": _BOOL,
    "prepare_cls.other_copy": _optional(
        (
            "a sentence: why archives without ImageNet's published MD5s are used",
            lambda v: isinstance(v, str) and v.strip() != "",
        )
    ),
    "prepare_cls.val_fraction": _num(0.0, 1.0, open_lo=True, open_hi=True),
    "prepare_cls.split_seed": _int(0),
    "prepare_gen.source": _choice("vae_latents", "pixels"),
    "prepare_gen.image_size": _int(8),
    "prepare_gen.vae": _STR,
    "prepare_gen.vae_batch_size": _int(1),
    "prepare_gen.shard_size": _int(1),
    "prepare_gen.fid_extractor": _choice("inception", "digits"),
    "prepare_gen.inception_weights": _STR,
    "prepare_gen.extractor_epochs": _int(0),
    "prepare_gen.seed": _int(0),
    "gen_recipe.steps": _int(1),
    "gen_recipe.batch_size": _int(1),
    "gen_recipe.lr": _POS,
    "gen_recipe.weight_decay": _num(0.0),
    "gen_recipe.ema_decay": _DECAY,
    "gen_recipe.hflip": _BOOL,
    "gen_recipe.log_every": _int(1),
    "gen_recipe.ckpt_every": _int(1),
    "gen_recipe.learn_sigma": _BOOL,
    "gen_recipe.class_dropout_prob": _DECAY,
    "gen_recipe.flow_path": _choice(*FLOW_PATHS),
    "gen_recipe.precision": _choice("fp32", "tf32", "bf16", "fp16"),
    "gen_recipe.compile": _optional(_STR),
    "sampling.num_samples": _int(1),
    "sampling.batch_size": _int(1),
    "sampling.ddpm_steps": _int(1),
    "sampling.labels": _choice(*LABEL_MODES),
    "sampling.vae_decoder": _STR,
    "sampling.flow_sampler": _choice(*FLOW_SAMPLERS),
    "sampling.flow_ode_method": _choice(*FLOW_ODE_METHODS),
    "sampling.flow_steps": _int(2),
    "sampling.cfg_scale": _num(0.0),
    "attention_cost.sides": (
        "a list of integers >= 1",
        lambda v: isinstance(v, list) and v and all(_int(1)[1](x) for x in v),
    ),
    "attention_cost.dim": _int(1),
    "attention_cost.heads": _int(1),
    "attention_cost.contrast_tokens": _int(1),
    "attention_cost.batch": _int(1),
    "attention_cost.min_run_time": _POS,
    "attention_cost.compile": _BOOL,
    "attention_cost.layers": (
        f"a non-empty list of distinct names from {', '.join(_BENCH_LAYERS)}",
        lambda v: isinstance(v, list) and v and len(set(v)) == len(v) and all(x in _BENCH_LAYERS for x in v),
    ),
    "fid_reference.adm_npz": _optional(_STR),
    "fid_reference.own_statistics": _BOOL,
    "fid_reference.keep_features": _int(2),
    "fid_reference.batch_size": _int(1),
    "fid_reference.workers": _int(0),
    "fid_reference.seed": _int(0),
    "eval_gen.isc_split_size": _int(1),
    "eval_gen.kid_subset_size": _int(2),
    "eval_gen.kid_subsets": _int(1),
    "eval_gen.feature_dims": _optional(_int(1)),
    "eval_gen.prc_k": _int(1),
    "eval_gen.prc_distance_dtype": _choice("float16", "float32", "float64"),
    "calibrate.checkpoints": (
        "a list of entry names",
        lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
    ),
    "calibrate.dir": _STR,
    "calibrate.trust_pickle": _BOOL,
    "calibrate.batch_size": _int(1),
    "calibrate.workers": _int(0),
    "calibrate.num_samples": _int(1),
    "calibrate.sample_batch_size": _int(1),
    "calibrate.steps": _optional(_int(1)),
    "calibrate.vae_decoder": _optional(_STR),
    "calibrate.seed": _int(0),
    "report.reproduce_tolerance_top1": _num(0.0),
    "report.reproduce_tolerance_fid": _num(0.0),
    "report.complexity_tolerance": _num(0.0),
    "family_seeds": (
        "a non-empty list of distinct integers >= 0",
        lambda v: isinstance(v, list) and v and len(set(map(str, v))) == len(v) and all(_int(0)[1](x) for x in v),
    ),
}
FREE_SECTIONS = ("models", "cls_runs", "gen_runs", "cls_shape", "gen_shape", "cls_recipes", "cls_recipe_overrides")
# calibrate.classifiers / calibrate.generators: named entries, each with these fields (vcarepro.calibration)
CALIBRATION_FIELDS = {
    "classifiers": {
        "required": ("layout", "arch", "attention", "recipe", "top1", "tolerance", "file", "source", "where"),
        "optional": ("options", "sha256"),
    },
    "generators": {
        "required": (
            "layout",
            "arch",
            "objective",
            "learn_sigma",
            "image_size",
            "cfg_scale",
            "steps",
            "fid",
            "tolerance",
            "file",
            "source",
            "where",
        ),
        "optional": ("sampler", "sha256"),
    },
}
FULL_DIGEST = 64  # hex digits of a sha256
SHORTEST_PREFIX = 8  # torch hub's file names end in the digest's first 8


def is_digest(value: Any) -> bool:
    """A calibration entry's ``sha256``: the whole digest or its publisher's prefix, lowercase hex. The rule both
    the params check and :func:`vcarepro.calibration.check_digest` (for its direct callers) apply."""
    return (
        isinstance(value, str)
        and SHORTEST_PREFIX <= len(value) <= FULL_DIGEST
        and all(c in "0123456789abcdef" for c in value)
    )


_HEX = (f"a hexadecimal sha256 ({FULL_DIGEST} digits) or its publisher's prefix ({SHORTEST_PREFIX} or more)", is_digest)
CALIBRATION_RULES = {
    "layout": _STR,
    "arch": _STR,
    "attention": _STR,
    "recipe": _STR,
    "file": _STR,
    "source": _STR,
    "where": _STR,
    "top1": _num(0.0, 100.0),
    "fid": _num(0.0),
    "tolerance": _num(0.0, open_lo=True),
    "cfg_scale": _num(0.0),
    "steps": _int(1),
    "learn_sigma": _BOOL,
    "objective": _choice(*OBJECTIVES),
    "sampler": _choice(*FLOW_SAMPLERS),
    "image_size": ("a multiple of 8 (the SD VAE's downsampling)", lambda v: _int(8)[1](v) and v % 8 == 0),
    "options": ("a mapping", lambda v: isinstance(v, dict)),
    "sha256": _optional(_HEX),
}
# The fix every refusal ends with. Where `dvc exp run -S` composed the values, vcarepro.params.dvc_compose swaps it
# for DVC_FIX, so that the hint never tells the user to do what they just did.
FIX = "fix it in conf/ and run `python -m vcarepro.params.config`, or correct the -S override that set it"
DVC_FIX = "correct the -S override (or the conf/ file named) and run `dvc exp run` again"


# What a `models` entry holds: the architecture, the attention by name, and that attention's own knobs.
MODEL_KEYS = {"arch", "attention", "options"}


class ParamsError(BadInput):
    pass


# What a run entry holds (vcarepro.params.runs.cls_run / gen_run; a gen run's recipe: overrides of gen_recipe).
RUN_FIELDS = {
    "cls_runs": {"required": ("model", "recipe", "seeds"), "optional": ()},
    "gen_runs": {"required": ("model", "objective", "seeds"), "optional": ("recipe",)},
}


def _at(source: Source, *path: Any) -> str:
    return source(tuple(path)) if callable(source) else source


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


def _close(key: Any, valid) -> str:
    """`` (did you mean X?)`` for the valid name nearest ``key``, or nothing where none is near."""
    close = difflib.get_close_matches(str(key), sorted(map(str, valid)), n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def _fields(fields: Dict[str, Tuple[str, ...]]) -> str:
    return ", ".join(fields["required"]) + (f" (and {', '.join(fields['optional'])})" if fields["optional"] else "")


# Names joined into paths (runs/<branch>/<run>, checkpoints/...) and DVC stage names: a safe alphabet.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,99}")  # no ".": dvc.yaml reads cls_runs.${key} as a dotted path
NAMED_SECTIONS = ("models", "cls_runs", "gen_runs", "cls_recipes")


def safe_name(name: Any) -> bool:
    """Whether ``name`` may become one path component (and a DVC stage name): :data:`NAME`."""
    return isinstance(name, str) and NAME.fullmatch(name) is not None


def _check_name(where: str, name: Any, source: Source) -> None:
    if not safe_name(name):
        raise ParamsError(
            f"{_at(source, *where.split('.'), name)}: {where} has an entry named {name!r}; a name "
            f"is 1 to 100 letters, digits, '_' or '-' (starting with a letter or digit), since it "
            f"becomes a directory and a DVC stage name; rename it in conf/ and run `python -m vcarepro.params.config`."
        )


def _unknown_key(source: Source, where: str, key: str, consumer: str, valid) -> ParamsError:
    valid = sorted(valid)
    hint = _close(key, valid)
    return ParamsError(
        f"{_at(source, *where.split('.'), key)}: {where}.{key} is not an argument of {consumer}{hint}, "
        f"which takes {', '.join(valid) if valid else 'none'}; {FIX}."
    )


# What the pipeline itself passes to a model's constructor (ClassifierSpec.create, GeneratorSpec.create): never
# a shape override nor an option.
_SET_FOR_CLASSIFIER = {"self", "num_classes", "drop_path_rate", "attention", "compared_attention", "pretrained"}
_SET_FOR_DIT = {"self", "learn_sigma", "class_dropout_prob", "attention", "attention_options"}


def _init_arguments(cls) -> frozenset:
    """The keyword arguments ``cls(...)`` takes: its ``__init__``'s and, through ``**kwargs``, its bases'."""
    names = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        parameters = inspect.signature(init).parameters.values()
        names |= {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        if not any(p.kind == p.VAR_KEYWORD for p in parameters):
            break
    return frozenset(names)


@lru_cache(maxsize=None)
def model_arguments(arch: str, attention: str) -> Tuple[str, frozenset, frozenset]:
    """(what builds it, the shape overrides it takes, the options it takes) for a ``models`` entry.

    A classifier takes what its timm model's class takes (the model factory's return annotation,
    its ``__init__`` followed through ``**kwargs``) and its attention's own knobs; a DiT what
    ``DiT`` takes. ``contrast_tokens`` is a shape override for every model (``core.choices.model_options``).
    Raises ``KeyError`` for an unknown arch, ``BadInput`` for an attention the arch does not come with.
    """
    from timm.models._registry import model_entrypoint

    from vcarepro.attention import attention_options
    from vcarepro.models import CLASSIFIER_ARCHS, LAB_MODELS, classifier_name
    from vcarepro.models.dit import DIT_ATTENTIONS, DIT_CONFIGS, DiT

    if arch in DIT_CONFIGS:
        if attention not in DIT_ATTENTIONS:
            raise BadInput(
                f"unknown attention {attention!r} for {arch}; choose one of {', '.join(map(repr, DIT_ATTENTIONS))}."
            )
        own = set(attention_options(attention))
        shape = (_init_arguments(DiT) | own | {"contrast_tokens"}) - _SET_FOR_DIT
        return "DiT", frozenset(shape), frozenset(own)
    if arch not in CLASSIFIER_ARCHS:
        raise KeyError(arch)
    name = classifier_name(arch, attention)
    own = set(attention_options(attention))
    cls = typing.get_type_hints(model_entrypoint(name))["return"]
    takes = _init_arguments(cls)
    placement = {"attn_layout"} & takes if attention == "vca" or name in LAB_MODELS else set()
    options = own | placement
    shape = (takes | options | {"contrast_tokens"}) - _SET_FOR_CLASSIFIER
    return f"{cls.__name__} ({name})", frozenset(shape), frozenset(options)


def validate(params: Dict[str, Any], source: Source = "params.yaml", *, model_classes: bool = True) -> None:
    """Raise :class:`ParamsError` (one sentence) at the first value that breaks its rule.

    ``source`` names where the values came from: a string, or a function of the offending key's path (a tuple)
    that names the file in conf/ (or the override) that set it. ``model_classes=False`` leaves out what only the model
    classes can tell (a model's options, a shape override), which imports torch and timm: the torch-free check that
    ``dvc exp run -S`` makes before any stage runs (:mod:`vcarepro.params.dvc_compose`); the stages check it all.
    """
    for section in NAMED_SECTIONS:
        for name in params.get(section) or {}:
            _check_name(section, name, source)
    _check_finite(params, (), source)
    calibrate = dict(params.get("calibrate") or {})
    entries = {group: calibrate.pop(group, None) or {} for group in CALIBRATION_FIELDS}
    rest = {k: v for k, v in params.items() if k not in FREE_SECTIONS}
    if "calibrate" in rest:
        rest["calibrate"] = calibrate
    for group, named in entries.items():
        fields = CALIBRATION_FIELDS[group]
        for name, entry in named.items():
            _check_name(f"calibrate.{group}", name, source)  # it names the entry's work files
            at = ("calibrate", group, name)
            entry = entry if isinstance(entry, dict) else {}
            missing = [f for f in fields["required"] if f not in entry]
            extra = sorted(set(entry) - set(fields["required"]) - set(fields["optional"]))
            if missing or extra:
                raise ParamsError(
                    f"{_at(source, *at, *extra[:1])}: calibrate.{group}.{name} "
                    + (
                        f"lacks {', '.join(missing)}"
                        if missing
                        else f"has unknown {', '.join(extra)}"
                        + _close(extra[0], [*fields["required"], *fields["optional"]])
                    )
                    + f"; an entry holds {', '.join(fields['required'])} (and "
                    f"{', '.join(fields['optional'])}); {FIX}."
                )
            for field, value in entry.items():
                rule = CALIBRATION_RULES[field]
                if not rule[1](value):
                    raise ParamsError(
                        f"{_at(source, *at, field)}: calibrate.{group}.{name}.{field} must be "
                        f"{rule[0]}, got {value!r}; {FIX}."
                    )
            if group == "classifiers" and model_classes:
                _check_model(entry, f"calibrate.classifiers.{name}", source)
            if group == "classifiers" and entry["recipe"] not in (params.get("cls_recipes") or {}):
                raise ParamsError(
                    f"{_at(source, *at, 'recipe')}: calibrate.classifiers.{name}.recipe must name an "
                    f"entry of cls_recipes, got {entry['recipe']!r}; {FIX}."
                )
            if group == "generators" and entry["objective"] == "flow" and "sampler" not in entry:
                raise ParamsError(
                    f"{_at(source, *at)}: calibrate.generators.{name} is a flow model and needs a "
                    f"sampler (sde or ode); {FIX}."
                )
    sections = {key.split(".")[0] for key in RULES} | set(FREE_SECTIONS)
    for key, value in flatten(rest).items():
        rule = RULES.get(key)
        if rule is None:
            head = key.split(".")[0]
            if head not in sections:
                raise ParamsError(f"{_at(source, head)}: {head} is not a known section{_close(head, sections)}; {FIX}.")
            raise ParamsError(
                f"{_at(source, *key.split('.'))}: {key} is not a known parameter"
                f"{_close(key, [k for k in RULES if k.startswith(head + '.')])}; {FIX}."
            )
        if not rule[1](value):
            raise ParamsError(f"{_at(source, *key.split('.'))}: {key} must be {rule[0]}, got {value!r}; {FIX}.")
    recipes = params.get("cls_recipes") or {}
    for name, recipe in recipes.items():
        _check_recipe(recipe or {}, f"cls_recipes.{name}", source)  # a misspelt knob first: it names the missing one
        missing = [knob for knob in CLS_RECIPE_RULES if knob not in (recipe or {})]
        if missing:
            raise ParamsError(
                f"{_at(source, 'cls_recipes', name)}: cls_recipes.{name} lacks {', '.join(missing)}; "
                f"every named recipe holds every knob (conf/cls_recipe/{name}.yaml inherits them from "
                f"its defaults); {FIX}."
            )
    # null in the overrides: not overridden (each run keeps its recipe's value)
    _check_recipe(params.get("cls_recipe_overrides") or {}, "cls_recipe_overrides", source, null_keeps=True)
    models = params.get("models", {})
    for name, spec in models.items():
        extra = sorted(set(spec or {}) - MODEL_KEYS) if isinstance(spec, dict) else ["(not a mapping)"]
        if extra:
            hint = (
                " (the attention's knobs now live under options:)" if "vca" in extra else _close(extra[0], MODEL_KEYS)
            )
            raise ParamsError(
                f"{_at(source, 'models', name, extra[0])}: models.{name} has {', '.join(extra)}{hint}; "
                f"a model entry holds only {', '.join(sorted(MODEL_KEYS))}; {FIX}."
            )
        if spec.get("attention") not in ATTENTIONS:
            raise ParamsError(
                f"{_at(source, 'models', name, 'attention')}: models.{name}.attention must be one of "
                f"{', '.join(ATTENTIONS)}, got {spec.get('attention')!r}; {FIX}."
            )
        if model_classes:
            _check_model(spec, f"models.{name}", source)
    for branch in RUN_FIELDS:
        for name, run in (params.get(branch) or {}).items():
            _check_run_keys(branch, name, run, source)
            if run["model"] not in models:
                raise ParamsError(
                    f"{_at(source, branch, name, 'model')}: {branch}.{name}.model must name an entry "
                    f"of models ({', '.join(models)}), got {run['model']!r}{_close(run['model'], models)}"
                    f"; {FIX}."
                )
            seeds = run["seeds"]
            if not (
                isinstance(seeds, list)
                and seeds
                and all(_int(0)[1](s) for s in seeds)
                and len(set(seeds)) == len(seeds)
            ):
                raise ParamsError(
                    f"{_at(source, branch, name, 'seeds')}: {branch}.{name}.seeds must be a non-empty "
                    f"list of distinct integers >= 0, got {seeds!r}; {FIX}."
                )
            shape = params.get(f"{branch[:3]}_shape") or {}
            if shape and model_classes:
                consumer, takes, _ = model_arguments(models[run["model"]]["arch"], models[run["model"]]["attention"])
                for key in shape:
                    if key not in takes:
                        raise _unknown_key(
                            source, f"{branch[:3]}_shape", key, f"{consumer}, the model of {branch}.{name}", takes
                        )
            if branch == "cls_runs" and run["recipe"] not in recipes:
                raise ParamsError(
                    f"{_at(source, branch, name, 'recipe')}: cls_runs.{name}.recipe must name an entry "
                    f"of cls_recipes ({', '.join(recipes)}), got {run['recipe']!r}"
                    f"{_close(run['recipe'], recipes)}; {FIX}."
                )
            if branch == "gen_runs":
                overrides = run.get("recipe") or {}
                if not isinstance(overrides, dict):
                    raise ParamsError(
                        f"{_at(source, branch, name, 'recipe')}: gen_runs.{name}.recipe must be a "
                        f"mapping of gen_recipe knobs, got {overrides!r}; {FIX}."
                    )
                for key, value in overrides.items():  # per-run overrides of gen_recipe
                    rule = RULES.get(f"gen_recipe.{key}")
                    if rule is None:
                        raise ParamsError(
                            f"{_at(source, branch, name, 'recipe', key)}: gen_runs.{name}.recipe.{key} "
                            f"overrides nothing in gen_recipe"
                            f"{_close(key, [k[11:] for k in RULES if k.startswith('gen_recipe.')])}; "
                            f"{FIX}."
                        )
                    if not rule[1](value):
                        raise ParamsError(
                            f"{_at(source, branch, name, 'recipe', key)}: gen_runs.{name}.recipe.{key} "
                            f"must be {rule[0]}, got {value!r}; {FIX}."
                        )
            if branch == "gen_runs" and run["objective"] not in OBJECTIVES:
                raise ParamsError(
                    f"{_at(source, branch, name, 'objective')}: gen_runs.{name}.objective must be "
                    f"{' or '.join(OBJECTIVES)}, got {run['objective']!r}; {FIX}."
                )


def _check_run_keys(branch: str, name: str, run: Any, source: Source) -> None:
    """A run entry holds exactly its branch's fields: a misspelt one is named with the field it is nearest to."""
    fields = RUN_FIELDS[branch]
    if not isinstance(run, dict):
        raise ParamsError(
            f"{_at(source, branch, name)}: {branch}.{name} must be a mapping holding "
            f"{_fields(fields)}, got {run!r}; {FIX}."
        )
    valid = (*fields["required"], *fields["optional"])
    for key in run:
        if key not in valid:
            raise ParamsError(
                f"{_at(source, branch, name, key)}: {branch}.{name}.{key} is not a key of a {branch} "
                f"entry{_close(key, valid)}, which holds {_fields(fields)}; {FIX}."
            )
    for key in fields["required"]:
        if key not in run:
            raise ParamsError(
                f"{_at(source, branch, name, key)}: {branch}.{name}.{key} is missing; a {branch} entry "
                f"holds {_fields(fields)}; {FIX}."
            )


def _check_model(spec: Dict[str, Any], where: str, source: Source) -> None:
    """A model's arch is known and takes its attention, and every key of its options is one it takes."""
    from vcarepro.models import CLASSIFIER_ARCHS
    from vcarepro.models.dit import DIT_CONFIGS

    arch, attention = spec.get("arch"), spec.get("attention")
    try:
        consumer, _, takes = model_arguments(arch, attention)
    except KeyError:
        archs = [*CLASSIFIER_ARCHS, *DIT_CONFIGS]
        raise ParamsError(
            f"{_at(source, *where.split('.'), 'arch')}: {where}.arch must be one of {', '.join(archs)}, "
            f"got {arch!r}{_close(arch, archs)}; {FIX}."
        ) from None
    except BadInput as err:  # an attention the arch does not come with
        raise ParamsError(
            f"{_at(source, *where.split('.'), 'attention')}: {where}: {str(err).rstrip('.')}; {FIX}."
        ) from None
    options = spec.get("options") or {}
    if not isinstance(options, dict):
        raise ParamsError(
            f"{_at(source, *where.split('.'), 'options')}: {where}.options must be a mapping of the "
            f"attention's knobs, got {options!r}; {FIX}."
        )
    for key in options:
        if key not in takes:
            raise _unknown_key(source, f"{where}.options", key, f"{consumer} with attention {attention!r}", takes)


def _check_recipe(recipe: Dict[str, Any], where: str, source: Source, null_keeps: bool = False) -> None:
    for knob, value in recipe.items():
        rule = CLS_RECIPE_RULES.get(knob)
        if rule is None:
            raise ParamsError(
                f"{_at(source, *where.split('.'), knob)}: {where}.{knob} is not a known parameter"
                f"{_close(knob, CLS_RECIPE_RULES)}; {FIX}."
            )
        if value is None and null_keeps:
            continue
        if not rule[1](value):
            raise ParamsError(
                f"{_at(source, *where.split('.'), knob)}: {where}.{knob} must be {rule[0]}, got {value!r}; {FIX}."
            )
