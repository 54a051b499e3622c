"""Benchmarks: scripts that print figures, never timed tests.

``python -m vcarepro.tools.bench attention`` times the attention family (:mod:`.attention_cost`, also the
stage attention_cost); ``train-step`` one training step of a run (:mod:`.train_step`); ``all`` every
benchmark (:mod:`.run_all`, :mod:`.suite`). :mod:`.timing` holds what they share.
"""

from vcarepro.tools.bench.attention_cost import (
    BENCH_LAYERS,
    LINEAR_LAYERS,
    NOT_COMPILED,
    AttentionTiming,
    attention_table,
    bench_attention,
    build_bench_layer,
    family_speed_table,
    speed_targets,
    under_load,
)
from vcarepro.tools.bench.timing import describe_machine

__all__ = [
    "AttentionTiming",
    "BENCH_LAYERS",
    "LINEAR_LAYERS",
    "NOT_COMPILED",
    "attention_table",
    "bench_attention",
    "build_bench_layer",
    "describe_machine",
    "family_speed_table",
    "speed_targets",
    "under_load",
]
