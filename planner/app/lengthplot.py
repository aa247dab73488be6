"""PNG of a dataset's log2 length histogram (`hydraplan dataset stats --plot`)."""

from __future__ import annotations

from pathlib import Path

from hydraplan.core.lengthstats import format_tokens
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
