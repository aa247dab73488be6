"""The solver seam (hydraplan.solve.milp): a tiny model solved through it equals brute force in both solvers, with
its point readable by variable index; an infeasible model and a search stopped by its limit come back as typed
statuses; a warm start is kept as a feasible point."""

import itertools

import highspy
import numpy as np
import pytest
from ortools.sat.python import cp_model

from hydraplan.solve import milp


def _instance(seed: int, n: int = 9, rows: int = 3):
    """max v.x subject to A x <= b, x binary, small integers (so both solvers see the same exact model)."""
    rng = np.random.default_rng(seed)
    v = rng.integers(1, 30, n)
    A = rng.integers(0, 20, (rows, n))
    b = A.sum(axis=1) // 2
    return v, A, b


def _brute(v, A, b) -> float | None:
    best = None
    for bits in itertools.product((0, 1), repeat=len(v)):
        x = np.array(bits)
        if (A @ x <= b).all() and (best is None or v @ x > best):
            best = int(v @ x)
    return best


def _cpsat_model(v, A, b):
    m = cp_model.CpModel()
    x = [m.new_bool_var(f"x{i}") for i in range(len(v))]
    for row, cap in zip(A, b):
        m.add(sum(int(a) * xi for a, xi in zip(row, x)) <= int(cap))
    m.maximize(sum(int(c) * xi for c, xi in zip(v, x)))
    return m, x


def _highs_model(v, A, b):
    """The same model, minimizing -v.x."""
    n = len(v)
    h = milp.highs_model()
    h.addVars(n, np.zeros(n), np.ones(n))
    h.changeColsCost(n, np.arange(n, dtype=np.int32), -v.astype(np.float64))
    h.changeColsIntegrality(n, np.arange(n, dtype=np.int32), np.full(n, highspy.HighsVarType.kInteger))
    for row, cap in zip(A, b):
        h.addRow(-highspy.kHighsInf, float(cap), n, np.arange(n, dtype=np.int32), row.astype(np.float64))
    return h


@pytest.mark.parametrize("seed", range(12))
def test_cpsat_through_the_seam_equals_brute_force(seed):
    v, A, b = _instance(seed)
    m, x = _cpsat_model(v, A, b)
    sol = milp.cpsat(m, seed=0, max_dtime_s=10.0)
    assert sol.status == "optimal"
    point = np.array([sol.values[xi.index] for xi in x])
    assert (A @ point <= b).all()
    assert sol.objective_value == v @ point == _brute(v, A, b)
    assert sol.bound == sol.objective_value


@pytest.mark.parametrize("seed", range(12))
def test_highs_through_the_seam_equals_brute_force(seed):
    v, A, b = _instance(seed)
    sol = milp.highs(_highs_model(v, A, b), mip=True, rel_gap=0.0)
    assert sol.status == "optimal"
    point = np.round(sol.values).astype(np.int64)
    assert (A @ point <= b).all()
    assert -sol.objective_value == pytest.approx(v @ point) and v @ point == _brute(v, A, b)
    assert sol.bound == pytest.approx(sol.objective_value)


def test_an_infeasible_model_is_typed_infeasible_in_both():
    m = cp_model.CpModel()
    x = m.new_int_var(0, 10, "x")
    y = m.new_int_var(0, 10, "y")
    m.add(x + y >= 15)
    m.add(x - y >= 6)
    m.add(y >= 5)  # x >= 11 > 10
    sol = milp.cpsat(m, seed=0, max_dtime_s=10.0)
    assert (sol.status, sol.values, sol.objective_value) == ("infeasible", None, None)

    h = milp.highs_model()
    h.addVars(2, np.zeros(2), np.full(2, 10.0))
    h.changeColsIntegrality(2, np.arange(2, dtype=np.int32), np.full(2, highspy.HighsVarType.kInteger))
    for lower, vals in ((15.0, [1.0, 1.0]), (6.0, [1.0, -1.0]), (5.0, [0.0, 1.0])):
        h.addRow(lower, highspy.kHighsInf, 2, np.arange(2, dtype=np.int32), np.array(vals))
    sol = milp.highs(h, mip=True)
    assert (sol.status, sol.values) == ("infeasible", None)


def _hard(seed: int = 1, n: int = 60):
    """A knapsack no solver proves at its root node: its search needs its limits."""
    rng = np.random.default_rng(seed)
    w = rng.integers(1000, 100000, n)
    return w + rng.integers(-100, 100, n), w[None, :], np.array([w.sum() // 2])


def test_a_search_stopped_by_its_limit_before_any_point_is_typed_limit():
    v, A, b = _hard()
    m, _ = _cpsat_model(v, A, b)
    sol = milp.cpsat(m, seed=0, max_dtime_s=0.0)
    assert (sol.status, sol.values, sol.objective_value) == ("limit", None, None)
    sol = milp.highs(_highs_model(v, A, b), mip=True, max_nodes=0, rel_gap=0.0)
    assert (sol.status, sol.values, sol.objective_value) == ("limit", None, None)


def test_a_search_stopped_by_its_limit_after_a_point_is_typed_feasible_and_keeps_the_warm_start():
    v, A, b = _hard()
    start = np.zeros(len(v))
    start[np.argsort(v)[:20]] = 1.0  # a feasible point: the 20 lightest of 60 items, well under half the weight
    assert (A @ start <= b).all()
    m, x = _cpsat_model(v, A, b)
    for xi, s in zip(x, start):
        m.add_hint(xi, int(s))
    sol = milp.cpsat(m, seed=0, max_dtime_s=1e-3)
    assert sol.status == "feasible" and sol.objective_value < sol.bound
    point = np.array([sol.values[xi.index] for xi in x])
    assert (A @ point <= b).all() and sol.objective_value == v @ point >= v @ start
    assert 0 < sol.dtime_s

    sol = milp.highs(_highs_model(v, A, b), mip=True, max_nodes=0, rel_gap=0.0, start=start)
    assert sol.status == "feasible"
    assert (A @ np.round(sol.values) <= b).all() and -sol.objective_value >= v @ start


def test_an_lp_has_a_point_and_no_mip_bound():
    h = milp.highs_model()
    h.addVars(2, np.zeros(2), np.full(2, 4.0))
    h.changeColsCost(2, np.arange(2, dtype=np.int32), np.array([-1.0, -2.0]))
    h.addRow(-highspy.kHighsInf, 5.0, 2, np.arange(2, dtype=np.int32), np.ones(2))
    sol = milp.highs(h, mip=False)
    assert sol.status == "optimal" and sol.bound is None
    assert sol.values == pytest.approx([1.0, 4.0]) and sol.objective_value == pytest.approx(-9.0)
