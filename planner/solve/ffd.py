"""First-fit decreasing bin packing, compiled: O(items x log bins) with a tree of the bins' free room.

Item-by-item first fit over a list of bins is O(items x bins) in Python, seconds per call at thousands of
GPUs (the static baseline packs a whole 25M-token batch). Here the leftmost bin with room for an item is
found by descending a max-tree of the bins' room; bins not opened yet have room `capacity`, so the first
of them is where first fit opens a new one. The same bins as the textbook loop (tests/test_ffd.py).
"""

from __future__ import annotations

import numba
import numpy as np


def first_fit_bins(lengths: np.ndarray, capacity: int) -> np.ndarray:
    """Bin index of each item under first fit, items taken in the given order, which must be
    non-increasing (first-fit decreasing); every item must be at most `capacity`."""
    l = np.array(lengths, dtype=np.int64)  # a contiguous, writable copy (callers may hold read-only views)
    n = l.size
    if n == 0:
        return np.empty(0, dtype=np.int64)
    if np.any(l[1:] > l[:-1]):
        raise ValueError("first_fit_bins: lengths must be sorted longest first")
    if int(l[0]) > capacity or int(l[-1]) < 1:
        raise ValueError(f"first_fit_bins: lengths must be in [1, {capacity}] (got {int(l[-1])}..{int(l[0])})")
    if int(l.sum()) <= capacity:  # one bin (the common case for a pipeline's share of a batch)
        return np.zeros(n, dtype=np.int64)
    return _first_fit(l, int(capacity))


@numba.njit("int64[::1](int64[::1], int64)", cache=True)  # loaded at import
def _first_fit(l: np.ndarray, capacity: int) -> np.ndarray:
    size = 1
    while size < l.size:
        size *= 2
    room = np.full(2 * size, capacity, dtype=np.int64)  # leaves: bins; inner nodes: the most room below
    out = np.empty(l.size, dtype=np.int64)
    for i in range(l.size):
        x, node = l[i], 1
        while node < size:
            node = 2 * node if room[2 * node] >= x else 2 * node + 1
        out[i] = node - size
        room[node] -= x
        node //= 2
        while node >= 1:
            room[node] = max(room[2 * node], room[2 * node + 1])
            node //= 2
    return out
