"""The attention family's speed bench (``python -m vcarepro.tools.bench attention``, stage attention_cost).

Every attention of the family (and VCA without its local term) at DeiT-T width over growing
token counts, eager and under ``torch.compile``, and their MACs, all in one run so the ratios
compare like with like on a noisy machine. :func:`speed_targets` reads the project's speed targets
off those rows.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union

import torch

from vcarepro.attention import POOLED_TOKEN_OPTION, build_attention
from vcarepro.core.choices import BENCH_LAYERS  # every attention, then VCA without its local term ("vca-dwc")
from vcarepro.metrics.complexity import count_flops
from vcarepro.tools.bench.timing import LOADED_SHARE, sync, timed_ms

# Layers whose cost grows linearly in the token count N (circulant: N log N, through its FFTs);
# mhsa, diff and mhsa+dwc keep an N x N map and grow quadratically.
LINEAR_LAYERS = ("vca", "vca-dwc", "agent", "flatten", "inline", "circulant")
# A linear layer's time may grow up to this multiple of the token ratio (small N pays fixed per-call
# costs, so time ratios scatter around the token ratio on a noisy CPU); the README's earlier target.
TIME_SLACK = 1.5
N_LOG_N_LAYERS = ("circulant",)
# A bench row name that is another attention with options: name -> (attention, options)
_VARIANTS = {"vca-dwc": ("vca", {"local_conv": False})}
COMPILE_OFF = "attention_cost.compile: false"
NOT_COMPILED = f"not measured ({COMPILE_OFF})"


@dataclass
class AttentionTiming:
    tokens: int
    layer: str
    forward_ms: float
    forward_backward_ms: float
    macs: int
    compiled_forward_ms: Optional[float] = None  # None: not measured (compile off, or it failed)
    compiled_forward_backward_ms: Optional[float] = None
    compile_error: Optional[str] = None  # one line, when torch.compile failed for this layer
    # the least share of a core the timed thread had in this row's timings (timing.timed_ms); None on a GPU
    cpu_share: Optional[float] = None


def build_bench_layer(name: str, dim: int, heads: int, side: int, pooled_tokens: int) -> torch.nn.Module:
    """One layer of ``name`` (a :data:`BENCH_LAYERS` entry) for a ``side`` x ``side`` grid and no prefix tokens."""
    attention, options = _VARIANTS.get(name, (name, {}))
    options = dict(options)
    if attention in POOLED_TOKEN_OPTION:
        options[POOLED_TOKEN_OPTION[attention]] = pooled_tokens
    return build_attention(attention, dim, heads, grid_size=side, num_prefix_tokens=0, qkv_bias=True, options=options)


def _timings(layer: Callable, x: torch.Tensor, min_run_time: float, device: str, *, warm_up: bool = False):
    """Median forward (no grad) and forward+backward ms of ``layer`` on ``x``.

    The timer's block-size estimate already runs each call once before it measures; ``warm_up``
    runs both once more beforehand, for a compiled layer, so that its two graphs (no-grad and
    training) compile outside the estimate.
    """
    x_grad = x.clone().requires_grad_()

    def forward():
        with torch.no_grad():
            layer(x)
        sync(device)

    def forward_backward():
        layer(x_grad).sum().backward()
        sync(device)

    if warm_up:
        forward()
        forward_backward()
    (f_ms, f_share), (fb_ms, fb_share) = timed_ms(forward, min_run_time), timed_ms(forward_backward, min_run_time)
    return f_ms, fb_ms, _least(f_share, fb_share)


def _least(*shares: Optional[float]) -> Optional[float]:
    known = [s for s in shares if s is not None]
    return min(known) if known else None


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]


def bench_attention(
    sides: Sequence[int] = (14, 28, 56),
    *,
    dim: int = 192,
    heads: int = 3,
    batch: int = 8,
    contrast_tokens: int = 49,
    layers: Optional[Sequence[str]] = None,
    compile: bool = False,
    min_run_time: float = 1.0,
    device: str = "cpu",
    log: Optional[Callable[[str], None]] = None,
) -> List[AttentionTiming]:
    """MACs and median forward / forward+backward wall time of each attention on (batch, side^2, dim) tokens.

    ``contrast_tokens`` is the pooled-token count of every layer that pools (VCA's contrast
    tokens, Agent's agent tokens). ``layers`` (default :data:`BENCH_LAYERS`) narrows the list;
    ``compile`` also times ``torch.compile(layer, dynamic=False)``, warmed up first; a layer that
    fails to compile records the reason in ``compile_error`` and the run goes on. MACs are exact,
    counted on one sample and multiplied by the batch.
    """
    layers = tuple(BENCH_LAYERS if layers is None else layers)
    unknown = [n for n in layers if n not in BENCH_LAYERS]
    if unknown:
        from vcarepro.core.errors import BadInput

        raise BadInput(f"unknown attention {', '.join(map(repr, unknown))}; choose from {', '.join(BENCH_LAYERS)}.")
    rows = []
    for side in sides:
        n = side * side
        for name in layers:
            torch.manual_seed(0)
            layer = build_bench_layer(name, dim, heads, side, contrast_tokens).to(device)
            x = torch.randn(batch, n, dim, device=device)
            with torch.no_grad():
                macs = count_flops(lambda: layer(x[:1])).macs * batch
            forward_ms, forward_backward_ms, share = _timings(layer, x, min_run_time, device)
            row = AttentionTiming(n, name, forward_ms, forward_backward_ms, macs, cpu_share=share)
            if compile:
                torch._dynamo.reset()  # a fresh cache per layer and shape: bounded memory, no recompile limit hit
                try:
                    compiled = torch.compile(layer, dynamic=False)
                    row.compiled_forward_ms, row.compiled_forward_backward_ms, share = _timings(
                        compiled, x, min_run_time, device, warm_up=True
                    )
                    row.cpu_share = _least(row.cpu_share, share)
                except Exception as error:  # noqa: BLE001  (any compiler failure is a finding, not a crash)
                    row.compile_error = _one_line(error)
                finally:
                    torch._dynamo.reset()
            rows.append(row)
            if log:
                log(_row_line(row))
    return rows


def _row_line(r: AttentionTiming) -> str:
    compiled = (
        f", compiled {r.compiled_forward_ms:.2f} / {r.compiled_forward_backward_ms:.2f} ms"
        if r.compiled_forward_ms is not None
        else (f", compile failed: {r.compile_error}" if r.compile_error else "")
    )
    return (
        f"N={r.tokens} {r.layer}: {r.macs / 1e9:.3f} GMACs, {r.forward_ms:.2f} ms forward, "
        f"{r.forward_backward_ms:.2f} ms forward+backward{compiled}"
    )


Row = Union[AttentionTiming, Mapping[str, object]]


def _as_dict(row: Row) -> Dict[str, object]:
    return asdict(row) if isinstance(row, AttentionTiming) else dict(row)


def attention_table(rows: List[AttentionTiming]) -> str:
    """MHSA against VCA, side by side (the two layers of the paper's complexity claim)."""
    by = {(r.tokens, r.layer): r for r in rows}
    tokens = sorted({r.tokens for r in rows})
    lines = [
        f"{'N':>6} | {'MHSA fwd ms':>11} {'VCA fwd ms':>10} {'MHSA/VCA':>8} | "
        f"{'MHSA f+b ms':>11} {'VCA f+b ms':>10} {'MHSA/VCA':>8} | {'MHSA GMACs':>10} {'VCA GMACs':>9}"
    ]
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


def _ms(value: Optional[float]) -> str:
    return "n/m" if value is None else f"{value:.2f}"


def family_speed_table(rows: Sequence[Row]) -> str:
    """Markdown: one row per layer; per token count N its GMACs, forward ms, forward+backward ms and
    compiled forward ms ("n/m": not measured; "failed": torch.compile failed, the reason is in the row)."""
    rows = [_as_dict(r) for r in rows]
    tokens = sorted({r["tokens"] for r in rows})
    layers = [name for name in dict.fromkeys(r["layer"] for r in rows)]
    by = {(r["layer"], r["tokens"]): r for r in rows}
    head = ["layer"] + [f"N={n} {what}" for n in tokens for what in ("GMACs", "fwd ms", "f+b ms", "compiled fwd ms")]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|"]
    for layer in layers:
        cells = [layer]
        for n in tokens:
            r = by.get((layer, n))
            if r is None:
                cells += ["n/m"] * 4
                continue
            compiled = "failed" if r.get("compile_error") else _ms(r.get("compiled_forward_ms"))
            mark = "*" if under_load(r) else ""
            times = [_ms(r["forward_ms"]) + mark, _ms(r["forward_backward_ms"]) + mark, compiled + mark]
            cells += [f"{r['macs'] / 1e9:.4f}", *times]
        lines.append("| " + " | ".join(cells) + " |")
    if not any(r.get("compiled_forward_ms") is not None or r.get("compile_error") for r in rows):
        lines.append(f"\ncompiled: {NOT_COMPILED}")
    if any(under_load(r) for r in rows):
        lines.append(
            f"\n*: measured under load (the timed thread had less than {LOADED_SHARE:.0%} of a core): the machine's "
            "figure, not the layer's; the targets on it are not judged"
        )
    return "\n".join(lines)


def _verdict(ok: Optional[bool]) -> str:
    return {True: "PASS", False: "FAIL", None: "NOT MEASURED"}[ok]


UNDER_LOAD = "NOT JUDGED, measured under load"


def under_load(row: Row) -> bool:
    """Whether ``row`` was timed under load: its timed thread had less than timing.LOADED_SHARE of a core."""
    share = _as_dict(row).get("cpu_share")
    return share is not None and share < LOADED_SHARE


def _loaded(rows: Sequence[Dict[str, Any]]) -> Optional[str]:
    """Where any of ``rows`` was timed under load (:func:`under_load`), the words that say so, else None."""
    worst = min(
        (r for r in rows if under_load(r)),
        key=lambda r: r["cpu_share"],
        default=None,
    )
    if worst is None:
        return None
    return (
        f"{UNDER_LOAD}: the timed thread had {worst['cpu_share']:.0%} of a core at {worst['layer']} "
        f"N={worst['tokens']}; time again on a quiet machine"
    )


def speed_targets(rows: Sequence[Row]) -> List[str]:
    """The project's speed targets (docs/performance.md), each a ratio within these rows and a PASS / FAIL word.

    A linear member's time may grow at most TIME_SLACK times the token ratio, its exact MACs 1.1x (circulant: both
    times the log factor of its FFTs).
    """
    rows = [_as_dict(r) for r in rows]
    by = {(r["layer"], r["tokens"]): r for r in rows}
    tokens = sorted({r["tokens"] for r in rows})
    return [*_compiled_vca_target(by), *_vca_agent_target(by, tokens), *_linear_target(rows, by, tokens)]


def _compiled_vca_target(by) -> List[str]:
    out = []
    # 1. compiled VCA vs eager MHSA, forward, N = 196
    vca, mhsa = by.get(("vca", 196)), by.get(("mhsa", 196))
    if vca is None or mhsa is None:
        out.append(
            f"1. compiled VCA forward <= eager MHSA forward at N=196: {_verdict(None)} (needs vca and mhsa at N=196)"
        )
    elif vca.get("compiled_forward_ms") is None:
        why = f"compile failed: {vca['compile_error']}" if vca.get("compile_error") else COMPILE_OFF
        out.append(f"1. compiled VCA forward <= eager MHSA forward at N=196: {_verdict(None)} ({why})")
    else:
        ratio = vca["compiled_forward_ms"] / mhsa["forward_ms"]
        out.append(
            f"1. compiled VCA forward <= eager MHSA forward at N=196: {_loaded([vca, mhsa]) or _verdict(ratio <= 1.0)} "
            f"(VCA compiled {vca['compiled_forward_ms']:.2f} ms / MHSA eager {mhsa['forward_ms']:.2f} ms "
            f"= {ratio:.2f}x)"
        )
    return out


def _vca_agent_target(by, tokens) -> List[str]:
    out = []
    # 2. VCA within 1.2x of Agent at every N
    both = [n for n in tokens if ("vca", n) in by and ("agent", n) in by]
    if not both:
        out.append(f"2. VCA within 1.2x of Agent at every N: {_verdict(None)} (needs vca and agent)")
    else:
        modes = [
            ("forward_ms", "eager forward"),
            ("forward_backward_ms", "eager forward+backward"),
            ("compiled_forward_ms", "compiled forward"),
            ("compiled_forward_backward_ms", "compiled forward+backward"),
        ]
        for key, label in modes:
            pairs = [(n, by[("vca", n)].get(key), by[("agent", n)].get(key)) for n in both]
            if any(v is None or a is None for _, v, a in pairs):
                errors = [by[(layer, n)].get("compile_error") for n in both for layer in ("vca", "agent")]
                why = next((f"compile failed: {e}" for e in errors if e), COMPILE_OFF)
                out.append(f"2. VCA/Agent {label} <= 1.2 at every N: {_verdict(None)} ({why})")
                continue
            ratios = [(n, v / a) for n, v, a in pairs]
            loaded = _loaded([by[(layer, n)] for n in both for layer in ("vca", "agent")])
            out.append(
                f"2. VCA/Agent {label} <= 1.2 at every N: {loaded or _verdict(all(r <= 1.2 for _, r in ratios))} ("
                + ", ".join(f"N={n} {r:.2f}x" for n, r in ratios)
                + ")"
            )
    return out


def _linear_target(rows, by, tokens) -> List[str]:
    out = []
    # 3. linear scaling of every linear member, MACs (the pass/fail) and time (reported)
    n0, n1 = (tokens[0], tokens[-1]) if tokens else (None, None)
    if n0 is None or n0 == n1:
        out.append(f"3. linear scaling: {_verdict(None)} (needs two token counts)")
        return out
    growth = n1 / n0
    for layer in [name for name in LINEAR_LAYERS if (name, n0) in by and (name, n1) in by]:
        a, b = by[(layer, n0)], by[(layer, n1)]
        macs = b["macs"] / a["macs"]
        bound = 1.1 * growth
        note = ""
        if layer in N_LOG_N_LAYERS:
            bound *= math.log2(n1) / math.log2(n0)
            note = f", N log N: bound includes the FFT's log factor log2({n1})/log2({n0})"
        # the time is what the target is about; exact MACs are linear by construction and only a sanity check
        times = [b[k] / a[k] for k in ("forward_ms", "forward_backward_ms")]
        time_bound = TIME_SLACK * bound / 1.1
        loaded = _loaded([a, b]) if macs <= bound else None  # MACs are counted, not timed: judged under load too
        out.append(
            f"3. {layer} linear in N ({n0}->{n1}, {growth:.0f}x tokens): "
            f"{loaded or _verdict(macs <= bound and max(times) <= time_bound)} "
            f"(time forward {times[0]:.1f}x, forward+backward {times[1]:.1f}x <= {time_bound:.1f}x; "
            f"MACs {macs:.2f}x <= {bound:.1f}x{note})"
        )
    quadratic = [
        name
        for name in dict.fromkeys(r["layer"] for r in rows)
        if name not in LINEAR_LAYERS and (name, n0) in by and (name, n1) in by
    ]
    if quadratic:
        out.append(
            "   quadratic members, for reference: "
            + ", ".join(
                f"{name} MACs {by[(name, n1)]['macs'] / by[(name, n0)]['macs']:.1f}x, forward+backward "
                f"{by[(name, n1)]['forward_backward_ms'] / by[(name, n0)]['forward_backward_ms']:.1f}x"
                for name in quadratic
            )
        )
    return out
