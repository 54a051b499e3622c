"""One attention layer of each family member against timm's fused MHSA, in bf16 (part ``attention``), and where the
time of VCA and of MHSA goes at the largest N (part ``profile``, ``--profile``).

The layers and timer are the attention bench's (:mod:`vcarepro.tools.bench`), under bf16 autocast as a bf16
recipe trains. The ``mhsa`` baseline runs under the flash backend where that kernel takes the inputs, else
under PyTorch's own choice (the row says which).
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from typing import Any, Callable, Dict, List, Tuple

import torch

from vcarepro.tools.gpu_check.parts import FAIL, PASS, Check, Outcome, one_line

BASELINE = "mhsa"
# (sides, dim, heads, pooled tokens, batch, seconds of timing per measurement) at tiny sizes; the GPU's come from
# the paper's attention_cost section (the attention_cost stage's sizes)
TINY = ((4, 6, 8), 32, 2, 4, 1, 0.01)
GPU_MIN_RUN_TIME = 0.2
PROFILED = ("vca", BASELINE)
PROFILE_STEPS = 3
PROFILE_ROWS = 15  # the slowest ops listed per layer in profile.txt
PROFILE_FILE = "profile.txt"


def sizes(check: Check) -> Tuple[Tuple[int, ...], int, int, int, int, float]:
    if check.tiny:
        return TINY
    from vcarepro.tools.gpu_check.steps import composed

    cost = composed("paper")["attention_cost"]
    return tuple(cost["sides"]), cost["dim"], cost["heads"], cost["contrast_tokens"], cost["batch"], GPU_MIN_RUN_TIME


def layers() -> Tuple[str, ...]:
    from vcarepro.core.choices import BENCH_LAYERS

    return tuple(BENCH_LAYERS)


def sdpa_backend(layer: torch.nn.Module, x: torch.Tensor) -> Tuple[Callable[[], Any], str]:
    """The context to run timm's fused MHSA in: flash attention where it accepts these inputs, else PyTorch's own
    choice; and its name for the table."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    try:
        with torch.no_grad(), torch.autocast(x.device.type, dtype=torch.bfloat16):
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                layer(x[:1])
        return (lambda: sdpa_kernel([SDPBackend.FLASH_ATTENTION])), "flash"
    except RuntimeError as err:
        return nullcontext, f"PyTorch's SDPA choice (flash refused: {one_line(err)[:80]})"


def bf16(layer: torch.nn.Module, context: Callable[[], Any]) -> Callable[[torch.Tensor], torch.Tensor]:
    def run(x: torch.Tensor) -> torch.Tensor:
        with context(), torch.autocast(x.device.type, dtype=torch.bfloat16):
            return layer(x)

    return run


def build(name: str, check: Check, side: int) -> Tuple[torch.nn.Module, torch.Tensor, Callable, str]:
    """The layer ``name`` for a ``side`` x ``side`` grid, its input, the bf16 call and the kernel it runs on."""
    from vcarepro.tools.bench import build_bench_layer

    _, dim, heads, pooled, batch, _ = sizes(check)
    torch.manual_seed(0)
    layer = build_bench_layer(name, dim, heads, side, pooled).to(check.device)
    x = torch.randn(batch, side * side, dim, device=check.device)
    context, kernel = nullcontext, "eager"
    if name == BASELINE:
        from timm.layers import Attention

        if not isinstance(layer, Attention):
            raise TypeError(f"the baseline {BASELINE!r} is {type(layer).__name__}, not timm's Attention")
        layer.fused_attn = True
        context, kernel = sdpa_backend(layer, x)
    return layer, x, bf16(layer, context), kernel


def timings(call: Callable, x: torch.Tensor, min_run_time: float, device: str) -> Tuple[float, float, str]:
    """Median ms forward (no grad) and forward+backward, and the output's dtype."""
    from vcarepro.tools.bench.timing import sync, time_ms

    x_grad = x.clone().requires_grad_()
    with torch.no_grad():
        dtype = str(call(x).dtype).replace("torch.", "")

    def forward():
        with torch.no_grad():
            call(x)
        sync(device)

    def forward_backward():
        call(x_grad).float().sum().backward()
        sync(device)

    return time_ms(forward, min_run_time), time_ms(forward_backward, min_run_time), dtype


def attention_part(check: Check, outcome: Outcome) -> None:
    sides, dim, heads, pooled, batch, min_run_time = sizes(check)
    names = layers()
    total = len(sides) * len(names)
    outcome.data.update(dim=dim, heads=heads, pooled_tokens=pooled, batch=batch, dtype="bf16 autocast")
    for side in sides:
        for name in names:
            if check.out_of_time(outcome, len(outcome.rows), total, "layer measurements"):
                _ratios(outcome)
                return
            row: Dict[str, Any] = {"id": f"{name} N={side * side}", "layer": name, "tokens": side * side}
            row["baseline"] = name == BASELINE
            layer = x = call = None
            try:
                layer, x, call, kernel = build(name, check, side)
                row["kernel"] = kernel
                row["forward_ms"], row["forward_backward_ms"], row["output_dtype"] = timings(
                    call, x, min_run_time, str(check.device)
                )
                bad = [k for k in ("forward_ms", "forward_backward_ms") if not (math.isfinite(row[k]) and row[k] > 0)]
                row["status"] = FAIL if bad else PASS
                row["reason"] = f"{', '.join(bad)} not a positive time" if bad else kernel
            except Exception as err:  # noqa: BLE001 - this layer's failure is its row's; the others are measured
                row["status"], row["reason"] = FAIL, one_line(err)
            finally:
                del layer, x, call  # this layer's memory back before the next is built
                if check.device.type == "cuda":
                    torch.cuda.empty_cache()
            check.log(f"attention: {row['id']}: {row['status']}")
            outcome.rows.append(row)
    _ratios(outcome)


def _ratios(outcome: Outcome) -> None:
    """Each row's times over the baseline's at the same N; the VCA ratios as the part's one line."""
    base = {r["tokens"]: r for r in outcome.rows if r["baseline"] and r["status"] == PASS}
    for row in outcome.rows:
        b = base.get(row["tokens"])
        if b is not None and row["status"] == PASS:
            row["forward_x_mhsa"] = row["forward_ms"] / b["forward_ms"]
            row["forward_backward_x_mhsa"] = row["forward_backward_ms"] / b["forward_backward_ms"]
    vca = [r for r in outcome.rows if r["layer"] == "vca" and "forward_backward_x_mhsa" in r]
    outcome.data["vca_over_mhsa_forward_backward"] = {f"N={r['tokens']}": r["forward_backward_x_mhsa"] for r in vca}
    if vca:
        outcome.summary = "VCA / fused MHSA forward+backward: " + ", ".join(
            f"N={r['tokens']} {r['forward_backward_x_mhsa']:.2f}x" for r in vca
        )


# ----------------------------------------------------------------------------- where the time goes


def profile_part(check: Check, outcome: Outcome) -> None:
    """VCA and fused MHSA at the largest N under torch.profiler: a few forward+backward steps each after a warm-up;
    the slowest ops (self time on the device, on a CPU the CPU's) as rows and as torch's table in profile.txt."""
    from torch.profiler import ProfilerActivity, profile

    from vcarepro.core.io import write_bytes

    sides = sizes(check)[0]
    side = max(sides)
    cuda = check.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    tables: List[str] = []
    for name in PROFILED:
        if check.out_of_time(outcome, len(tables), len(PROFILED), "layers profiled"):
            break
        layer, x, call, kernel = build(name, check, side)
        x = x.requires_grad_()
        for _ in range(2):  # warm-up: kernels chosen, memory allocated
            call(x).float().sum().backward()
        if cuda:
            torch.cuda.synchronize(check.device)
        with profile(activities=activities) as prof:
            for _ in range(PROFILE_STEPS):
                call(x).float().sum().backward()
            if cuda:
                torch.cuda.synchronize(check.device)
        events = prof.key_averages()
        key = "self_device_time_total" if cuda else "self_cpu_time_total"
        total = sum(_self_us(e, key) for e in events) or 1.0
        for e in sorted(events, key=lambda e: -_self_us(e, key))[:5]:
            outcome.rows.append(
                {
                    "id": f"{name} {e.key}",
                    "layer": name,
                    "op": e.key,
                    "self_ms_per_step": _self_us(e, key) / 1e3 / PROFILE_STEPS,
                    "share": _self_us(e, key) / total,
                    "calls_per_step": e.count / PROFILE_STEPS,
                    "status": PASS,
                    "reason": f"{100 * _self_us(e, key) / total:.0f}% of {name}'s {'device' if cuda else 'CPU'} time",
                }
            )
        outcome.data[f"{name}_ms_per_step"] = total / 1e3 / PROFILE_STEPS
        tables.append(
            f"== {name} ({kernel}), N={side * side}, bf16 autocast, forward+backward x {PROFILE_STEPS}, "
            f"sorted by {key} ==\n" + events.table(sort_by=key, row_limit=PROFILE_ROWS)
        )
    if tables:
        write_bytes(check.out / PROFILE_FILE, ("\n\n".join(tables) + "\n").encode())
        outcome.data["file"] = PROFILE_FILE
    per = [outcome.data.get(f"{n}_ms_per_step") for n in PROFILED]
    if all(per):
        outcome.summary = (
            f"N={side * side}: VCA {per[0]:.2f} ms, MHSA {per[1]:.2f} ms of "
            f"{'device' if cuda else 'CPU'} time a step; the slowest ops in {PROFILE_FILE}"
        )


def _self_us(event, key: str) -> float:
    value = getattr(event, key, None)
    if value is None and key == "self_device_time_total":
        value = getattr(event, "self_cuda_time_total", 0.0)
    return float(value or 0.0)
