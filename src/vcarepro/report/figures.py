"""Training curves as PNG data URIs, so the report opens offline with no CDN."""
from __future__ import annotations

import base64
import io
from typing import Dict, List, Optional

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def curves_png(title: str, curves: Dict[str, Dict[int, List[tuple]]], metrics: List[str],
               xlabel: str = "step") -> Optional[str]:
    """One panel per metric, one line per seed; None when no metric has data."""
    present = [m for m in metrics if curves.get(m)]
    if not present:
        return None
    fig, axes = plt.subplots(1, len(present), figsize=(3.6 * len(present), 2.6), squeeze=False)
    for ax, metric in zip(axes[0], present):
        for seed, points in sorted(curves[metric].items()):
            steps, values = zip(*points)
            ax.plot(steps, values, label=f"seed {seed}", linewidth=1.2)
        ax.set_title(metric, fontsize=9)
        ax.set_xlabel(xlabel, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")
