"""HiGHS models assembled from numpy blocks, and the LP algorithms tried in turn (run through solve/milp.py)."""

from __future__ import annotations

import highspy
import numpy as np

from hydraplan.solve import milp

INF = highspy.kHighsInf
# an LP is tried with these options in turn while it ends with status Unknown (simplex does now and then): a vertex
# first, or, when only whether a point exists matters, interior point first (on the relaxations' LPs of 10^4 rows
# it answers in a few seconds where dual simplex takes 10-60 s or gives up)
LP_TRIES: tuple[dict[str, str], ...] = ({}, {"presolve": "off"}, {"solver": "ipm"})
FEASIBILITY_TRIES: tuple[dict[str, str], ...] = ({"solver": "ipm"}, {}, {"presolve": "off"})


class SparseModel:
    """A feasibility model for HiGHS assembled block by block (variables and rows appended as numpy arrays),
    so the relaxations of solve/bound.py and solve/relaxation.py build thousands of rows without a Python
    loop per entry. Entries of one row must name distinct columns."""

    def __init__(self) -> None:
        self.lower: list[np.ndarray] = []
        self.upper: list[np.ndarray] = []
        self.integer: list[np.ndarray] = []
        self.n_cols = 0
        self.row_lower: list[np.ndarray] = []
        self.row_upper: list[np.ndarray] = []
        self.entries: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.n_rows = 0

    def add_vars(self, n: int, lower: float | np.ndarray = 0.0, upper: float | np.ndarray = INF,
                 integer: bool = False) -> np.ndarray:
        """Indices of n new columns."""
        self.lower.append(np.broadcast_to(np.asarray(lower, dtype=np.float64), (n,)))
        self.upper.append(np.broadcast_to(np.asarray(upper, dtype=np.float64), (n,)))
        self.integer.append(np.full(n, integer))
        self.n_cols += n
        return np.arange(self.n_cols - n, self.n_cols)

    def add_rows(self, n: int, rows: np.ndarray, cols: np.ndarray, vals: np.ndarray,
                 lower: float | np.ndarray = -INF, upper: float | np.ndarray = INF) -> np.ndarray:
        """n new rows `lower <= sum vals * x[cols] <= upper`; `rows` numbers the entries' rows 0..n-1."""
        self.row_lower.append(np.broadcast_to(np.asarray(lower, dtype=np.float64), (n,)))
        self.row_upper.append(np.broadcast_to(np.asarray(upper, dtype=np.float64), (n,)))
        self.entries.append((np.asarray(rows, dtype=np.int64) + self.n_rows, np.asarray(cols, dtype=np.int64),
                             np.asarray(vals, dtype=np.float64)))
        self.n_rows += n
        return np.arange(self.n_rows - n, self.n_rows)

    def solve(self, *, relax: bool = False, max_nodes: int | None = None, time_limit_s: float | None = None,
              cost: np.ndarray | None = None, rel_gap: float = 0.0, vertex: bool = True) -> milp.Solution:
        """The model solved: a point (`values`) when one was found; else `status` says whether the model is
        infeasible or a node or time limit ended the search first (limit), or the solver could not tell. `cost`
        (per column) is minimized; without it any feasible point; a MIP stops within `rel_gap` of the least cost.
        An LP's point is a vertex unless `vertex` is False (the caller wants only feasibility: interior point
        first); an LP ending with status unknown is tried again with the next algorithm."""
        lp = highspy.HighsLp()
        lp.num_col_, lp.num_row_ = self.n_cols, self.n_rows
        lp.col_cost_ = np.zeros(self.n_cols) if cost is None else np.asarray(cost, dtype=np.float64)
        lp.col_lower_ = np.concatenate(self.lower) if self.lower else np.zeros(0)
        lp.col_upper_ = np.concatenate(self.upper) if self.upper else np.zeros(0)
        lp.row_lower_ = np.concatenate(self.row_lower) if self.row_lower else np.zeros(0)
        lp.row_upper_ = np.concatenate(self.row_upper) if self.row_upper else np.zeros(0)
        rows, cols, vals = (np.concatenate(x) for x in zip(*self.entries)) if self.entries else (np.zeros(0, np.int64),) * 3
        order = np.lexsort((cols, rows))
        lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
        lp.a_matrix_.start_ = np.searchsorted(rows[order], np.arange(self.n_rows + 1))
        lp.a_matrix_.index_ = cols[order]
        lp.a_matrix_.value_ = vals[order]
        mip = not relax and bool(np.concatenate(self.integer).any()) if self.integer else False
        if mip:
            lp.integrality_ = [highspy.HighsVarType.kInteger if i else highspy.HighsVarType.kContinuous
                               for i in np.concatenate(self.integer)]
        for retry in ({},) if mip else LP_TRIES if vertex else FEASIBILITY_TRIES:
            h = milp.highs_model()
            h.passModel(lp)
            sol = milp.highs(h, mip=mip, max_nodes=max_nodes, time_limit_s=time_limit_s, rel_gap=rel_gap,
                             options=retry)
            if sol.status != "unknown":
                break
        return sol
