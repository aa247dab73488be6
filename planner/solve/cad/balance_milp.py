"""The exact re-assignment of one CAD step's tasks (HiGHS MILP), warm-started from the greedy's."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import highspy
import numpy as np

from hydraplan.solve import milp as solver
from hydraplan.solve.cad.step import StepProblem, step_time

# The refinement is limited by work, never by a clock, so plans do not depend on the machine's speed or load:
# it runs on steps of up to MILP_MAX_VARS variables (2 x tasks x ranks; larger ones spend seconds on the root
# node alone) and stops after MILP_MAX_NODES branch-and-bound nodes.
MILP_MAX_VARS = 512
MILP_MAX_NODES = 200


@dataclass(frozen=True)
class _Columns:
    """Column layout: x[t, r] (task t on rank r), then w[t, r] (r reads t's document up to t's end), then z."""

    T: int
    d: int

    @property
    def nx(self) -> int:
        return self.T * self.d

    @property
    def nv(self) -> int:
        return 2 * self.T * self.d + 1

    @property
    def z(self) -> int:
        return self.nv - 1

    def x(self, t: int, r: int) -> int:
        return t * self.d + r

    def w(self, t: int, r: int) -> int:
        """w index: slot k of document D's sorted tasks = the task id at that slot, so w[D, x, k] -> nx + t_k*d + x."""
        return self.nx + t * self.d + r


def _tasks_by_document(p: StepProblem) -> dict[int, list[int]]:
    """Each document's tasks sorted by their end."""
    docs: dict[int, list[int]] = {}
    for t, (doc, _, e, _) in enumerate(p.tasks):
        docs.setdefault(doc, []).append(t)
    for ts in docs.values():
        ts.sort(key=lambda t: p.tasks[t][2])
    return docs


def _model(col: _Columns) -> highspy.Highs:
    """Binary x, 0 <= w <= 1, z >= 0 minimized."""
    h = solver.highs_model()
    nv, nx = col.nv, col.nx
    lower, upper = np.zeros(nv), np.ones(nv)
    upper[col.z] = highspy.kHighsInf
    h.addVars(nv, lower, upper)
    cost = np.zeros(nv)
    cost[col.z] = 1.0
    h.changeColsCost(nv, np.arange(nv, dtype=np.int32), cost)
    h.changeColsIntegrality(nx, np.arange(nx, dtype=np.int32), np.full(nx, highspy.HighsVarType.kInteger))
    return h


def _assignment_rows(h: highspy.Highs, col: _Columns, docs: dict[int, list[int]]) -> None:
    """Every task on one rank; w[t_k, r] >= x[t_k, r] and w[t_k, r] >= w[t_{k+1}, r] along a document's tasks."""
    inf = highspy.kHighsInf
    d = col.d
    for t in range(col.T):
        h.addRow(1.0, 1.0, d, np.array([col.x(t, r) for r in range(d)], dtype=np.int32), np.ones(d))
    for ts in docs.values():
        for k, t in enumerate(ts):
            for r in range(d):
                h.addRow(0.0, inf, 2, np.array([col.w(t, r), col.x(t, r)], dtype=np.int32), np.array([1.0, -1.0]))
                if k + 1 < len(ts):
                    h.addRow(0.0, inf, 2, np.array([col.w(t, r), col.w(ts[k + 1], r)], dtype=np.int32),
                             np.array([1.0, -1.0]))


def _comm_coefficients(p: StepProblem, col: _Columns, docs: dict[int, list[int]], scale: float) -> list[dict[int, float]]:
    """Per rank, its scaled comm as coefficients of x (queries away from home) and w (K/V prefix increments)."""
    d = col.d
    comm_rows: list[dict[int, float]] = [dict() for _ in range(d)]
    for t, (doc, s, e, home) in enumerate(p.tasks):
        for x in range(d):
            if x != home:
                for r, v in enumerate(p.q(t, x)):
                    if v:
                        comm_rows[r][col.x(t, x)] = comm_rows[r].get(col.x(t, x), 0.0) + v * scale
    for ts in docs.values():
        prev_end = 0
        for t in ts:
            doc, _, e, _ = p.tasks[t]
            for x in range(d):
                inc = p.kv(doc, e, x) - p.kv(doc, prev_end, x)
                for r, v in enumerate(inc):
                    if v:
                        comm_rows[r][col.w(t, x)] = comm_rows[r].get(col.w(t, x), 0.0) + v * scale
            prev_end = e
    return comm_rows


def _rank_rows(h: highspy.Highs, p: StepProblem, col: _Columns, comm_rows: list[dict[int, float]], cap: float,
               scale: float) -> None:
    """Every rank's compute <= z, comm <= z and comm <= cap."""
    inf = highspy.kHighsInf
    zi = col.z
    for r in range(col.d):
        idx = np.array([col.x(t, r) for t in range(col.T)] + [zi], dtype=np.int32)
        h.addRow(-inf, -p.linear[r] * scale, idx.size, idx, np.array([c * scale for c in p.cost] + [-1.0]))
        if comm_rows[r]:
            cols = np.array(list(comm_rows[r]), dtype=np.int32)
            vals = np.array(list(comm_rows[r].values()))
            h.addRow(-inf, 0.0, cols.size + 1, np.append(cols, np.int32(zi)), np.append(vals, -1.0))
            h.addRow(-inf, cap * scale * (1 + 1e-9), cols.size, cols, vals)


def _warm_start(col: _Columns, docs: dict[int, list[int]], start: Sequence[int], start_time: float,
                scale: float) -> np.ndarray:
    """The columns' values for the assignment `start`."""
    sol = np.zeros(col.nv)
    for t, x in enumerate(start):
        sol[col.x(t, x)] = 1.0
    for ts in docs.values():
        for k, t in enumerate(ts):
            for j in ts[k:]:
                sol[col.w(t, start[j])] = 1.0
    sol[col.z] = start_time * scale
    return sol


def milp(p: StepProblem, budget_s: float, start: Sequence[int], max_nodes: int = MILP_MAX_NODES
         ) -> tuple[list[int], bool] | None:
    """Exact re-assignment of the fixed tasks (HiGHS MILP), None if too large. Returns (ranks, proven optimal).

    x[t, r] = 1 if task t runs on r; z the step time. Rows: every task on one rank; every rank's compute
    <= z, comm <= z and comm <= cap (cap: the budget, or the start's comm if that is larger). K/V reads are
    de-duplicated exactly: the tasks of document D sorted by end e_1 <= ... <= e_K; w[D, x, k] >= x[t_j, x]
    for j >= k (0 <= w <= 1) flags that x reads D's prefix up to e_k, costing kv(e_k) - kv(e_{k-1}), which is
    nonnegative, so at the optimum w is the max of those x and the cost telescopes to kv(max end on x)."""
    col = _Columns(len(p.tasks), p.d)
    if 2 * col.nx > MILP_MAX_VARS:
        return None
    docs = _tasks_by_document(p)
    start_comp, start_comm = p.loads(start)
    cap = max(budget_s, float(start_comm.max()))
    start_time = step_time(start_comp, start_comm)
    scale = 1.0 / max(start_time, 1e-30)  # seconds -> O(1)
    h = _model(col)
    _assignment_rows(h, col, docs)
    _rank_rows(h, p, col, _comm_coefficients(p, col, docs, scale), cap, scale)
    sol = solver.highs(h, mip=True, max_nodes=max_nodes, start=_warm_start(col, docs, start, start_time, scale))
    if sol.values is None:
        return None
    ranks = sol.values[:col.nx].reshape(col.T, col.d).argmax(axis=1).tolist()
    return ranks, sol.status == "optimal"
