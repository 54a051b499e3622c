"""The report's figures as PNG data URIs, so the page opens offline with no CDN."""

from __future__ import annotations

import base64
import io
from typing import Dict, List, Optional, Tuple

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import ticker  # noqa: E402

# The training curves drawn per run: the report's panels, and the model card's curves.png (report/card.py)
CLS_CURVES = ["train/loss", "val/loss", "val/top1", "train/lr"]
GEN_CURVES = ["train/loss"]


def curves_png(
    title: str,
    curves: Dict[str, Dict[int, List[tuple]]],
    metrics: List[str],
    xlabel: str = "step",
    references: Optional[Dict[str, Tuple[float, str]]] = None,
) -> Optional[str]:
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
    """VCA minus baseline for the rows we measured: the paper's and ours in separate panels, never on one axis.

    Per metric, the left panel holds the paper's differences (ImageNet at paper scale) and the right one
    ours (at the scale measured, as a point with its 95% interval, none where a side has one seed), each
    with its own axis: at any scale but the paper's only the signs compare, and the panels say so.
    Rows we did not measure are left out (a zero would read as a measured null effect).
    """
    rows = [r for r in rows if r["ours_value"] is not None]
    if not rows:
        return None
    metrics = [m for m in ("top1", "fid") if any(r["metric"] == m for r in rows)]
    height = max(sum(r["metric"] == m for r in rows) for m in metrics)
    fig, axes = plt.subplots(len(metrics), 2, figsize=(9, len(metrics) * (0.42 * max(height, 2) + 1.3)), squeeze=False)
    for (left, right), metric in zip(axes, metrics):
        subset = [r for r in rows if r["metric"] == metric]
        unit, better = ("top-1 points", "right") if metric == "top1" else ("FID", "left")
        y = list(range(len(subset)))
        labels = [r["label"] for r in subset]
        paper = [(i, r["paper_value"]) for i, r in zip(y, subset) if r["paper_value"] is not None]
        if paper:
            left.barh([i for i, _ in paper], [v for _, v in paper], height=0.5, color="#999999")
        for i, r in zip(y, subset):
            if r["paper_value"] is None:
                left.text(0, i, " no paper value", va="center", fontsize=7, color="#666666")
        left.set_title("paper (ImageNet, paper scale)", fontsize=8)
        scale = subset[0]["scale"]
        for i, r in zip(y, subset):
            if r["ours_low"] is not None:
                right.errorbar(
                    [r["ours_value"]],
                    [i],
                    xerr=[[r["ours_value"] - r["ours_low"]], [r["ours_high"] - r["ours_value"]]],
                    fmt="o",
                    color="#3366aa",
                    capsize=3,
                    markersize=4,
                )
            else:
                right.plot([r["ours_value"]], [i], "o", color="#3366aa", markersize=4, fillstyle="none")
        right.set_title(f"ours ({scale} scale; 95% interval; open: one seed)", fontsize=8)
        for ax in (left, right):
            ax.set_yticks(y)
            ax.set_yticklabels(labels if ax is left else [""] * len(y), fontsize=7)
            ax.set_ylim(-0.6, len(y) - 0.4)
            ax.invert_yaxis()
            ax.axvline(0, color="black", linewidth=0.8)
            ax.set_xlabel(f"VCA - baseline, {unit} (VCA better to the {better})", fontsize=7)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3, axis="x")
    if any(r["scale"] != "paper" for r in rows):
        fig.suptitle("Separate axes: sizes do not compare across scales; compare signs only", fontsize=8)
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
    panels = (
        ("macs", 1e-9, "GMACs (exact)"),
        ("forward_backward_ms", 1.0, "ms, forward + backward, eager"),
        ("compiled_forward_backward_ms", 1.0, "ms, forward + backward, torch.compile"),
    )
    for i, layer in enumerate(layers):
        mine = sorted((r for r in rows if r["layer"] == layer), key=lambda r: r["tokens"])
        style = dict(
            marker=markers[i % len(markers)],
            color=colours[i % len(colours)],
            markersize=4,
            linewidth=1.2,
            linestyle="-" if i < len(colours) else "--",
            label=layer,
        )
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
            why = "torch.compile failed for every layer" if failed else "not measured\n(attention_cost.compile: false)"
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
    fig.legend(
        handles,
        labels,
        loc="center left",
        bbox_to_anchor=(0.895, 0.5),
        fontsize=7,
        frameon=False,
        ncol=1 if len(labels) <= 12 else 2,
    )
    return _png(fig)
