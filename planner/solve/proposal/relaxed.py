"""The continuous relaxation of Eq. (4): fractional pipelines, every cell on its cheapest scheme, t[N][L'] for
every L' from one bisection vectorised over L' and cells."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hydraplan.core.sync import BACKWARD_SHARE, end_to_end_s
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
    # need() is the hot loop: 25 calls over (frontier, pair), ~10^6 entries. Laid out frontier first, so the
    # per-pair tau broadcasts along rows and the minimum over the frontier is one vectorized pass; every step works
    # in place and is the same operation as core.sync.propagation_budget_s and the division, so results are identical
    Ap, Bp, Fp, Tp = (np.take(x.T, cidx, axis=1) for x in (Af, Bf, Ff, Tf))
    Tp2 = 2.0 * Tp
    t, slack = np.empty(Ap.shape), np.empty(Ap.shape)
    valid, cond = np.empty(Ap.shape, dtype=bool), np.empty(Ap.shape, dtype=bool)

    def need(tau: np.ndarray) -> np.ndarray:
        """GPUs each (frontier scheme, pair)'s cell needs to finish within its prefix's tau (its propagation budget
        for it, -inf where even an instant pipeline misses tau); inf where it cannot (the work W > 0 over 0)."""
        y = np.repeat(tau, per_j)[None, :]
        np.greater_equal(y, Tp2, out=valid)
        np.subtract(y, Tp, out=t)
        np.divide(t, BACKWARD_SHARE, out=t)
        np.minimum(y, t, out=t)
        np.subtract(t, Bp, out=slack)
        np.logical_and(valid, np.greater(slack, 0, out=cond), out=valid)
        np.logical_and(valid, np.less_equal(Fp, t, out=cond), out=valid)
        with np.errstate(divide="ignore"):
            return np.divide(Ap, np.where(valid, slack, 0.0), out=t)

    def total(tau: np.ndarray) -> np.ndarray:
        return np.add.reduceat(need(tau).min(axis=0), start)

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
    f = n.argmin(axis=0)
    k = idx[cidx, f]
    scheme = np.full((M, M), -1)
    share = np.zeros((M, M))
    scheme[jidx, cidx] = k
    share[jidx, cidx] = n[f, np.arange(len(f))] / cells.gpus[k]
    return RelaxedSolution(latency=hi, scheme=scheme, share=share)
