"""The PNGs of the CLI: a dataset's length histogram (`hydraplan dataset stats --plot`) and a pipeline
schedule's timeline (`hydraplan pipeline --plot`). matplotlib is imported only when one is drawn."""

from __future__ import annotations

from pathlib import Path

from hydraplan.core.lengthstats import format_tokens
from hydraplan.core.schedules import Timeline
from hydraplan.core.schema import DatasetStats
from hydraplan.store.fileio import save_figure


def plot_stats(stats: DatasetStats, path: Path) -> None:
    """Share of documents next to share of tokens per bin: the long tail is few documents but
    many tokens, which is what a planner has to balance."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    bins = stats.histogram
    x = np.arange(len(bins))
    docs = np.array([b.docs for b in bins]) / stats.count * 100
    tokens = np.array([b.tokens for b in bins]) / stats.tokens * 100
    fig, ax = plt.subplots(figsize=(10, 4.8), layout="constrained")
    ax.bar(x - 0.2, docs, width=0.4, label="% of documents", color="#4C72B0")
    ax.bar(x + 0.2, tokens, width=0.4, label="% of tokens", color="#DD8452")
    ax.set_xticks(x, [format_tokens(b.hi) for b in bins], rotation=45 if len(bins) > 14 else 0)
    ax.set_xlabel("document length (tokens), bin (hi/2, hi]")
    ax.set_ylabel("% of the dataset")
    context = f", truncated to {stats.context_len:,}" if stats.context_len else ""
    ax.set_title(f"{stats.dataset}: {stats.count:,} documents, {stats.tokens:,} tokens{context}\n"
                 f"median {stats.median:,.0f}, mean {stats.mean:,.0f}, p99 {stats.p99:,.0f}, max {stats.max:,}")
    ax.grid(axis="y", alpha=0.3)
    ax.legend()
    try:
        save_figure(fig, path, dpi=120)
    finally:
        plt.close(fig)


def plot_timeline(timeline: Timeline, path: str | Path, title: str | None = None, unit: str = "s") -> None:
    """Gantt chart of a timeline (one row per stage): forwards blue, backwards green, later splits and
    chunks darker; micro-batch numbers written in the boxes when they fit."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sch = timeline.schedule
    n_shades = sch.K * sch.V
    fig_w = min(24.0, 6.0 + 0.08 * sum(len(s) for s in sch.stages) / max(1, sch.P))
    fig, ax = plt.subplots(figsize=(fig_w, 0.5 * sch.P + 1.5))
    cmaps = {"F": plt.get_cmap("Blues"), "B": plt.get_cmap("Greens")}
    span = timeline.latency_s or 1.0
    for r, ivs in enumerate(timeline.intervals):
        for iv in ivs:
            a = iv.action
            shade = 0.35 + 0.5 * (a.chunk * sch.K + a.split) / max(1, n_shades - 1) if n_shades > 1 else 0.6
            ax.barh(r, iv.end - iv.start, left=iv.start, height=0.8, color=cmaps[a.op](shade), edgecolor="white", linewidth=0.3)
            if (iv.end - iv.start) / span > 0.012:
                ax.text((iv.start + iv.end) / 2, r, str(a.mb), ha="center", va="center", fontsize=6)
    ax.set_yticks(range(sch.P), [f"stage {r}" for r in range(sch.P)])
    ax.invert_yaxis()
    ax.set_xlabel("seconds" if unit == "s" else unit)
    ax.set_xlim(0, span)
    ax.set_title(title or f"{sch.name}  P={sch.P} M={sch.M} K={sch.K} V={sch.V}  latency {timeline.latency_s:.4g}{unit}  "
                 f"bubble {timeline.bubble_ratio:.1%}")
    fig.tight_layout()
    try:
        save_figure(fig, path, dpi=110)
    finally:
        plt.close(fig)
