"""The run-wise first fit against item-by-item first fit (the textbook loop) on random inputs."""

import numpy as np
import pytest

from hydraplan.methods.baselines import ffd
from hydraplan.solve.ffd import first_fit_bins


def first_fit_by_item(lengths: list[int], capacity: int) -> list[int]:
    room: list[int] = []
    out = []
    for x in lengths:
        for b, r in enumerate(room):
            if r >= x:
                room[b] -= x
                out.append(b)
                break
        else:
            room.append(capacity - x)
            out.append(len(room) - 1)
    return out


@pytest.mark.parametrize("distinct", [3, 20, 1000])
def test_same_bins_as_item_by_item_first_fit(distinct):
    rng = np.random.default_rng(distinct)
    for _ in range(200):
        cap = int(rng.integers(1, 60))
        n = int(rng.integers(0, 80))
        pool = rng.integers(1, cap + 1, min(distinct, cap))
        l = np.sort(rng.choice(pool, n))[::-1]
        assert first_fit_bins(l, cap).tolist() == first_fit_by_item(l.tolist(), cap)


def test_long_tailed_lengths_match_and_ffd_keeps_placement_order():
    rng = np.random.default_rng(0)
    lengths = np.minimum(rng.lognormal(6.0, 1.5, 5000).astype(np.int64) + 1, 4096)
    order = np.argsort(-lengths, kind="stable")
    want = first_fit_by_item(lengths[order].tolist(), 4096)
    bins = ffd(lengths, 4096)
    assert len(bins) == max(want) + 1
    for b, items in enumerate(bins):  # each bin lists its items in the order first fit placed them
        assert items.tolist() == order[np.flatnonzero(np.array(want) == b)].tolist()


def test_rejects_unsorted_and_oversized():
    with pytest.raises(ValueError, match="sorted"):
        first_fit_bins(np.array([1, 2]), 5)
    with pytest.raises(ValueError, match=r"\[1, 5\]"):
        first_fit_bins(np.array([6, 1]), 5)
