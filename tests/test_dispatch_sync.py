"""Dispatch under the end-to-end objective: max_j h_j(Eq. 2 load), h_j(O) = max(O, t_j + 2 O / 3), against
brute force; a case where it moves work away from the pipeline with the larger parameter slice."""

import itertools

import numpy as np
import pytest

from hydraplan.dispatch import dispatch
from tests.test_dispatch import eq2, instances, scheme


def h_objective(lengths, schemes, transfer, assign):
    loads = [eq2(s, [int(l) for l, a in zip(lengths, assign) if a == j]) for j, s in enumerate(schemes)]
    return max(max(o, t + 2 * o / 3) if o > 0 else 0.0 for o, t in zip(loads, transfer))  # idle: no sync


def brute(lengths, schemes, transfer):
    return min(h_objective(lengths, schemes, transfer, a) for a in itertools.product(range(len(schemes)), repeat=len(lengths))
               if all(l <= schemes[k].max_len for l, k in zip(lengths, a)))


@pytest.mark.parametrize("seed", range(2))
def test_ilp_with_sync_equals_brute_force_and_greedy_is_close(seed):
    rng = np.random.default_rng(50 + seed)
    matched = total = 0
    for lengths, schemes in instances(20, 20 + seed):
        transfer = np.array([float(rng.uniform(0, 1500)) / (s.tp * s.pp) for s in schemes])
        want = brute(lengths, schemes, transfer)
        g = dispatch(lengths, schemes, seed=seed, transfer=transfer)
        i = dispatch(lengths, schemes, method="ilp", seed=seed, transfer=transfer)
        for res in (g, i):
            assert res.cost == pytest.approx(h_objective(lengths, schemes, transfer, res.assign), rel=1e-12)
        assert i.optimal and i.cost == pytest.approx(want, rel=1e-6)
        assert g.cost >= want * (1 - 1e-9)
        matched += g.cost <= want * (1 + 1e-9)
        total += 1
    assert matched >= 0.85 * total


def test_sync_moves_work_to_the_pipeline_with_less_to_transfer():
    """Two identical-speed pipelines; the first has a large transfer. Without sync the work splits evenly;
    with it, the first pipeline gets less, since each of its seconds of work costs more end to end."""
    fast = scheme(a=0.0, b=1.0, c=0.0, max_len=1000)
    lengths = np.array([100] * 10)
    even = dispatch(lengths, [fast, fast])
    assert np.bincount(even.assign, minlength=2).tolist() == [5, 5]
    skewed = dispatch(lengths, [fast, fast], transfer=np.array([450.0, 0.0]), method="ilp")
    # 3 x 100 s on the first: h = max(300, 450 + 200) = 650 < 700 on the second; 4 would give 717, 2 give 800
    assert np.bincount(skewed.assign, minlength=2).tolist() == [3, 7]
    assert skewed.cost == pytest.approx(700)
