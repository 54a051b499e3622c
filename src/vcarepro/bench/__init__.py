"""Benchmarks: scripts that print figures, never timed tests.

``python -m vcarepro.bench attention`` times VCA against timm's fused MHSA at
DeiT-T width over growing token counts, and counts their FLOPs, all in one run
so the ratios compare like with like on a noisy machine.
"""
from __future__ import annotations

import json
import os
import platform
from dataclasses import asdict, dataclass
from typing import Dict, List, Sequence

import torch
import torch.utils.benchmark as benchmark
from timm.layers import Attention

from ..attention import VisualContrastAttention
from ..metrics.complexity import count_flops
from ..report.environment import cpu_name


def describe_machine() -> Dict[str, object]:
    return {
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "python": platform.python_version(),
    }


@dataclass
class AttentionTiming:
    tokens: int
    layer: str
    forward_ms: float
    forward_backward_ms: float
    macs: int


def _time_ms(stmt, min_run_time: float) -> float:
    timer = benchmark.Timer(stmt="stmt()", globals={"stmt": stmt})
    return timer.blocked_autorange(min_run_time=min_run_time).median * 1e3


def bench_attention(sides: Sequence[int] = (14, 28, 56), *, dim: int = 192, heads: int = 3, batch: int = 8,
                    contrast_tokens: int = 49, min_run_time: float = 1.0,
                    device: str = "cpu") -> List[AttentionTiming]:
    """Forward and forward+backward wall time and MACs of VCA and MHSA on (batch, side^2, dim) tokens."""
    rows = []
    for side in sides:
        n = side * side
        layers = {
            "mhsa": Attention(dim, heads, qkv_bias=True),
            "vca": VisualContrastAttention(dim, heads, grid_size=side, num_prefix_tokens=0,
                                           contrast_tokens=contrast_tokens, qkv_bias=True),
        }
        for name, layer in layers.items():
            layer = layer.to(device)
            x = torch.randn(batch, n, dim, device=device)
            x_grad = x.clone().requires_grad_()

            def forward(layer=layer, x=x):
                with torch.no_grad():
                    layer(x)
                _sync(device)

            def forward_backward(layer=layer, x=x_grad):
                layer(x).sum().backward()
                _sync(device)

            with torch.no_grad():
                macs = count_flops(lambda: layer(x[:1])).macs * batch
            rows.append(AttentionTiming(n, name, _time_ms(forward, min_run_time),
                                        _time_ms(forward_backward, min_run_time), macs))
    return rows


def attention_table(rows: List[AttentionTiming]) -> str:
    by = {(r.tokens, r.layer): r for r in rows}
    tokens = sorted({r.tokens for r in rows})
    lines = [f"{'N':>6} | {'MHSA fwd ms':>11} {'VCA fwd ms':>10} {'MHSA/VCA':>8} | "
             f"{'MHSA f+b ms':>11} {'VCA f+b ms':>10} {'MHSA/VCA':>8} | {'MHSA GMACs':>10} {'VCA GMACs':>9}"]
    for n in tokens:
        m, v = by[(n, "mhsa")], by[(n, "vca")]
        lines.append(
            f"{n:>6} | {m.forward_ms:>11.2f} {v.forward_ms:>10.2f} {m.forward_ms / v.forward_ms:>8.2f} | "
            f"{m.forward_backward_ms:>11.2f} {v.forward_backward_ms:>10.2f} "
            f"{m.forward_backward_ms / v.forward_backward_ms:>8.2f} | {m.macs / 1e9:>10.3f} {v.macs / 1e9:>9.3f}"
        )
    first, last = tokens[0], tokens[-1]
    v0, v1 = by[(first, "vca")], by[(last, "vca")]
    lines.append(
        f"VCA scaling N={first}->{last} (token ratio {last / first:.0f}x): "
        f"forward {v1.forward_ms / v0.forward_ms:.1f}x, forward+backward "
        f"{v1.forward_backward_ms / v0.forward_backward_ms:.1f}x, MACs {v1.macs / v0.macs:.1f}x"
    )
    return "\n".join(lines)


def write_json(path: str, payload: Dict[str, object]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(payload, f, indent=2)
    os.replace(tmp, path)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


__all__ = ["AttentionTiming", "asdict", "attention_table", "bench_attention", "describe_machine", "write_json"]
