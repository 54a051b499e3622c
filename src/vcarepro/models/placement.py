"""Where the compared attention enters a hierarchical backbone: one kind and one token count per stage.

The layout has one letter per stage, as the lab's ``MODEL.AGENT.ATTN_TYPE``: ``A`` puts
the compared attention (any layer of :mod:`vcarepro.attention`, ``compared_attention``,
"vca" by default) in every block, ``B`` keeps the backbone's own. The per-stage token
count (the lab's ``MODEL.AGENT.NUM``) goes to that layer's pooled-token option
(``contrast_tokens`` / ``agent_tokens``), one count or one per stage; a ``B`` stage or a
layer without pooled tokens ignores it.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Dict, List, Sequence, Tuple, Union

import torch
from timm.models import build_model_with_cfg
from timm.models._builder import _resolve_pretrained_source, resolve_pretrained_cfg

from vcarepro.attention import POOLED_TOKEN_OPTION, all_attention_options, attention_options
from vcarepro.core.errors import BadInput, UnknownArgument
from vcarepro.models.deit import VCA_OPTIONS

ContrastTokens = Union[int, Sequence[int], Sequence[Union[int, Sequence[int]]]]

COMPARED, OWN = "A", "B"

# The attentions a pipeline arch of a lab layout maps to its generic lab_* model (vca has its vca_* model, mhsa
# is the backbone's own attention). Any name of vcarepro.attention builds; timm's diff is left out of the
# pipeline as in the lab's layouts, which place the lab's own layers.
LAB_MODEL_ATTENTIONS = ("agent", "flatten", "inline", "circulant", "mhsa+dwc")
# The lab's pooled tokens per stage in PVT-T, Swin-T and CSWin-T (cfgs/agent_{pvt,swin,cswin}_t.yaml: NUM 9-16-49-49).
LAB_STAGE_TOKENS = (9, 16, 49, 49)

# VCA's options and the layout: the knobs create_classifier knows for a hierarchical VCA model.
HIERARCHICAL_VCA_OPTIONS = (*VCA_OPTIONS, "attn_layout")
# What places any compared attention (beside that attention's own options).
PLACEMENT_OPTIONS = ("attn_layout", "compared_attention")
# Everything a backbone with its own attention only (a baseline or control) refuses.
_COMPARED_ONLY = all_attention_options() | set(PLACEMENT_OPTIONS)


def attention_layout(layout: str, num_stages: int) -> List[bool]:
    """``"AAAB"`` -> [True, True, True, False]: whether each stage uses the compared attention."""
    if not isinstance(layout, str) or len(layout) != num_stages or set(layout) - {COMPARED, OWN}:
        raise BadInput(
            f"attn_layout={layout!r} must be {num_stages} letters, one per stage: {COMPARED} for the "
            f"compared attention, {OWN} for the backbone's own (e.g. {'A' * (num_stages - 1) + 'B'!r})."
        )
    return [letter == COMPARED for letter in layout]


def per_stage(
    value: ContrastTokens, num_stages: int, option: str = "contrast_tokens"
) -> List[Union[int, Tuple[int, int]]]:
    """One token setting for all stages (49, (7, 7)) or one per stage ((9, 16, 49, 49), ((3, 3), ...))."""
    if isinstance(value, int):
        return [value] * num_stages
    items = list(value)
    if len(items) == 2 and all(isinstance(v, int) for v in items) and num_stages != 2:
        return [tuple(items)] * num_stages  # an (h, w) grid shared by all stages
    if len(items) != num_stages:
        raise BadInput(f"{option} needs one value per stage ({num_stages}), got {value!r}.")
    return items


def stage_options(compared_attention: str, options: Dict[str, Any], num_stages: int) -> List[Dict[str, Any]]:
    """The compared attention's own knobs for each stage: its pooled-token count split per stage, the rest shared.

    A clear error for an unknown attention, an option it does not have, and ``contrast_tokens``
    given to an attention whose pooled tokens are named otherwise or that pools none.
    """
    own = attention_options(compared_attention)  # an unknown name fails here, listing the known ones
    pooled = POOLED_TOKEN_OPTION.get(compared_attention)
    if "contrast_tokens" in options and pooled != "contrast_tokens":
        instead = f"its per-stage count is {pooled}" if pooled else "it has no pooled tokens, so no per-stage count"
        raise BadInput(
            f"contrast_tokens does not apply to attention {compared_attention!r}: {instead}; remove contrast_tokens."
        )
    unknown = sorted(set(options) - set(own))
    if unknown:
        which = "is not an argument" if len(unknown) == 1 else "are not arguments"
        raise UnknownArgument(
            f"{', '.join(unknown)} {which} of the model nor of attention {compared_attention!r}"
            + (f" (its options: {', '.join(own)})." if own else " (it has no options).")
        )
    shared = {k: v for k, v in options.items() if k != pooled}
    if pooled in options:
        return [{**shared, pooled: tokens} for tokens in per_stage(options[pooled], num_stages, pooled)]
    return [dict(shared) for _ in range(num_stages)]


def lab_placement(
    attn_layout: str, compared_attention: str, stage_tokens: ContrastTokens = LAB_STAGE_TOKENS
) -> Dict[str, Any]:
    """A lab layout's keyword arguments: the layout, the attention, and its pooled tokens per stage if it pools."""
    placement: Dict[str, Any] = dict(attn_layout=attn_layout, compared_attention=compared_attention)
    if compared_attention in POOLED_TOKEN_OPTION:
        placement[POOLED_TOKEN_OPTION[compared_attention]] = stage_tokens
    return placement


VCA_PAPER = dict(
    paper_ids="arXiv:2511.00833",
    paper_name="Linear Differential Vision Transformer: Learning Visual Contrasts via Pairwise Differentials",
)


def hierarchical_cfg(**kwargs: Any) -> Dict[str, Any]:
    """The pretrained cfg fields every hierarchical model of this project carries (the VCA paper unless a backbone
    names its own); the license is the project's (code, and any weights it trains). No weights are published."""
    return {
        "url": "",
        "num_classes": 1000,
        "input_size": (3, 224, 224),
        "fixed_input_size": True,
        "license": "mit",
        **VCA_PAPER,
        "notes": (
            "no weights are published for this build; train them with this pipeline and load them with "
            "pretrained=True, pretrained_cfg_overlay=dict(file='model.safetensors')",
        ),
        **kwargs,
    }


def set_stage_grids(stage_attentions: Sequence[Sequence[Any]], grids: Sequence[Tuple[int, int]]) -> None:
    """Give every stage's attention layers their new grid, all or none: if one refuses (a contrast grid larger
    than its stage grid), the ones already changed go back and its BadInput is raised."""
    done = []
    try:
        for layers, grid in zip(stage_attentions, grids):
            for layer in layers:
                if hasattr(layer, "set_grid_size"):
                    old = layer.grid_size
                    layer.set_grid_size(grid)
                    done.append((layer, old))
    except BadInput:
        for layer, old in reversed(done):
            layer.set_grid_size(old)
        raise


def _check_weights_source(variant: str, kwargs: Dict[str, Any]) -> None:
    """pretrained=True loads only what the caller supplies (a file or a state_dict): a clear error otherwise."""
    cfg = resolve_pretrained_cfg(
        variant,
        pretrained_cfg=kwargs.get("pretrained_cfg"),
        pretrained_cfg_overlay=kwargs.get("pretrained_cfg_overlay"),
    )
    load_from, _ = _resolve_pretrained_source(cfg.to_dict())
    if not load_from:
        raise BadInput(
            f"no pretrained weights are published for {variant}; pass your own with "
            f"pretrained_cfg_overlay=dict(file='model.safetensors'), or create it with pretrained=False."
        )


def build_hierarchical(
    model_cls,
    variant: str,
    pretrained: bool,
    *,
    defaults: Dict[str, Any],
    kwargs: Dict[str, Any],
    layout: str = "",
    compared_attention: str = "",
):
    """Build a hierarchical variant over ``defaults``; ``pretrained=True`` loads the caller's own weights.

    With a ``layout`` it is a lab-layout model: ``compared_attention`` (from ``kwargs`` when not
    fixed by the variant, default VCA) fills the ``A`` stages with the lab's per-stage tokens.
    Without one it is a backbone with its own attention, which refuses every compared-attention knob.
    ``features_only=True`` returns the four stages' maps (NCHW, strides 4/8/16/32) through the
    model's ``forward_intermediates``, or those of ``out_indices``.
    """
    if pretrained:
        _check_weights_source(variant, kwargs)
    kwargs = dict(kwargs)
    # timm's factory kwargs device= / dtype= (create_model passes them to every model): build on that device, then
    # cast, so that no parameter or buffer of any layer (ours or timm's) is left elsewhere
    device, dtype = kwargs.pop("device", None), kwargs.pop("dtype", None)
    with torch.device(device) if device is not None else nullcontext():
        model = _build(model_cls, variant, pretrained, defaults, kwargs, layout, compared_attention)
    return model if dtype is None else model.to(dtype=dtype)


def _build(
    model_cls,
    variant: str,
    pretrained: bool,
    defaults: Dict[str, Any],
    kwargs: Dict[str, Any],
    layout: str,
    compared_attention: str,
):
    feature_cfg = dict(out_indices=kwargs.pop("out_indices", (0, 1, 2, 3)), feature_cls="getter")
    if not layout:
        stray = sorted(set(kwargs) & _COMPARED_ONLY)
        if stray:
            raise BadInput(
                f"{', '.join(stray)} only appl{'ies' if len(stray) == 1 else 'y'} to a VCA variant or "
                f"another compared attention (vca_* / lab_* models), not {variant}; remove "
                f"{'it' if len(stray) == 1 else 'them'}."
            )
        return build_model_with_cfg(
            model_cls, variant, pretrained=pretrained, feature_cfg=feature_cfg, **{**defaults, **kwargs}
        )
    chosen = kwargs.pop("compared_attention", compared_attention or "vca")
    if compared_attention and chosen != compared_attention:
        raise BadInput(
            f"{variant} holds {compared_attention!r}; for compared_attention={chosen!r} use the "
            f"lab_* model of the same backbone."
        )
    return build_model_with_cfg(
        model_cls,
        variant,
        pretrained=pretrained,
        feature_cfg=feature_cfg,
        **{**defaults, **lab_placement(layout, chosen), **kwargs},
    )
