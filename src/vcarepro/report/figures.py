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
    """MACs and forward+backward time of one attention layer against token count, log-log, one line per layer.

    Three panels: exact MACs, eager time and compiled time (the last says why it is empty when the
    stage did not compile). Each layer has its own colour and marker, in one legend beside the panels.
    The x ticks are the measured token counts; both axes label decades in plain numbers and leave the
    minor ticks unlabelled (matplotlib's default labels them too, and on a log axis they collide).
    """
    if not cost or not cost.get("rows"):
        return None
    rows = cost["rows"]
    tokens = sorted({r["tokens"] for r in rows})
    layers = list(dict.fromkeys(r["layer"] for r in rows))
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.2))
    markers = "osD^v<>pP*Xh"
    colours = plt.get_cmap("tab10").colors
    panels = (("macs", 1e-9, "GMACs (exact)"), ("forward_backward_ms", 1.0, "ms, forward + backward, eager"),
              ("compiled_forward_backward_ms", 1.0, "ms, forward + backward, torch.compile"))
    for i, layer in enumerate(layers):
        mine = sorted((r for r in rows if r["layer"] == layer), key=lambda r: r["tokens"])
        style = dict(marker=markers[i % len(markers)], color=colours[i % len(colours)], markersize=4,
                     linewidth=1.2, linestyle="-" if i < len(colours) else "--", label=layer)
        for ax, (key, scale, _) in zip(axes, panels):
            points = [(r["tokens"], r[key] * scale) for r in mine if r.get(key) is not None]
            if points:
                ax.loglog(*zip(*points), **style)
    plain = ticker.FuncFormatter(lambda v, _: f"{v:g}")
    for ax, (key, _, label) in zip(axes, panels):
        ax.set_ylabel(label, fontsize=8)
        ax.set_xlabel("tokens N", fontsize=8)
        ax.tick_params(labelsize=8)
        if not ax.lines:  # nothing measured on this panel: say why instead of an empty frame
            failed = [r for r in rows if r.get("compile_error")]
            why = ("torch.compile failed for every layer" if failed
                   else "not measured\n(attention_cost.compile: false)")
            ax.text(0.5, 0.5, why, ha="center", va="center", fontsize=8, transform=ax.transAxes)
            ax.set_xticks([])
            ax.set_yticks([])
            continue
        ax.set_xticks(tokens)
        ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:.0f}"))
        ax.xaxis.set_minor_formatter(ticker.NullFormatter())
        ax.yaxis.set_major_locator(ticker.LogLocator(base=10))
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(ticker.NullFormatter())
        ax.grid(alpha=0.3, which="both")
    axes[1].set_title(cost["machine"].get("cpu") or "this machine", fontsize=7)
    handles, labels = axes[0].get_legend_handles_labels()
    # outside the panels, in a strip kept free on the right, so nine lines never cover a curve
    fig.tight_layout(rect=(0, 0, 0.89, 1))
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(0.895, 0.5), fontsize=7, frameon=False,
               ncol=1 if len(labels) <= 12 else 2)
    return _png(fig)
