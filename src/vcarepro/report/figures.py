"""The report's figures as PNG data URIs, so the page opens offline with no CDN."""
from __future__ import annotations

import base64
import io
from typing import Dict, List, Optional, Tuple

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import ticker  # noqa: E402


def curves_png(title: str, curves: Dict[str, Dict[int, List[tuple]]], metrics: List[str],
               xlabel: str = "step", references: Optional[Dict[str, Tuple[float, str]]] = None) -> Optional[str]:
    """One panel per metric, one line per seed, and a dashed line per ``references`` entry (metric -> (value, label)).

    None when no metric has data.
    """
    present = [m for m in metrics if curves.get(m)]
    if not present:
        return None
    fig, axes = plt.subplots(1, len(present), figsize=(3.6 * len(present), 2.6), squeeze=False)
    for ax, metric in zip(axes[0], present):
        for seed, points in sorted(curves[metric].items()):
            steps, values = zip(*points)
            ax.plot(steps, values, label=f"seed {seed}", linewidth=1.2)
        if references and metric in references:
            value, label = references[metric]
            ax.axhline(value, color="black", linestyle="--", linewidth=0.9, label=f"{label} {value:.1f}")
            ax.legend(fontsize=6)
        ax.set_title(metric, fontsize=9)
        ax.set_xlabel(xlabel, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return _png(fig)


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def gains_png(rows: List[dict]) -> Optional[str]:
    """VCA minus baseline per row: ours (at the scale measured, with its 95% interval) beside the paper's."""
    rows = [r for r in rows if r["ours_value"] is not None or r["paper_value"] is not None]
    if not rows:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(10, 0.45 * max(len(rows), 4) + 1.2), squeeze=False)
    for ax, metric, unit in ((axes[0][0], "top1", "top-1 points"), (axes[0][1], "fid", "FID")):
        subset = [r for r in rows if r["metric"] == metric]
        if not subset:
            ax.set_axis_off()
            continue
        y = range(len(subset))
        paper = [r["paper_value"] if r["paper_value"] is not None else 0.0 for r in subset]
        ours = [r["ours_value"] if r["ours_value"] is not None else 0.0 for r in subset]
        # asymmetric bars from the interval's ends; none where a side has one seed (no error estimate)
        err = [[v - r["ours_low"] if r["ours_low"] is not None else 0.0 for v, r in zip(ours, subset)],
               [r["ours_high"] - v if r["ours_high"] is not None else 0.0 for v, r in zip(ours, subset)]]
        ax.barh([i + 0.2 for i in y], paper, height=0.4, label="paper", color="#999999")
        ax.barh([i - 0.2 for i in y], ours, height=0.4, xerr=err, capsize=2, label="ours (its scale, 95% interval)",
                color="#3366aa")
        ax.set_yticks(list(y))
        ax.set_yticklabels([r["label"] for r in subset], fontsize=7)
        ax.axvline(0, color="black", linewidth=0.8)
        better = "right" if metric == "top1" else "left"
        ax.set_xlabel(f"VCA - baseline ({unit}; VCA better to the {better})", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return _png(fig)


def attention_cost_png(cost: Optional[dict]) -> Optional[str]:
    """MACs and forward+backward time of one attention layer against token count, log-log.

    The x ticks are the measured token counts; both axes label decades in plain numbers and leave the
    minor ticks unlabelled (matplotlib's default labels them too, and on a log axis they collide).
    """
    if not cost or not cost.get("rows"):
        return None
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.0))
    tokens = sorted({r["tokens"] for r in cost["rows"]})
    for layer, style in (("mhsa", "o-"), ("vca", "s-")):
        rows = sorted((r for r in cost["rows"] if r["layer"] == layer), key=lambda r: r["tokens"])
        n = [r["tokens"] for r in rows]
        axes[0].loglog(n, [r["macs"] / 1e9 for r in rows], style, label=layer.upper())
        axes[1].loglog(n, [r["forward_backward_ms"] for r in rows], style, label=layer.upper())
    axes[0].set_ylabel("GMACs (exact)", fontsize=8)
    axes[1].set_ylabel("ms, forward + backward", fontsize=8)
    axes[1].set_title(cost["machine"].get("cpu") or "this machine", fontsize=7)
    plain = ticker.FuncFormatter(lambda v, _: f"{v:g}")
    for ax in axes:
        ax.set_xlabel("tokens N", fontsize=8)
        ax.set_xticks(tokens)
        ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:.0f}"))
        ax.xaxis.set_minor_formatter(ticker.NullFormatter())
        ax.yaxis.set_major_locator(ticker.LogLocator(base=10))
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(ticker.NullFormatter())
        ax.grid(alpha=0.3, which="both")
        ax.tick_params(labelsize=8)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return _png(fig)
