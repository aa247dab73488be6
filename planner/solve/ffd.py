"""First-fit decreasing bin packing, with numpy work per distinct length instead of per item.

Item-by-item first fit is O(items x bins) in Python, seconds per call at thousands of GPUs. Real lengths
repeat a lot, and first fit places a run of equal
items in closed form: consecutive equal items go to the first bin with room until it is full, then to
the next, so the run fills the bins with room, in order, floor(room / l) each, and then opens new bins of
floor(capacity / l) each. That is exactly what item-by-item first fit does, one numpy step per run.
"""

from __future__ import annotations

import numpy as np


def first_fit_bins(lengths: np.ndarray, capacity: int) -> np.ndarray:
    """Bin index of each item under first fit, items taken in the given order, which must be
    non-increasing (first-fit decreasing); every item must be at most `capacity`."""
    l = np.asarray(lengths, dtype=np.int64)
    n = l.size
    bins = np.empty(n, dtype=np.int64)
    if n == 0:
        return bins
    if np.any(l[1:] > l[:-1]):
        raise ValueError("first_fit_bins: lengths must be sorted longest first")
    if int(l[0]) > capacity or int(l[-1]) < 1:
        raise ValueError(f"first_fit_bins: lengths must be in [1, {capacity}] (got {int(l[-1])}..{int(l[0])})")
    if int(l.sum()) <= capacity:  # one bin (the common case for a pipeline's share of a batch)
        bins[:] = 0
        return bins
    if n <= 24:  # small inputs: the plain loop is cheaper than numpy calls
        room_list: list[int] = []
        for i, x in enumerate(l.tolist()):
            for b, r in enumerate(room_list):
                if r >= x:
                    room_list[b] -= x
                    bins[i] = b
                    break
            else:
                room_list.append(capacity - x)
                bins[i] = len(room_list) - 1
        return bins
    room = np.empty(n, dtype=np.int64)  # never more bins than items
    used = 0  # bins opened so far
    live = np.empty(0, dtype=np.int64)  # bins whose room can still take the shortest item, ascending
    shortest = int(l[-1])
    starts = np.flatnonzero(np.r_[True, l[1:] != l[:-1]])
    for s, e in zip(starts.tolist(), [*starts[1:].tolist(), n]):
        x, k, pos = int(l[s]), e - s, s
        fits = live[room[live] >= x]
        if fits.size:
            take = room[fits] // x
            full = np.cumsum(take)
            m = int(np.searchsorted(full, k))  # the run ends in bin fits[m] (if m < fits.size)
            if m < fits.size:
                fits, take = fits[: m + 1], take[: m + 1].copy()
                take[-1] = k - (int(full[m - 1]) if m else 0)
            bins[pos:pos + int(take.sum())] = np.repeat(fits, take)
            room[fits] -= take * x
            pos += int(take.sum())
        if pos < e:  # new bins of `per` items each, the last one partial
            left, per = e - pos, capacity // x
            new = -(-left // per)
            bins[pos:e] = used + np.arange(left) // per
            room[used:used + new] = capacity - per * x
            room[used + new - 1] = capacity - (left - per * (new - 1)) * x
            live = np.r_[live, np.arange(used, used + new)]
            used += new
        live = live[room[live] >= shortest]
    return bins
