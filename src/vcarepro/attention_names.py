"""Names of the attention layers, importable without torch (the report and the params code use them).

The layers themselves are in :mod:`vcarepro.attention`.
"""

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
