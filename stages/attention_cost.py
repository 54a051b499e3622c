"""DVC stage `attention_cost`: one attention layer's MACs and wall time against token count, every layer of the family.

The evidence for the complexity claim (O(N n C) for VCA, O(N^2 C) for MHSA) and the speed targets; docs/pipeline.md
says what it measures. The MACs are the output (metrics/attention_macs.json); the times go to
timings/attention_cost.json, never a DVC output, since a wall time's hash could never reproduce. The targets
are benchmarks, not verdicts: `vcarepro bench attention` prints them, as a time on a shared machine can
contradict the linearity it tests.
"""

from __future__ import annotations

import time
from dataclasses import asdict

from vcarepro.core.io import write_json
from vcarepro.core.stage import run_stage
from vcarepro.params.config import stage_params
from vcarepro.tools.bench import bench_attention, describe_machine, speed_targets, under_load

TIMING = "timings/attention_cost.json"


def main() -> None:
    p = stage_params()["attention_cost"]
    started = time.monotonic()
    rows = bench_attention(
        p["sides"],
        dim=p["dim"],
        heads=p["heads"],
        batch=p["batch"],
        contrast_tokens=p["contrast_tokens"],
        layers=p["layers"],
        compile=p["compile"],
        min_run_time=p["min_run_time"],
    )
    targets = speed_targets(rows)
    # the times go to timings/ (no DVC output: they differ on every run), the exact MACs to the stage's output
    write_json(
        TIMING, {"machine": describe_machine(), "config": p, "rows": [asdict(r) for r in rows], "targets": targets}
    )
    write_json(
        "metrics/attention_macs.json",
        {"config": p, "rows": [{"layer": r.layer, "tokens": r.tokens, "macs": r.macs} for r in rows]},
    )
    layers = sorted({r.layer for r in rows})
    tokens = sorted({r.tokens for r in rows})
    loaded = sum(map(under_load, rows))
    print(
        f"attention_cost: {len(layers)} layers x {len(tokens)} token counts timed in "
        f"{time.monotonic() - started:.0f} s"
        + (f" ({loaded} of {len(rows)} measured under load: their targets are not judged)" if loaded else "")
        + "; MACs in metrics/attention_macs.json, times and speed targets in "
        f"{TIMING} (`vcarepro bench attention` prints the table)",
        flush=True,
    )


if __name__ == "__main__":
    run_stage(main)
