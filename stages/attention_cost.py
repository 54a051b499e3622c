"""DVC stage `attention_cost`: one attention layer's MACs and wall time against token count, MHSA vs VCA.

The evidence for the paper's complexity claim, O(N n C) for VCA against O(N^2 C) for
MHSA, at DeiT-T width (192, 3 heads, 49 contrast tokens) for N = 196, 784, 3136.
MACs are exact; times are medians on the machine that ran the stage (named in the file).
"""
from __future__ import annotations

from dataclasses import asdict

from vcarepro.errors import run_stage
from vcarepro.bench import bench_attention, describe_machine
from vcarepro.config import stage_params
from vcarepro.io import write_json


def main() -> None:
    p = stage_params()["attention_cost"]
    rows = bench_attention(p["sides"], dim=p["dim"], heads=p["heads"], batch=p["batch"],
                           contrast_tokens=p["contrast_tokens"], min_run_time=p["min_run_time"])
    write_json("metrics/attention_cost.json", {"machine": describe_machine(), "config": p,
                                               "rows": [asdict(r) for r in rows]})
    for r in rows:
        print(f"attention_cost: N={r.tokens} {r.layer}: {r.macs / 1e9:.3f} GMACs, "
              f"{r.forward_ms:.2f} ms forward, {r.forward_backward_ms:.2f} ms forward+backward")


if __name__ == "__main__":
    run_stage(main)
