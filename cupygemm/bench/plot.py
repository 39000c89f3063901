"""The bar chart of ``cupygemm bench --plot`` (matplotlib, the ``bench`` extra)."""
from __future__ import annotations

import math
import os
from typing import Any, Sequence

from .providers import TITLES
from .report import ShapeResult, group_by_shape, providers_in

MATPLOTLIB_HINT = "--plot needs matplotlib: pip install 'cupygemm[bench]'"


def plot_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


def write_plot(path: str | os.PathLike, rows: Sequence[dict[str, Any]], title: str = "") -> None:
    """Bar chart, one bar per provider and shape: time relative to cuBLAS block-scaled where it ran (lower is
    better), absolute TFLOPS for the other shapes (higher is better). Raises ImportError without matplotlib."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ImportError(MATPLOTLIB_HINT) from e

    groups = group_by_shape(rows)
    providers = providers_in(rows)

    def has_ref(sr: ShapeResult) -> bool:
        ref = sr.by_provider.get("cublas_block")
        return bool(ref and ref.get("us") and not ref.get("error"))

    panels = [(mode, gs) for mode, gs in (("relative", [g for g in groups if has_ref(g)]),
                                          ("tflops", [g for g in groups if not has_ref(g)])) if gs]
    if not panels:
        raise ValueError("write_plot: no rows to plot")
    def ran(p: str, sr: ShapeResult) -> bool:
        r = sr.by_provider.get(p)
        return bool(r and r.get("us") is not None and not r.get("error"))

    widest = max(len(gs) for _, gs in panels)
    fig = Figure(figsize=(max(8.0, 0.35 * widest * max(1, len(providers)) + 2), 4.8 * len(panels)))
    FigureCanvasAgg(fig)
    for i, (mode, gs) in enumerate(panels):
        ax = fig.add_subplot(len(panels), 1, i + 1)
        shown = [p for p in providers if any(ran(p, sr) for sr in gs)] or providers
        width = 0.8 / len(shown)
        for j, p in enumerate(shown):
            vals = []
            for sr in gs:
                r = sr.by_provider.get(p)
                if not ran(p, sr):
                    vals.append(math.nan)
                elif mode == "relative":
                    vals.append(r["us"] / sr.by_provider["cublas_block"]["us"])
                else:
                    vals.append(r.get("tflops") if r.get("tflops") is not None else math.nan)
            xs = [x + (j - (len(shown) - 1) / 2) * width for x in range(len(gs))]
            ax.bar(xs, vals, width, label=TITLES.get(p, p))
        ax.set_xticks(list(range(len(gs))))
        ax.set_xticklabels([f"{sr.kind} {sr.label}" for sr in gs], rotation=60, ha="right", fontsize=7)
        if mode == "relative":
            ax.axhline(1.0, color="black", linewidth=0.8)
            ax.set_ylabel("time / cuBLAS block-scaled\n(lower is better)")
        else:
            ax.set_ylabel("TFLOPS (higher is better)")
        ax.legend(fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(str(path), dpi=120)
