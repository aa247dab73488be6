"""Dispatch under the end-to-end objective: max_j h_j(Eq. 2 load), h_j(O) = max(O, t_j + 2 O / 3), against
brute force; a case where it moves work away from the pipeline with the larger parameter slice."""

import itertools

import numpy as np
import pytest
from test_dispatch import eq2, instances, scheme

from hydraplan.core.sync import end_to_end_s
from hydraplan.solve.dispatch import dispatch, pigeonhole_bound, top_sequences_bound
from hydraplan.solve.dispatch_methods import BY_NAME as DISPATCH


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
        i = dispatch(lengths, schemes, method=DISPATCH["ilp"], seed=seed, transfer=transfer)
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
    skewed = dispatch(lengths, [fast, fast], transfer=np.array([450.0, 0.0]), method=DISPATCH["ilp"])
    # 3 x 100 s on the first: h = max(300, 450 + 200) = 650 < 700 on the second; 4 would give 717, 2 give 800
    assert np.bincount(skewed.assign, minlength=2).tolist() == [3, 7]
    assert skewed.cost == pytest.approx(700)


def e2e_brute(lengths, schemes, transfer):
    """The planner's objective (docs/formats.md end to end: with the 2t floor) of the best Eq. (2) dispatch."""
    def worst(assign):
        return max(end_to_end_s(t, eq2(s, [int(l) for l, a in zip(lengths, assign) if a == j]))
                   for j, (s, t) in enumerate(zip(schemes, transfer)))
    return min(worst(a) for a in itertools.product(range(len(schemes)), repeat=len(lengths))
               if all(l <= schemes[k].max_len for l, k in zip(lengths, a)))


@pytest.mark.parametrize("seed", range(3))
def test_pigeonhole_bound_is_below_every_dispatch(seed):
    """Against brute force over every dispatch (Eq. 2 loads, a lower bound of every packing), with and without
    sync, on instances with more long sequences than the pipelines that hold them."""
    rng = np.random.default_rng(70 + seed)
    active = 0
    for lengths, schemes in instances(25, 40 + seed):
        top = max(s.max_len for s in schemes)
        lengths = np.sort(np.r_[lengths, rng.integers(top // 2, top + 1, 2)])
        lengths = lengths[-7:]
        keys = sorted({(s.tp, s.pp, s.max_len, s.time.a, s.time.b, s.time.c) for s in schemes})
        kinds = [next(s for s in schemes if (s.tp, s.pp, s.max_len, s.time.a, s.time.b, s.time.c) == k) for k in keys]
        counts = np.array([sum((s.tp, s.pp, s.max_len, s.time.a, s.time.b, s.time.c) == k for s in schemes) for k in keys])
        for transfer in (np.zeros(len(kinds)), np.array([float(rng.uniform(0, 1500)) / (s.tp * s.pp) for s in kinds])):
            per_pipe = [transfer[keys.index((s.tp, s.pp, s.max_len, s.time.a, s.time.b, s.time.c))] for s in schemes]
            bound = pigeonhole_bound(lengths, kinds, counts, transfer)
            assert bound <= e2e_brute(lengths, schemes, per_pipe) * (1 + 1e-12)
            active += bound > 0
    assert active >= 10  # the cases with m >= 2 were exercised


def test_pigeonhole_bound_counts_what_only_the_wide_pipeline_holds():
    """Three sequences only the one wide pipeline can hold: at least three times the third longest there, above
    the longest alone; nothing to add once there are as many wide pipelines as such sequences."""
    wide, narrow = scheme(tp=2, a=5e-4, b=0.6, c=15.0, max_len=2000), scheme(max_len=1000)
    lengths = np.array([1800, 1500, 1200, 300])
    want = e2e_brute(lengths, [wide, narrow, narrow], [0.0, 0.0, 0.0])
    assert pigeonhole_bound(lengths, [wide, narrow], np.array([1, 2])) == pytest.approx(
        eq2(wide, [1200] * 3), rel=1e-12)  # the bound's m = 3 items of the third longest's length
    assert eq2(wide, [1200] * 3) <= want <= eq2(wide, [1800, 1500, 1200]) + 1e-9
    assert pigeonhole_bound(lengths, [wide, narrow], np.array([3, 2])) == 0.0  # enough wide pipelines: nothing to add


def test_top_sequences_bound_is_its_definition():
    """max over k of min(pair_k, own_k), with own_k by exhaustive search over assignments of the k longest to
    distinct pipelines and pair_k over every pair of them and every scheme that holds both: the binary
    searches over k and thresholds find what the definition says."""
    rng = np.random.default_rng(11)
    for lengths, schemes in instances(40, 90):
        keys = sorted({(s.tp, s.pp, s.max_len) for s in schemes})
        kinds = [next(s for s in schemes if (s.tp, s.pp, s.max_len) == k) for k in keys]
        counts = np.array([sum((s.tp, s.pp, s.max_len) == k for s in schemes) for k in keys])
        transfer = np.array([float(rng.uniform(0, 800)) / (s.tp * s.pp) for s in kinds]) if rng.random() < 0.5 else None
        t = np.zeros(len(kinds)) if transfer is None else transfer
        ls = sorted((int(x) for x in lengths), reverse=True)
        pipes = [g for g, n in enumerate(counts) for _ in range(n)]
        want = 0.0
        for k in range(2, min(len(ls), len(pipes) + 1) + 1):
            own = min((max(end_to_end_s(t[pipes[j]], eq2(kinds[pipes[j]], [ls[i]])) for i, j in enumerate(p))
                       for p in itertools.permutations(range(len(pipes)), k)
                       if all(ls[i] <= kinds[pipes[j]].max_len for i, j in enumerate(p))), default=np.inf)
            pair = min((end_to_end_s(t[g], eq2(s, [ls[k - 2], ls[k - 1]])) for g, s in enumerate(kinds)
                        if ls[k - 2] <= s.max_len), default=np.inf)
            want = max(want, min(own, pair))
        assert top_sequences_bound(lengths, kinds, counts, transfer) == pytest.approx(want, rel=1e-12, abs=1e-12)


def _matched(allowed: list[list[int]], pipes: int) -> bool:
    """Every sequence on a distinct pipeline it may take (Kuhn's augmenting paths)."""
    owner = [-1] * pipes

    def augment(i, seen):
        for j in allowed[i]:
            if not seen[j]:
                seen[j] = True
                if owner[j] < 0 or augment(owner[j], seen):
                    owner[j] = i
                    return True
        return False

    return all(augment(i, [False] * pipes) for i in range(len(allowed)))


def test_top_sequences_bound_with_many_kinds_of_scheme_is_its_definition():
    """Ten to twelve kinds of scheme (one or two pipelines each): own_k by bipartite matching at every threshold,
    pair_k over every scheme holding the pair; the bound is max over k of min(pair_k, own_k)."""
    rng = np.random.default_rng(12)
    active = 0
    for _ in range(12):
        G = int(rng.integers(10, 13))
        kinds = [scheme(tp=int(rng.choice([1, 2, 4])), pp=int(rng.integers(1, 4)), a=float(rng.uniform(1e-4, 1e-3)),
                        b=float(rng.uniform(0.2, 1.0)), c=float(rng.uniform(5, 20)), max_len=int(rng.integers(800, 3000)))
                 for _ in range(G)]
        counts = rng.integers(1, 3, size=G)
        transfer = rng.uniform(0, 400, size=G) if rng.random() < 0.5 else None
        t = np.zeros(G) if transfer is None else transfer
        ls = sorted(rng.integers(600, max(s.max_len for s in kinds) + 1, size=int(rng.integers(6, 12))).tolist(), reverse=True)
        pipes = [g for g, n in enumerate(counts) for _ in range(n)]
        alone = [[end_to_end_s(t[g], eq2(kinds[g], [l])) if l <= kinds[g].max_len else np.inf for g in pipes] for l in ls]
        want = 0.0
        for k in range(2, min(len(ls), len(pipes) + 1) + 1):
            xs = sorted({x for row in alone[:k] for x in row if np.isfinite(x)})
            own = next((x for x in xs if _matched([[j for j, y in enumerate(row) if y <= x] for row in alone[:k]],
                                                  len(pipes))), np.inf)
            pair = min((end_to_end_s(t[g], eq2(s, [ls[k - 2], ls[k - 1]])) for g, s in enumerate(kinds)
                        if ls[k - 2] <= s.max_len), default=np.inf)
            want = max(want, min(own, pair))
        got = top_sequences_bound(np.array(ls), kinds, counts, transfer)
        assert got == pytest.approx(want, rel=1e-12, abs=1e-12)
        active += got > 0
    assert active >= 6  # the bound said something on most instances
