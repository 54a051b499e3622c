"""Names of the attention layers, the training input paths and the choices of generation, importable without torch
(the report and the params code use them; every check of a choice reads its list here).

The layers themselves are in :mod:`vcarepro.attention`; :func:`model_options` says what a run's
attention is built with, for the model factories and for the report that describes them.
"""

from typing import Any, Dict

ATTENTIONS = ("mhsa", "diff", "vca", "agent", "flatten", "inline", "circulant", "mhsa+dwc")
# The published family members, in the order the report lists them.
FAMILY = ("agent", "flatten", "inline", "circulant", "diff")
# The controls that isolate VCA's depthwise local term: MHSA plus it, and VCA without it
# (attention "vca" with local_conv false).
CONTROLS = ("mhsa+dwc", "vca-dwc")

# The layers the attention_cost stage and the bench can time: every attention and VCA without its local term.
BENCH_LAYERS = (*ATTENTIONS, *(c for c in CONTROLS if c not in ATTENTIONS))

# The option that sets how many pooled tokens a layer uses, for the layers that pool: a scale's
# shape override ``contrast_tokens`` (e.g. 4 on the embedded 4x4 grid) sets it for any of them.
POOLED_TOKEN_OPTION = {"vca": "contrast_tokens", "agent": "agent_tokens"}

# The training input paths (a classification recipe's input_path): timm's PIL transform in the loader workers, or
# the fast path (vcarepro.data.fast): workers decode and crop, the device does the per-pixel augmentation.
INPUT_PATHS = ("pil", "fast")


# The choices of generation, for the schema and for the code that acts on them (train/generation.py,
# train/flow.py, vcarepro.metrics.protocol): a run's objective (DiT's DDPM, SiT's flow matching), a flow
# model's path, its sampler and ODE solver, and how the sampled class labels are drawn (uniform
# draws, as DiT's and SiT's sample_ddp.py; or a balanced cycle).
OBJECTIVES = ("ddpm", "flow")
FLOW_PATHS = ("linear", "gvp")
FLOW_SAMPLERS = ("sde", "ode")
FLOW_ODE_METHODS = ("dopri5", "euler", "heun")
LABEL_MODES = ("random", "balanced")


def model_options(attention: str, options: Dict[str, Any], shape: Dict[str, Any]):
    """(shape overrides without contrast_tokens, the attention options the run uses).

    A scale's ``contrast_tokens`` shape override replaces the model's paper-shape count of
    pooled tokens, for the attentions that pool (VCA's contrast tokens, Agent's agent tokens).
    """
    shape = dict(shape or {})
    pooled_tokens = shape.pop("contrast_tokens", None)
    options = dict(options or {})
    if pooled_tokens is not None and attention in POOLED_TOKEN_OPTION:
        options[POOLED_TOKEN_OPTION[attention]] = pooled_tokens
    return shape, options
