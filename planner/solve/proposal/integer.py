"""The integer interval DP of Eq. (4): for a latency tau the fewest GPUs meeting it is a shortest path over
cell boundaries, and the least tau that fits N GPUs is found by bisection."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hydraplan.core.sync import propagation_budget_s
from hydraplan.solve.proposal.cells import CellCosts, best_homogeneous


@dataclass(frozen=True)
class IntegerSolution:
    latency: float
    intervals: tuple[tuple[int, int, int, int], ...]  # (first cell, end cell exclusive, scheme, pipelines)

    def pipelines(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for _, _, k, d in self.intervals:
            out[k] = out.get(k, 0) + d
        return out


def _dominated_schemes(cells: CellCosts) -> np.ndarray:
    """Schemes no interval would ever prefer: another needs no more GPUs, work, bubble, floor and transfer in
    every cell, and holds every cell it holds (exact ties: the later scheme goes)."""
    def le(x: np.ndarray) -> np.ndarray:  # le[k2, k] = x[:, k2] <= x[:, k] in every cell
        return np.all(x[:, :, None] <= x[:, None, :], axis=0)

    infeasible = ~cells.feasible
    weak = (le(cells.work) & le(cells.bubble) & le(cells.floor) & le(infeasible) & le(cells.transfer[None, :])
            & (cells.gpus[:, None] <= cells.gpus[None, :]))
    K = len(cells.gpus)
    equal = weak & weak.T
    beats = weak & (~equal | (np.arange(K)[:, None] < np.arange(K)[None, :]))
    np.fill_diagonal(beats, False)
    return beats.any(axis=0)


class _IntervalTable:
    """Work of every interval (i, j] on every non-dominated scheme, flattened by end cell j, so a
    latency probe is a handful of whole-array numpy passes plus an O(M^2) min-plus sweep."""

    def __init__(self, cells: CellCosts):
        M = cells.n_cells
        self.cells = cells
        self.active = np.flatnonzero(~_dominated_schemes(cells))
        Wc = np.vstack([np.zeros(len(self.active)), np.cumsum(cells.work[:, self.active], axis=0)])
        self.offset = np.r_[0, np.cumsum(np.arange(1, M + 1))]
        jidx = np.repeat(np.arange(1, M + 1), np.arange(1, M + 1))
        iidx = np.arange(self.offset[-1]) - self.offset[jidx - 1]
        wd = np.maximum(Wc[jidx] - Wc[iidx], 1e-300)
        wd[~cells.feasible[jidx - 1][:, self.active]] = np.inf
        self.work = wd
        self.bubble = cells.bubble[:, self.active]
        self.floor = cells.floor[:, self.active]
        self.g = cells.gpus[self.active].astype(np.float64)
        self.transfer = cells.transfer[self.active]

    def pipelines(self, tau: float) -> np.ndarray:
        """d per (interval, scheme): fewest pipelines meeting tau (inf if none can: bubble or floor above the
        scheme's propagation budget for tau)."""
        budget = propagation_budget_s(self.transfer, tau)
        slack = np.where(self.floor <= budget, np.maximum(budget - self.bubble, 0.0), 0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            d = np.divide(self.work, np.repeat(slack, np.arange(1, len(slack) + 1), axis=0))
        return np.ceil(d, out=d)  # >= 1: every cell holds work, so W > 0

    def probe(self, tau: float, gpus: int) -> IntegerSolution | None:
        """Shortest path over cell boundaries: the interval solution within tau using the fewest GPUs,
        or None when even that needs more than `gpus`."""
        cost = self.pipelines(tau)
        cost *= self.g
        kbest = cost.argmin(axis=1)
        need = cost[np.arange(len(kbest)), kbest]
        M = len(self.offset) - 1
        G = np.full(M + 1, np.inf)
        G[0] = 0.0
        prev = np.zeros(M + 1, dtype=np.int64)
        for j in range(1, M + 1):
            total = G[:j] + need[self.offset[j - 1]: self.offset[j]]
            prev[j] = int(total.argmin())
            G[j] = total[prev[j]]
        if not G[M] <= gpus:
            return None
        intervals = []
        j = M
        while j > 0:
            i = int(prev[j])
            row = self.offset[j - 1] + i
            k = int(kbest[row])
            intervals.append((i, j, int(self.active[k]), int(round(cost[row, k] / self.g[k]))))
            j = i
        intervals.reverse()
        latency = max(self.cells.interval_time(i, j, k, d) for i, j, k, d in intervals)
        return IntegerSolution(latency=latency, intervals=tuple(intervals))


def solve_integer(cells: CellCosts, gpus: int, lower: float = 0.0, upper: float | None = None,
                  rel_tol: float = 1e-9) -> IntegerSolution | None:
    """Optimum of Eq. (4) for L (all cells), to within rel_tol of the latency: bisection on tau between
    a lower bound (e.g. the relaxed optimum) and a feasible latency (e.g. the homogeneous one). Every
    feasible probe tightens the upper end to the latency its solution actually reaches."""
    table = _IntervalTable(cells)
    if upper is None:
        homo = best_homogeneous(cells, gpus)
        if homo is None:
            return None
        upper = homo[2]
    best = table.probe(upper * (1 + 1e-12), gpus)
    if best is None:
        return None
    hi, lo = best.latency, lower
    while hi - lo > rel_tol * hi:
        mid = 0.5 * (lo + hi)
        found = table.probe(mid, gpus)
        if found is None:
            lo = mid
        else:
            best, hi = found, min(found.latency, mid)
    return best
