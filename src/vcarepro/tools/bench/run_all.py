"""``python -m vcarepro.tools.bench``: every benchmark, printed as tables of ratios, and one JSON."""

from __future__ import annotations

from dataclasses import asdict
from typing import Dict

from vcarepro.core.io import write_json
from vcarepro.tools.bench.attention_cost import attention_table, bench_attention
from vcarepro.tools.bench.suite import (
    bench_attention_memory,
    bench_dvc_noop,
    bench_models,
    bench_train_loop,
)


def run_all(machine: Dict[str, object], *, quick: bool = False, json_path: str = "bench.json") -> Dict[str, object]:
    timing = 0.2 if quick else 1.0
    print("machine: " + ", ".join(f"{k}={v}" for k, v in machine.items()))
    out: Dict[str, object] = {"machine": machine, "quick": quick}

    sides = (14, 28) if quick else (14, 28, 56)
    # MHSA against VCA here; `python -m vcarepro.tools.bench attention` times the whole family
    attention = bench_attention(sides, layers=("mhsa", "vca"), min_run_time=timing)
    out["attention"] = [asdict(r) for r in attention]
    print("\n1. One attention layer (DeiT-T width 192, 3 heads, 49 contrast tokens, batch 8), median ms")
    print(attention_table(attention))

    memory = bench_attention_memory(sides)
    out["attention_memory"] = memory
    print("\n2. Activation memory kept for backward by one attention layer (MiB, batch 8)")
    for n in sorted({r["tokens"] for r in memory}):
        m, v = (next(r["saved_mib"] for r in memory if r["tokens"] == n and r["layer"] == k) for k in ("mhsa", "vca"))
        print(f"   N={n:>5}: MHSA {m:8.1f}  VCA {v:8.1f}  MHSA/VCA {m / v:5.2f}")

    models = bench_models((224, 448) if quick else (224, 448, 896), min_run_time=timing)
    out["models"] = models
    print("\n3. Whole model forward, batch 1 (median ms)")
    for size in sorted({r["img_size"] for r in models}):
        base, vca = (
            next(r for r in models if r["img_size"] == size and r["model"] == name)
            for name in ("deit_tiny_patch16_224", "vca_deit_tiny_patch16_224")
        )
        print(
            f"   {size:>4} px ({base['tokens']:>5} tokens): DeiT-T {base['forward_ms']:8.1f}  "
            f"VCA-DeiT-T {vca['forward_ms']:8.1f}  DeiT-T/VCA {base['forward_ms'] / vca['forward_ms']:5.2f}"
        )

    loop = bench_train_loop(steps=10 if quick else 40)
    out["train_loop"] = loop
    print(
        f"\n4. Training loop, embedded DeiT-T, batch {loop['batch']}: ours {loop['ours_images_per_s']:.0f} images/s, "
        f"plain timm loop {loop['plain_images_per_s']:.0f} images/s, overhead {loop['overhead'] * 100:+.1f}%"
    )

    from vcarepro.tools.bench.loader import bench_loader, loader_table

    loader = bench_loader(seconds=1.5 if quick else 6.0, images=16 if quick else 64)
    out["loader"] = loader
    print(f"\n5. The training input path, {loader['recipe']}'s augmentation at 224 px on {loader['source']}")
    print(loader_table(loader))

    noop = bench_dvc_noop()
    out["dvc_noop"] = noop
    if "skipped" in noop:
        print(f"\n6. DVC no-op time: skipped, {noop['skipped']}")
    elif noop:
        print(
            f"\n6. DVC with everything up to date: dvc status {noop['dvc_status_s']:.2f} s, "
            f"dvc repro {noop['dvc_repro_s']:.2f} s"
        )
    write_json(json_path, out, sort_keys=False, end="")
    print(f"\nwrote {json_path}")
    return out
