"""Dispatch (Alg. 1 greedy and the Eq. 3 ILP) against brute force over all assignments of tiny instances."""

import itertools
import math

import numpy as np
import pytest

from hydraplan.core.cost import seq_cost, seq_time
from hydraplan.schema import Scheme, TimeCoeffs
from hydraplan.solve.dispatch import Infeasible, dispatch, lower_bound
from hydraplan.solve.dispatch_methods import BY_NAME as DISPATCH
from hydraplan.solve.packing import pack


def scheme(tp=1, pp=1, a=1e-3, b=1.0, c=20.0, max_len=1000):
    return Scheme(tp=tp, pp=pp, cp=1, max_len=max_len, util_len=1, time=TimeCoeffs(a=a, b=b, c=c))


def eq2(s, ls):
    """Eq. (2) written independently: sequence costs, c per needed micro-batch, (pp-1) x T(longest)."""
    if len(ls) == 0:
        return 0.0
    return float(seq_cost(s, ls).sum()) + s.time.c * math.ceil(sum(ls) / s.max_len) + (s.pp - 1) * seq_time(s, max(ls))


def objective(lengths, schemes, assign):
    return max(eq2(s, [int(l) for l, a in zip(lengths, assign) if a == j]) for j, s in enumerate(schemes))


def brute(lengths, schemes):
    best = np.inf
    for assign in itertools.product(range(len(schemes)), repeat=len(lengths)):
        if all(l <= schemes[a].max_len for l, a in zip(lengths, assign)):
            best = min(best, objective(lengths, schemes, assign))
    return best


def instances(n_cases, seed):
    rng = np.random.default_rng(seed)
    pool = [scheme(a=1e-3, b=1.0, c=20.0, max_len=1000), scheme(tp=2, a=5e-4, b=0.6, c=15.0, max_len=2000),
            scheme(tp=2, pp=2, a=5e-4, b=0.5, c=10.0, max_len=1500), scheme(tp=4, pp=3, a=2e-4, b=0.3, c=5.0, max_len=3000)]
    for _ in range(n_cases):
        D = int(rng.integers(2, 4))
        schemes = [pool[k] for k in rng.integers(0, len(pool), size=D)]  # repeats allowed
        top = max(s.max_len for s in schemes)
        lengths = rng.integers(20, top + 1, size=int(rng.integers(2, 8)))
        yield lengths, schemes


def check_valid(lengths, schemes, res):
    assert res.assign.shape == lengths.shape
    assert all(l <= schemes[a].max_len for l, a in zip(lengths, res.assign))  # capacity
    assert res.cost == pytest.approx(objective(lengths, schemes, res.assign), rel=1e-12)


def test_lower_bound_by_hand():
    s1, s2 = scheme(pp=1, max_len=1000), scheme(pp=3, max_len=1000)
    lengths = np.array([600, 500, 100])
    lb = lower_bound(lengths, np.array([0, 0, 1]), [s1, s2])
    # pipeline 0: costs 960 + 750, 1100 tokens -> 2 micro-batches of c=20; pp=1 adds nothing
    assert lb[0] == pytest.approx(960 + 750 + 2 * 20)
    # pipeline 1: cost 110, one micro-batch, plus (3-1) * T(100) = 2 * 130
    assert lb[1] == pytest.approx(110 + 20 + 2 * 130)
    assert lower_bound(lengths, np.array([0, 0, 0]), [s1, s2])[1] == 0.0  # empty pipeline


@pytest.mark.parametrize("seed", range(3))
def test_ilp_equals_brute_force_and_greedy_is_close(seed):
    matched = total = 0
    for lengths, schemes in instances(20, seed):
        want = brute(lengths, schemes)
        g = dispatch(lengths, schemes, method=DISPATCH["greedy"], seed=seed)
        i = dispatch(lengths, schemes, method=DISPATCH["ilp"], seed=seed)
        check_valid(lengths, schemes, g)
        check_valid(lengths, schemes, i)
        assert i.optimal and i.cost == pytest.approx(want, rel=1e-6)
        assert i.cost <= g.cost * (1 + 1e-12)  # ILP never worse than greedy (it is warm-started by it)
        assert g.cost >= want * (1 - 1e-9)
        if g.optimal:
            assert g.cost == pytest.approx(want, rel=1e-9)
        matched += g.cost <= want * (1 + 1e-9)
        total += 1
    assert matched >= 0.9 * total  # the greedy is a heuristic, but on tiny cases it nearly always finds the optimum


def test_greedy_matches_brute_force_on_identical_pipelines():
    rng = np.random.default_rng(11)
    s = scheme(pp=2)
    for _ in range(15):
        lengths = rng.integers(20, 1000, size=7)
        assert dispatch(lengths, [s, s, s]).cost == pytest.approx(brute(lengths, [s, s, s]), rel=1e-9)


def test_eq2_is_a_lower_bound_of_the_packed_pipeline():
    for lengths, schemes in instances(15, seed=4):
        res = dispatch(lengths, schemes)
        lb = lower_bound(lengths, res.assign, schemes)
        for j, s in enumerate(schemes):
            packed = pack(lengths[res.assign == j], s, rel_gap=0.0)
            assert packed.estimate_s >= lb[j] * (1 - 1e-12)


def alg1_reference(lengths, schemes, order):
    """Algorithm 1 line by line for one trial: put each sequence where the resulting maximum over all
    pipelines is smallest (ties: the smaller resulting load, then the lower pipeline index)."""
    D = len(schemes)
    members = [[] for _ in range(D)]
    for i in order:
        best = None
        for j in range(D):
            if lengths[i] > schemes[j].max_len:
                continue
            new = eq2(schemes[j], members[j] + [int(lengths[i])])
            omax = max([new] + [eq2(schemes[k], members[k]) for k in range(D) if k != j])
            if best is None or (omax, new) < best[:2]:
                best = (omax, new, j)
        members[best[2]].append(int(lengths[i]))
        yield best[2]


def test_greedy_trials_are_algorithm_1():
    from hydraplan.solve.dispatch.greedy import greedy_one, greedy_trials, trial_orders
    from hydraplan.solve.dispatch.pipes import Pipes

    rng = np.random.default_rng(1)
    pool = [scheme(), scheme(tp=2, pp=2, a=5e-4, b=0.5, c=10.0, max_len=1500),
            scheme(tp=4, pp=3, a=2e-4, b=0.3, c=5.0, max_len=3000)]
    medium = (rng.integers(20, 3000, size=60), [pool[k] for k in rng.integers(0, 3, size=12)])
    for k, (lengths, schemes) in enumerate([medium, *instances(30, seed=8)]):
        P = Pipes.of(schemes)
        J = P.eligible_count(lengths)
        orders = trial_orders(lengths, J, 4, seed=1)
        Wg = P.group_cost(lengths)
        got = greedy_trials(lengths, Wg[:, P.gid], J, P, orders)  # sorted-pipeline indices, all trials at once
        for t in range(len(orders)):
            want = dict(zip(orders[t], alg1_reference(lengths, [schemes[k] for k in P.order], orders[t])))
            want = [want[i] for i in range(len(lengths))]
            assert want == got[t].tolist()
            assert want == greedy_one(lengths, Wg, P, orders[t]).tolist()  # the heap version, one trial
        # the end-to-end objective (a transfer per scheme): the heap version equals the trials' loop
        transfer = np.array([s.time.c * (k % 3) * 7.0 for s in schemes])
        P = Pipes.of(schemes, transfer)
        Wg = P.group_cost(lengths)
        got = greedy_trials(lengths, Wg[:, P.gid], J, P, orders)
        for t in range(len(orders)):
            assert got[t].tolist() == greedy_one(lengths, Wg, P, orders[t]).tolist()


def test_ilp_reaches_brute_force_from_a_poor_hint():
    from hydraplan.solve.dispatch.ilp import ilp
    from hydraplan.solve.dispatch.pipes import Pipes, cost_sorted

    for lengths, schemes in instances(15, seed=5):
        P = Pipes.of(schemes)
        J = P.eligible_count(lengths)
        W = P.group_cost(lengths)[:, P.gid]
        poor = np.zeros(len(lengths), dtype=np.int64)  # everything on the pipeline with the largest MaxLen
        sol, proven = ilp(lengths, W, J, P, poor, cost_sorted(lengths, W, P, poor), 10.0, 0)
        assert proven
        assert cost_sorted(lengths, W, P, sol) == pytest.approx(brute(lengths, schemes), rel=1e-6)


def test_only_one_pipeline_can_hold_the_longest():
    small, big = scheme(max_len=1000), scheme(tp=2, a=5e-4, b=0.6, c=15.0, max_len=2000)
    lengths = np.array([1800, 1500, 100, 200, 900])
    res = dispatch(lengths, [small, small, big], method=DISPATCH["ilp"])
    assert res.assign[0] == 2 and res.assign[1] == 2
    assert res.cost == pytest.approx(brute(lengths, [small, small, big]), rel=1e-6)


def test_infeasible_names_the_length():
    with pytest.raises(Infeasible) as e:
        dispatch(np.array([10, 5000, 3000]), [scheme(max_len=1000), scheme(max_len=2000)])
    assert e.value.length == 5000 and e.value.max_len == 2000
    assert "5000" in str(e.value) and "2000" in str(e.value)


def test_ilp_time_limit_keeps_the_greedy():
    rng = np.random.default_rng(2)
    lengths = rng.integers(20, 2000, size=120)
    schemes = [scheme(pp=2, max_len=2000)] * 6 + [scheme(tp=2, a=5e-4, b=0.6, c=15.0, max_len=2000)] * 3
    g = dispatch(lengths, schemes)
    i = dispatch(lengths, schemes, method=DISPATCH["ilp"], time_limit_s=1e-4)
    check_valid(lengths, schemes, i)
    assert i.solver in ("greedy+warm-start", "greedy+cpsat-limit")
    assert not i.optimal and i.cost <= g.cost


def test_deterministic_for_a_seed_and_trials_matter():
    rng = np.random.default_rng(9)
    lengths = rng.integers(20, 1500, size=200)
    schemes = [scheme(pp=2, max_len=1500)] * 5 + [scheme(tp=2, a=5e-4, b=0.6, c=15.0, max_len=2000)] * 3
    r1 = dispatch(lengths, schemes, seed=3)
    r2 = dispatch(lengths, schemes, seed=3)
    assert np.array_equal(r1.assign, r2.assign) and r1.cost == r2.cost
    one = dispatch(lengths, schemes, trials=1, seed=3)
    assert r1.cost <= one.cost  # trial 0 is the same LPT trial: more trials never hurt


def test_empty_batch():  # an unknown method name: tests/test_dispatch_methods.py
    res = dispatch(np.array([], dtype=np.int64), [scheme()])
    assert res.assign.size == 0 and res.cost == 0.0


def test_forced_assignment_is_optimal():
    small, big = scheme(max_len=100), scheme(pp=2, max_len=1000)
    lengths = np.array([500, 600, 300])  # only `big` holds any of them
    res = dispatch(lengths, [small, big])
    assert res.assign.tolist() == [1, 1, 1] and res.optimal
    assert res.cost == pytest.approx(brute(lengths, [small, big]))


def test_the_swap_step_returns_the_best_swap_over_every_pair():
    """The local search's swap step skips partners no shorter than the member they replace (they cannot lower the
    top pipeline's load); what it returns is still the best swap over every pair, shorter or not, by Eq. (2)
    written independently, whenever some swap lowers the top pipeline's load."""
    from hydraplan.solve.dispatch.pipes import Pipes, State
    from hydraplan.solve.dispatch.search import _best_swap, _Fixed, _Top

    rng = np.random.default_rng(4)
    checked = 0
    for lengths, schemes in instances(60, seed=11):
        P = Pipes.of(schemes)
        ordered = [schemes[k] for k in P.order]
        J = P.eligible_count(lengths)
        W = P.group_cost(lengths)[:, P.gid]
        assign = np.array([rng.integers(0, j) for j in J])
        st = State.of(lengths, W, assign.copy())
        load = [eq2(s, [int(l) for l, a in zip(lengths, assign) if a == j]) for j, s in enumerate(ordered)]
        p = int(np.argmax(load))
        best = np.inf
        for i in np.flatnonzero(assign == p):
            for k in np.flatnonzero(assign != p):
                q = int(assign[k])
                if lengths[i] > ordered[q].max_len or lengths[k] > ordered[p].max_len:
                    continue
                new = assign.copy()
                new[i], new[k] = q, p
                best = min(best, max(eq2(ordered[j], [int(l) for l, a in zip(lengths, new) if a == j]) for j in (p, q)))
        sw = _best_swap(lengths, W, _Fixed.of(lengths, W), J, P, st, _Top.of(lengths, W, P, st, p))
        if best < load[p] * (1 - 1e-9):
            checked += 1
            assert sw is not None and sw.value == pytest.approx(best, rel=1e-9)
        else:
            assert sw is None or sw.value >= load[p] * (1 - 1e-9)
    assert checked >= 10


def test_longest_left_without_each_sequence_is_its_pipelines_longest_of_the_rest():
    """The swap step's per-partner longest sequence left on the partner's pipeline once the partner leaves, against
    the rest of the pipeline written out (ties in length, single-sequence pipelines and any order of `oth`)."""
    from hydraplan.solve.dispatch.search import _lmax_without

    rng = np.random.default_rng(9)
    for case in range(40):
        D = int(rng.integers(1, 6))
        lengths = rng.integers(1, 8 if case % 2 else 1000, int(rng.integers(1, 30)))
        assign = rng.integers(0, D, lengths.size)
        oth = rng.permutation(np.flatnonzero(assign != assign[0])) if case % 3 else np.arange(lengths.size)
        got = _lmax_without(lengths, assign, oth, D)
        want = [max((int(lengths[j]) for j in oth if assign[j] == assign[k] and j != k), default=0) for k in oth]
        assert got.tolist() == want
