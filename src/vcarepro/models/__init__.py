"""Model factories. Importing this module registers the VCA backbones with timm.

``create_classifier(arch, attention)`` is the one place that maps the pipeline's
(architecture, attention) pair to a timm model name: ("deit_tiny", "mhsa") is timm's
own ``deit_tiny_patch16_224``, "vca" / "diff" the ``vca_`` / ``diff_`` models, the rest
of the family ``dropin_deit_*`` (DeiT with only the attention swapped). For PVT, Swin
and CSWin "mhsa" names the backbone's own attention, "vca" the ``vca_`` model and the
rest of the family the ``lab_`` model (docs/vca.md and docs/family.md give the layouts);
``pvt_tiny_gap`` and ``cswin_tiny_2418`` are the controls. DiT/SiT have
``models.dit.create_dit``.
"""

from __future__ import annotations

import inspect
import typing
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Dict, Optional, Tuple

import timm
import torch.nn as nn

from vcarepro.attention import ATTENTIONS, all_attention_options, attention_options
from vcarepro.core.choices import model_options
from vcarepro.core.errors import BadInput
from vcarepro.models import cswin, deit, family, pvt, swin  # noqa: F401  (each registers its timm models)
from vcarepro.models.deit import VcaVisionTransformer
from vcarepro.models.placement import HIERARCHICAL_VCA_OPTIONS

FLOOR = 2

# arch -> {attention: timm model name}
CLASSIFIER_ARCHS = {
    "deit_tiny": {
        "mhsa": "deit_tiny_patch16_224",
        "vca": "vca_deit_tiny_patch16_224",
        "diff": "diff_deit_tiny_patch16_224",
    },
    "deit_small": {
        "mhsa": "deit_small_patch16_224",
        "vca": "vca_deit_small_patch16_224",
        "diff": "diff_deit_small_patch16_224",
    },
}
# DeiT with any other attention of the family: the drop-in models, told which by attention=.
DROPIN_MODELS = {"deit_tiny": "dropin_deit_tiny_patch16_224", "deit_small": "dropin_deit_small_patch16_224"}
for _arch, _dropin in DROPIN_MODELS.items():
    CLASSIFIER_ARCHS[_arch].update({a: _dropin for a in ATTENTIONS if a not in CLASSIFIER_ARCHS[_arch]})
for _module in (pvt, swin, cswin, family):
    CLASSIFIER_ARCHS.update(_module.MODEL_NAMES)
# The lab's hierarchical layouts with any attention, told which by compared_attention=.
LAB_MODELS = (pvt.LAB_MODEL, swin.LAB_MODEL, cswin.LAB_MODEL)
# Every attention's own knobs, and the placement knob of the hierarchical VCA models
_ALL_OPTIONS = all_attention_options() | set(HIERARCHICAL_VCA_OPTIONS)


@dataclass
class ModelSpec:
    """What to build: a model spec from params ``models`` plus the scale's shape overrides.

    train.classification.ClassifierSpec and train.generation.GeneratorSpec add how each is created.
    """

    arch: str
    attention: str
    options: Dict[str, Any]
    shape: Dict[str, Any]

    @classmethod
    def for_run(cls, run, shape: Optional[Dict[str, Any]] = None) -> "ModelSpec":
        """The spec of a pipeline run (``params.runs.ClsRun`` / ``GenRun``); ``shape`` replaces the scale's shape
        overrides."""
        return cls(
            run.model["arch"],
            run.model["attention"],
            run.model.get("options") or {},
            run.shape if shape is None else shape,
        )

    def resolved(self) -> Tuple[Dict[str, Any], Dict[str, Any]]:
        """The constructor's shape arguments and the attention's own options (``core.choices.model_options``)."""
        return model_options(self.attention, self.options, self.shape)


def classifier_name(arch: str, attention: str) -> str:
    """The timm model name for an (architecture, attention) pair."""
    if arch not in CLASSIFIER_ARCHS:
        raise BadInput(f"unknown model {arch!r}; choose one of {', '.join(map(repr, CLASSIFIER_ARCHS))}.")
    names = CLASSIFIER_ARCHS[arch]
    if attention not in names:
        raise BadInput(f"unknown attention {attention!r} for {arch}; choose one of {', '.join(map(repr, names))}.")
    return names[attention]


def create_classifier(arch: str, attention: str, **kwargs: Any) -> nn.Module:
    """Create a classifier; an attention's own knobs (``contrast_tokens``, ``agent_tokens``, ...) only with it."""
    name = classifier_name(arch, attention)
    own = set(attention_options(attention)) | ({"attn_layout"} if attention == "vca" or name in LAB_MODELS else set())
    stray = sorted((set(kwargs) & _ALL_OPTIONS) - own)
    if stray:
        raise BadInput(
            f"{', '.join(stray)} {'does' if len(stray) == 1 else 'do'} not apply to attention "
            f"{attention!r}; remove {'it' if len(stray) == 1 else 'them'}."
        )
    if name in DROPIN_MODELS.values():
        kwargs["attention"] = attention
    elif name in LAB_MODELS:
        kwargs["compared_attention"] = attention
    return timm.create_model(name, **kwargs)


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
def constructor_arguments(arch: str, attention: str) -> Tuple[str, frozenset, frozenset]:
    """(what builds it, the shape overrides it takes, the options it takes) for a ``models`` entry.

    A classifier takes what its timm model's class takes (the model factory's return annotation,
    its ``__init__`` followed through ``**kwargs``) and its attention's own knobs; a DiT what
    ``DiT`` takes. ``contrast_tokens`` is a shape override for every model (``core.choices.model_options``).
    Raises ``KeyError`` for an unknown arch, ``BadInput`` for an attention the arch does not come with.
    """
    from timm.models._registry import model_entrypoint

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


__all__ = [
    "CLASSIFIER_ARCHS",
    "DROPIN_MODELS",
    "LAB_MODELS",
    "VcaVisionTransformer",
    "classifier_name",
    "constructor_arguments",
    "create_classifier",
]
