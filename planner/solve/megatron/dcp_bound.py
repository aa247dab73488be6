"""A lower bound on Megatron's dynamic-CP executor (core.executors.DynamicCP) raised by integrality: the linear
relaxation of what every schedule of M micro-batches finishing by T must satisfy, bisected over T for each M.

A schedule of M micro-batches that ends by T, read as x_ik (sequence i in a pack of block size k) and y_k (packs of
size k over all micro-batches), satisfies, with T' = T - (M - 1) c_min (a rank runs a pack in each of the M
micro-batches, one after another, each taking at least the cheapest constant c_min, so no pack takes longer than
T'), w_ik the per-rank work of sequence i on size k (a L^2 + b L of <tp,1,k>), c_k its constant and H_k = min(k x
max_seqlen_per_dp_cp_rank, MaxLen of <tp,1,k>) the tokens a pack of size k may hold:

1. each sequence in one pack: sum_k x_ik = 1, and x_ik = 0 unless it fits size k alone (core.executors
   DynamicCP.fits) and w_ik + c_k <= T' (its pack takes at least that; padding only adds);
2. the blocks of each micro-batch tile the N ranks: sum_k k y_k = M N, and y_k <= M N / k;
3. no pack empty: y_k <= sum_i x_ik; with `max_num_seqs` S, at most S sequences a pack: sum_i x_ik <= S y_k;
4. a pack's tokens within H_k and its time within T': sum_i L_i x_ik <= H_k y_k and sum_i w_ik x_ik <= (T' - c_k) y_k
   (the sums of these per-pack limits over the packs of size k);
5. integrality, per pack: at most j sequences each taking more than 1/(j + 1) of a pack's room (T' - c_k) or tokens
   (H_k), for j = 1, 2, 3 (j + 1 of them would exceed it): sum over those i of x_ik <= j y_k;
6. every rank busy at most T: sum_ik k w_ik x_ik + sum_k k c_k y_k <= N T (each pack is on k ranks).

So no schedule of M micro-batches ends by a T at which this linear program has no point; each condition only loosens
as T grows, so the least such T is found by bisection (HiGHS proving infeasibility; a T it cannot decide counts as
feasible, so the bound stays valid). The bound is the smallest over the micro-batch counts a schedule may have, never
below core.executors.dynamic_cp_lower_bound. It costs linear programs (tens of milliseconds a batch): the benches
report it; the scheduler uses the core's closed-form bound.
"""

from __future__ import annotations

import math

import numpy as np

from hydraplan.core.executors import DynamicCP, dynamic_cp_fewest_microbatches, dynamic_cp_lower_bound
from hydraplan.solve.highs import SparseModel

STEPS = 24  # bisection steps per micro-batch count
BIG = (1, 2, 3)  # the integrality rows: at most j of the sequences taking over 1 / (j + 1) of a pack
SCALE = 1e3  # seconds as milliseconds in the program (HiGHS' tolerances are absolute)


def dynamic_cp_lp_bound(target: DynamicCP, lengths: np.ndarray) -> float:
    """No schedule of the executor runs the batch faster (module docstring); inf when none can run it."""
    lengths = np.asarray(lengths, dtype=np.int64)
    base = dynamic_cp_lower_bound(target, lengths)
    if not math.isfinite(base):
        return base
    c_min = float(target.coef[:, 2].min())
    fewest = dynamic_cp_fewest_microbatches(target, lengths)
    step = target.vpp_group or 1
    best = math.inf
    m = fewest
    while m <= lengths.size:
        lo = base + (m - fewest) * c_min  # the core bound, and every further micro-batch's constant on every rank
        if lo >= best:
            break
        hi = max(lo, 1e-9) * 2
        while not _feasible(target, lengths, m, hi):
            lo, hi = hi, hi * 2
            if lo >= best or hi > 1e6:
                break
        else:
            for _ in range(STEPS):
                mid = (lo + hi) / 2
                if _feasible(target, lengths, m, mid):
                    hi = mid
                else:
                    lo = mid
            best = min(best, lo)
        m += step
    return max(base, best)


def _feasible(target: DynamicCP, lengths: np.ndarray, m: int, T: float) -> bool:
    """Whether the program of m micro-batches ending by T (module docstring) may have a point."""
    n, N, K = lengths.size, target.dpcp, len(target.cps)
    ks = np.asarray(target.cps, dtype=np.float64)
    w = target.seq_costs(lengths) * SCALE  # (K, n)
    c = target.coef[:, 2] * SCALE
    t = T * SCALE
    room = t - (m - 1) * c.min() - c  # per size: a pack's time left after its constant
    hold = np.minimum(ks * target.max_seqlen_per_rank, np.asarray(target.max_lens, dtype=np.float64))
    allowed = target.fits(lengths) & (w <= room[:, None])
    if not allowed.any(axis=0).all():
        return False
    kk, ii = np.nonzero(allowed)
    L = lengths[ii].astype(np.float64)
    wx = w[kk, ii]
    model = SparseModel()
    x = model.add_vars(kk.size, 0.0, 1.0)
    y = model.add_vars(K, 0.0, m * N / ks)
    rows_y = np.arange(K)
    model.add_rows(n, ii, x, np.ones(kk.size), 1.0, 1.0)  # 1
    model.add_rows(1, np.zeros(K), y, ks, m * N, m * N)  # 2

    def per_size(coef_y: np.ndarray, coef_x: np.ndarray, sel: np.ndarray | None = None) -> None:
        """K rows: coef_y[k] y_k + sum over the selected (i, k) of coef_x x_ik <= 0."""
        s = np.ones(kk.size, dtype=bool) if sel is None else sel
        model.add_rows(K, np.concatenate([rows_y, kk[s]]), np.concatenate([y, x[s]]),
                       np.concatenate([coef_y, coef_x[s]]), upper=0.0)

    per_size(np.ones(K), -np.ones(kk.size))  # 3: no pack empty
    if target.max_num_seqs is not None:
        per_size(-np.full(K, float(target.max_num_seqs)), np.ones(kk.size))
    per_size(-hold, L)  # 4
    per_size(-room, wx)
    for j in BIG:  # 5
        per_size(-np.full(K, float(j)), np.ones(kk.size), (wx > room[kk] / (j + 1)) | (L > hold[kk] / (j + 1)))
    model.add_rows(1, np.zeros(kk.size + K), np.concatenate([x, y]), np.concatenate([ks[kk] * wx, ks * c]),
                   upper=N * t)  # 6
    return model.solve().status != "infeasible"
