"""The continuous relaxation of Eq. (4): fractional pipelines, every cell on its cheapest scheme, t[N][L'] for
every L' from one bisection vectorised over L' and cells."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hydraplan.core.sync import end_to_end_s, propagation_budget_s
from hydraplan.solve.proposal.cells import CellCosts


@dataclass(frozen=True)
class RelaxedSolution:
    """Relaxed optimum for every prefix L' = hi[j]: latency[j], and per cell c <= j its scheme and
    fractional pipelines (scheme[j, c], share[j, c]; -1 / 0 beyond j)."""

    latency: np.ndarray  # (M,)
    scheme: np.ndarray  # (M, M) int
    share: np.ndarray  # (M, M) float pipelines


def _frontier(cells: CellCosts) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per cell, the schemes not beaten on all of GPU-work g*W, bubble B, floor F and transfer t (exact ties:
    the lower index stays): index, g*W, B, F and t, padded with -1 / inf (t: 0) to the longest frontier."""
    A = np.where(cells.feasible, cells.work * cells.gpus, np.inf)
    B = np.where(cells.feasible, cells.bubble, np.inf)
    Fl = np.where(cells.feasible, cells.floor, np.inf)
    K = A.shape[1]
    a2, a1 = A[:, :, None], A[:, None, :]  # [c, k2, k]: does k2 beat k?
    b2, b1 = B[:, :, None], B[:, None, :]
    f2, f1 = Fl[:, :, None], Fl[:, None, :]
    t2, t1 = cells.transfer[None, :, None], cells.transfer[None, None, :]
    earlier = np.arange(K)[:, None] < np.arange(K)[None, :]
    beats = ((a2 <= a1) & (b2 <= b1) & (f2 <= f1) & (t2 <= t1)
             & ((a2 < a1) | (b2 < b1) | (f2 < f1) | (t2 < t1) | earlier) & np.isfinite(a2))
    keep = np.isfinite(A) & ~beats.any(axis=1)
    F = max(1, int(keep.sum(axis=1).max()))
    order = np.argsort(~keep, axis=1, kind="stable")[:, :F]
    kept = np.take_along_axis(keep, order, 1)
    idx = np.where(kept, order, -1)
    Af = np.where(kept, np.take_along_axis(A, order, 1), np.inf)
    Bf = np.where(kept, np.take_along_axis(B, order, 1), np.inf)
    Ff = np.where(kept, np.take_along_axis(Fl, order, 1), np.inf)
    Tf = np.where(kept, cells.transfer[order], 0.0)
    return idx, Af, Bf, Ff, Tf


def solve_relaxed(cells: CellCosts, gpus: int, rel_tol: float = 1e-6) -> RelaxedSolution:
    """Relaxed t[N][L'] for every L' at once: bisection on tau, vectorised over the (L', cell <= L')
    pairs and each cell's frontier schemes."""
    M = cells.n_cells
    idx, Af, Bf, Ff, Tf = _frontier(cells)
    per_j = np.arange(1, M + 1)
    start = np.r_[0, np.cumsum(per_j)[:-1]]
    jidx = np.repeat(np.arange(M), per_j)
    cidx = np.arange(jidx.size) - start[jidx]
    Ap, Bp, Fp, Tp = Af[cidx], Bf[cidx], Ff[cidx], Tf[cidx]

    def need(tau: np.ndarray) -> np.ndarray:
        """GPUs each pair's cell needs on each frontier scheme to finish within its prefix's tau (its
        propagation budget for it)."""
        t = propagation_budget_s(Tp, np.repeat(tau, per_j)[:, None])
        slack = t - Bp
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where((slack > 0) & (Fp <= t), Ap / slack, np.inf)

    def total(tau: np.ndarray) -> np.ndarray:
        return np.add.reduceat(need(tau).min(axis=1), start)

    lower = np.maximum.accumulate(np.asarray(end_to_end_s(Tf, np.maximum(Bf, Ff))).min(axis=1))
    lo = lower.copy()
    hi = lower + np.maximum(np.cumsum(Af.min(axis=1)) / gpus, 1e-12 + 1e-9 * lower)
    while True:
        bad = total(hi) > gpus
        if not bad.any():
            break
        lo = np.where(bad, hi, lo)
        hi = np.where(bad, lower + 2 * (hi - lower), hi)
    while np.any(hi - lo > rel_tol * hi):
        mid = 0.5 * (lo + hi)
        ok = total(mid) <= gpus
        hi = np.where(ok, mid, hi)
        lo = np.where(ok, lo, mid)
    n = need(hi)
    f = n.argmin(axis=1)
    k = idx[cidx, f]
    scheme = np.full((M, M), -1)
    share = np.zeros((M, M))
    scheme[jidx, cidx] = k
    share[jidx, cidx] = n[np.arange(len(f)), f] / cells.gpus[k]
    return RelaxedSolution(latency=hi, scheme=scheme, share=share)
