"""What a value of params.yaml may be, in the words a refusal says it in, and the two training recipes as models.

The schema (:mod:`vcarepro.params.schema`) builds every section from these types; the training code reads a recipe
as attributes (``recipe.lr``). A recipe the stages read is built with ``model_construct`` from values the schema
already checked, so each keeps the type YAML gave it: an ``int`` written into a run's provenance stays an ``int``,
which ``model_validate`` would turn into a float and so move every hashed output.
"""

import math
from typing import Annotated, Any, Callable, Literal, Optional, Tuple

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, create_model

from vcarepro.core.choices import FLOW_PATHS, INPUT_PATHS


def _says(t) -> str:
    return next(m.description for m in t.__metadata__ if getattr(m, "description", None))


def Int(lo: int = 0):
    return Annotated[int, Field(ge=lo, description=f"an integer >= {lo}")]


def Num(lo: float = 0.0, hi: Optional[float] = None, open_lo: bool = False, open_hi: bool = False):
    bounds = {"gt" if open_lo else "ge": lo, **({} if hi is None else {"lt" if open_hi else "le": hi})}
    words = f"a number {'>' if open_lo else '>='} {lo:g}" + (
        "" if hi is None else f" and {'<' if open_hi else '<='} {hi:g}"
    )
    return Annotated[float, Field(**bounds, description=words)]


def One(*options: str, words: str = ""):
    return Annotated[Literal[options], Field(description=words or f"one of {', '.join(options)}")]


def Opt(t):
    return Annotated[Optional[t], Field(description=f"null or {_says(t)}")]


def Rule(words: str, ok: Callable[[Any], bool]):
    """A value no type states (a list's shape, a word or a number): ``ok`` decides, ``words`` say it."""

    def check(value):
        if not ok(value):
            raise ValueError(words)
        return value

    return Annotated[Any, AfterValidator(check), Field(description=words)]


def is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def is_int(v, lo=0) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= lo


Str = Annotated[str, Field(min_length=1, description="a string")]
Bool = Annotated[bool, Field(description="true or false")]
Prob, Decay, Pos = Num(0.0, 1.0), Num(0.0, 1.0, open_hi=True), Num(0.0, open_lo=True)
Precision = One("fp32", "tf32", "bf16", "fp16")


class Section(BaseModel):
    """A mapping of params.yaml: every key typed, none unknown; an absent key keeps its stage's default."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


def section(name: str, base=Section, required: Tuple[str, ...] = (), **fields):
    """The model of one mapping: each field a type of this module; absent, a field is None unless ``required``."""
    return create_model(name, __base__=base, **{k: (t, ... if k in required else None) for k, t in fields.items()})


def entry(name: str, base=Section, optional: Tuple[str, ...] = (), **fields):
    """The model of a named entry (a run, a model, a released checkpoint): every field required but ``optional``."""
    return section(name, base, tuple(k for k in fields if k not in optional), **fields)


class ClsRecipe(Section):
    """A classification recipe: each entry of cls_recipes holds every knob, cls_recipe_overrides any of them."""

    img_size: Int(8)
    epochs: Int(1)
    cooldown_epochs: Int(0)
    batch_size: Int(1)
    accum_steps: Int(1)
    opt: Str
    lr: Pos
    weight_decay: Num(0.0)
    sched: Str
    lr_step: One("epoch", "update")
    warmup_epochs: Int(0)
    warmup_lr: Num(0.0)
    min_lr: Num(0.0)
    scale_warmup_min_lr: Bool
    drop_path: Decay
    auto_augment: Opt(Str)
    color_jitter: Num(0.0)
    train_interpolation: One("bicubic", "bilinear", "nearest", "random")
    interpolation: One("bicubic", "bilinear", "nearest")
    scale: Rule(
        "a list [min, max] with 0 < min <= max <= 1",
        lambda v: isinstance(v, list) and len(v) == 2 and all(is_num(x) and x > 0 for x in v) and v[0] <= v[1] <= 1,
    )
    hflip: Prob
    reprob: Prob
    mixup: Num(0.0)
    cutmix: Num(0.0)
    mixup_switch_prob: Prob
    smoothing: Decay
    repeated_aug: Bool
    ema_decay: Decay
    clip_grad: Opt(Num(0.0))
    precision: Precision
    compile: Opt(Str)
    crop_pct: Num(0.0, 1.0, open_lo=True)
    crop_mode: One("center", "squash")
    workers: Int(0)
    train_augment: Bool
    input_path: One(*INPUT_PATHS)
    cache_images: Bool
    eval_every: Int(1)


def input_path(recipe: ClsRecipe) -> str:
    """The path that feeds a recipe's training images: its input_path where it augments; without augmentation the
    images take the evaluation transform, on the PIL path."""
    return recipe.input_path if recipe.train_augment else "pil"


def _or_null(field):
    t = Annotated[(field.annotation, *field.metadata)] if field.metadata else field.annotation
    return Annotated[Optional[t], Field(description=field.description)]


# null in the overrides: not overridden (each run keeps its recipe's value)
ClsRecipeOverrides = section("ClsRecipeOverrides", **{k: _or_null(f) for k, f in ClsRecipe.model_fields.items()})


class GenRecipe(Section):
    """The generation recipe (gen_recipe), and a run's overrides of it (gen_runs.<run>.recipe): any knob may be
    absent from the overrides."""

    steps: Int(1) = None
    batch_size: Int(1) = None
    lr: Pos = None
    weight_decay: Num(0.0) = None
    ema_decay: Decay = None
    hflip: Bool = None
    log_every: Int(1) = None
    ckpt_every: Int(1) = None
    learn_sigma: Bool = None
    class_dropout_prob: Decay = None
    flow_path: One(*FLOW_PATHS) = None
    precision: Precision = None
    compile: Opt(Str) = None
