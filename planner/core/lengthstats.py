"""Pure math on per-document length arrays: histogram expansion and the `dataset stats` summary.

No I/O here, so the readers, the CLI and the tests share one definition of every figure.
"""

from __future__ import annotations

import numpy as np

from hydraplan.core.schema import DatasetStats, LengthBin, ShareAbove

SHARE_THRESHOLDS = (4096, 16384, 32768)


def expand_exact(values: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """One length per document of a `length,count` histogram (sorted by length)."""
    return np.repeat(np.asarray(values, dtype=np.int64), np.asarray(counts, dtype=np.int64))


def expand_bins(lo: np.ndarray, hi: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """One length per document of a `lo,hi,count` histogram, spread evenly over the integers of (lo, hi].

    The j-th of a bin's c documents gets lo + 1 + floor(j * (hi - lo) / c): every integer of the bin
    receives floor or ceil of c / (hi - lo) documents and the bin's mean is its midpoint, without a
    random generator, so the same file always yields the same dataset.
    """
    lo, hi, counts = (np.asarray(a, dtype=np.int64) for a in (lo, hi, counts))
    bin_of = np.repeat(np.arange(counts.size), counts)
    first = np.cumsum(counts) - counts
    j = np.arange(bin_of.size, dtype=np.int64) - first[bin_of]
    return lo[bin_of] + 1 + (j * (hi - lo)[bin_of]) // counts[bin_of]


def log2_bin_index(lengths: np.ndarray) -> np.ndarray:
    """k such that 2^(k-1) < l <= 2^k, i.e. the bit length of l - 1 (exact: frexp, not log2)."""
    return np.frexp(np.asarray(lengths, dtype=np.int64) - 1)[1].astype(np.int64)


def log2_histogram(lengths: np.ndarray) -> list[LengthBin]:
    """Documents and tokens per (2^(k-1), 2^k] bin, from the shortest to the longest non-empty bin."""
    lengths = np.asarray(lengths, dtype=np.int64)
    k = log2_bin_index(lengths)
    docs = np.bincount(k)
    tokens = np.bincount(k, weights=lengths)
    lo_k, hi_k = int(k.min()), int(k.max())
    return [LengthBin(lo=(1 << i) >> 1, hi=1 << i, docs=int(docs[i]), tokens=int(round(tokens[i])))
            for i in range(lo_k, hi_k + 1)]


def share_above(lengths: np.ndarray, thresholds: tuple[int, ...] = SHARE_THRESHOLDS) -> list[ShareAbove]:
    """The long tail in one figure per threshold: how much of the data (docs, tokens) is longer."""
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    out = []
    for t in thresholds:
        long = lengths[lengths > t]
        out.append(ShareAbove(threshold=t, docs=long.size / lengths.size, tokens=int(long.sum()) / total))
    return out


def summarize(lengths: np.ndarray, *, dataset: str, context_len: int | None = None,
              truncated: int = 0, empty: int = 0) -> DatasetStats:
    """Count-weighted order statistics (linear interpolation, numpy's default) of the lengths."""
    lengths = np.asarray(lengths, dtype=np.int64)
    median, p90, p99 = np.percentile(lengths, [50, 90, 99])
    return DatasetStats(
        dataset=dataset, context_len=context_len, truncated=truncated, empty=empty,
        count=int(lengths.size), tokens=int(lengths.sum()), min=int(lengths.min()), max=int(lengths.max()),
        mean=float(lengths.mean()), median=float(median), p90=float(p90), p99=float(p99),
        share_above=share_above(lengths), histogram=log2_histogram(lengths),
    )


def format_tokens(n: int) -> str:
    """1024 -> '1K', 1048576 -> '1M': bin edges are powers of two, so this is exact for them."""
    for unit, size in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)
