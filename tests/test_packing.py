"""Packing (Eq. 1 + the V search) against brute force over all set partitions of tiny instances."""

import numpy as np
import pytest
from helpers import partitions

from hydraplan.core.cost import pipeline_time
from hydraplan.schema import Scheme, TimeCoeffs
from hydraplan.solve import packing
from hydraplan.solve.dispatch import Infeasible
from hydraplan.solve.packing import pack, pack_fixed_v, v_range


def scheme(pp=2, a=1e-3, b=1.0, c=50.0, max_len=1000, util_len=1):
    return Scheme(tp=1, pp=pp, cp=1, max_len=max_len, util_len=util_len, time=TimeCoeffs(a=a, b=b, c=c))


def brute(lengths, s, vs):
    """Lowest canonical estimate over packings with a micro-batch count in `vs` that respect MaxLen."""
    best = np.inf
    for p in partitions(list(range(len(lengths)))):
        if len(p) in vs and all(lengths[b].sum() <= s.max_len for b in p):
            best = min(best, pipeline_time(s, [lengths[b] for b in p]))
    return best


def check_valid(lengths, s, res):
    got = np.sort(np.concatenate(res.micro_batches)) if res.micro_batches else np.array([], dtype=int)
    assert got.tolist() == list(range(len(lengths)))  # every sequence exactly once
    assert all(lengths[m].sum() <= s.max_len for m in res.micro_batches)  # capacity
    assert res.estimate_s == pytest.approx(pipeline_time(s, [lengths[m] for m in res.micro_batches]), rel=1e-12)
    assert res.estimate_s <= res.warm_start_s * (1 + 1e-12)


def instances(n_cases, seed):
    rng = np.random.default_rng(seed)
    for _ in range(n_cases):
        n = int(rng.integers(2, 8))
        lengths = rng.integers(50, 900, size=n)
        s = scheme(pp=int(rng.integers(1, 4)), c=float(rng.choice([0.0, 5.0, 200.0])),
                   util_len=int(rng.choice([1, 400])))
        yield lengths, s


@pytest.mark.parametrize("case", range(3))
def test_pack_equals_brute_force(case):
    packing._pack_sorted.cache_clear()
    paths = set()
    for lengths, s in instances(25, seed=case):
        want = brute(lengths, s, range(1, len(lengths) + 1))  # the best over every V: the range is by cost
        res = pack(lengths, s, rel_gap=0.0, time_limit_s=10.0)
        check_valid(lengths, s, res)
        assert res.estimate_s == pytest.approx(want, rel=1e-6)
        paths.add(res.solver)
    assert paths  # solver path always recorded


def test_pack_fixed_v_equals_brute_force_and_uses_cpsat():
    rng = np.random.default_rng(7)
    used_cpsat = False
    for _ in range(30):
        lengths = rng.integers(50, 700, size=7)
        s = scheme(pp=3, c=10.0)
        for V in range(1, 8):
            want = brute(lengths, s, [V])
            res = pack_fixed_v(lengths, s, V, rel_gap=0.0, time_limit_s=10.0)
            if not np.isfinite(want):
                assert res is None
                continue
            check_valid(lengths, s, res)
            assert len(res.micro_batches) == V
            assert res.optimal
            assert res.estimate_s == pytest.approx(want, rel=1e-6)
            used_cpsat |= "cpsat" in res.solver
    assert used_cpsat  # the greedy alone is not always provably optimal: the ILP path is exercised


def test_infeasible_lower_end_grows_v():
    # 1800 tokens fit in 2 micro-batches of 1000 by volume, but three 600s need 3
    s = scheme(pp=2, util_len=900)
    lengths = np.array([600, 600, 600])
    res = pack(lengths, s, rel_gap=0.0)
    check_valid(lengths, s, res)
    assert len(res.micro_batches) == 3
    assert res.estimate_s == pytest.approx(brute(lengths, s, [3]))


def test_v_range_keeps_the_best_v_and_drops_by_cost():
    for lengths, s in instances(40, seed=11):
        l = np.sort(lengths)[::-1]
        w = (s.time.a * l + s.time.b) * l
        vs = v_range(w, int(l.sum()), s.max_len, s.time.c, s.pp, brute(lengths, s, range(1, len(l) + 1)))
        costs = {V: brute(lengths, s, [V]) for V in range(1, len(l) + 1)}
        assert min(costs, key=lambda V: (costs[V], V)) in vs
    # a costly micro-batch constant: only the fewest micro-batches are worth trying
    s = scheme(pp=2, c=1e6)
    w = np.full(6, 10.0)
    assert v_range(w, 600, 1000, s.time.c, s.pp, 60 + 1e6 + (60 + 1e6)) == [1]  # V=1: S + c + (pp-1)(S + c)


def test_pp1_prefers_fewest_micro_batches():
    # with pp=1 every packing into V costs S + V*c: the optimum is the fewest micro-batches that fit
    s = scheme(pp=1, c=100.0)
    lengths = np.array([500, 400, 300, 300, 200, 100])
    res = pack(lengths, s)
    check_valid(lengths, s, res)
    assert len(res.micro_batches) == 2 and res.optimal


def test_solver_limit_falls_back_to_warm_start():
    rng = np.random.default_rng(3)
    lengths = rng.integers(100, 4000, size=60)
    s = scheme(pp=4, a=1e-4, c=1.0, max_len=20000)
    res = pack_fixed_v(lengths, s, 12, time_limit_s=1e-6, rel_gap=0.0)
    check_valid(lengths, s, res)
    assert res.solver in ("greedy+warm-start", "greedy+cpsat-limit")
    assert not res.optimal
    packing._pack_sorted.cache_clear()
    full = pack(lengths, s, time_limit_s=1e-6, rel_gap=0.0)
    check_valid(lengths, s, full)
    assert not full.optimal


def test_deterministic_and_cache_independent():
    rng = np.random.default_rng(5)
    lengths = rng.integers(100, 4000, size=40)
    s = scheme(pp=2, a=1e-4, c=1.0, max_len=12000, util_len=2000)
    packing._pack_sorted.cache_clear()
    r1 = pack(lengths, s, time_limit_s=0.5, rel_gap=0.0)
    packing._pack_sorted.cache_clear()
    r2 = pack(lengths, s, time_limit_s=0.5, rel_gap=0.0)
    assert [m.tolist() for m in r1.micro_batches] == [m.tolist() for m in r2.micro_batches]
    assert r1.estimate_s == r2.estimate_s and r1.solver == r2.solver


def test_indices_follow_input_order():
    s = scheme(pp=2)
    lengths = np.array([100, 900, 100, 800])
    res = pack(lengths, s, rel_gap=0.0)
    check_valid(lengths, s, res)
    shuffled = pack(lengths[[3, 2, 1, 0]], s, rel_gap=0.0)  # cached result mapped to new positions
    check_valid(lengths[[3, 2, 1, 0]], s, shuffled)
    assert shuffled.estimate_s == res.estimate_s


def test_too_long_sequence_and_empty():
    s = scheme()
    with pytest.raises(Infeasible) as e:
        pack(np.array([10, 1001]), s)
    assert e.value.length == 1001 and e.value.max_len == 1000
    empty = pack(np.array([], dtype=np.int64), s)
    assert empty.micro_batches == [] and empty.estimate_s == 0.0


def test_dtime_reports_the_cpsat_time_spent(cpsat_calls):
    rng = np.random.default_rng(3)
    lengths = rng.integers(100, 4000, size=60)
    res = pack_fixed_v(lengths, scheme(pp=4, a=1e-4, c=1.0, max_len=20000), 12, time_limit_s=0.05, rel_gap=0.0)
    assert cpsat_calls and res.dtime_s == pytest.approx(sum(cpsat_calls), rel=1e-12)


def test_models_too_large_to_build_in_the_budget_keep_the_greedy(cpsat_calls):
    """Building a CP-SAT model is Python work outside its deterministic limit: a model with more item-bin
    variables than _MAX_CPSAT_VARS is never built, whatever the time limit."""
    rng = np.random.default_rng(4)
    lengths = rng.integers(100, 4000, size=400)
    V = 100
    assert packing._cpsat_vars(len(lengths), V) > packing._MAX_CPSAT_VARS
    s = scheme(pp=4, a=1e-4, c=1.0, max_len=200_000)
    res = pack_fixed_v(lengths, s, V, time_limit_s=5.0, rel_gap=0.0)
    check_valid(lengths, s, res)
    assert cpsat_calls == [] and res.dtime_s == 0.0 and res.solver == "greedy" and len(res.micro_batches) == V


def test_cpsat_vars_counts_the_symmetry_broken_model():
    for U, V in [(1, 1), (5, 3), (3, 5), (10, 10)]:
        assert packing._cpsat_vars(U, V) == sum(min(i + 1, V) for i in range(U))
