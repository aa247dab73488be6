"""Distribution-aware strategy proposal (Hydraulis §7): the interval DP of Eq. (4), its continuous
relaxation, rounding to integer strategies, and the homogeneous fallback.

Cost model (the canonical estimate of docs/formats.md, taken in expectation over the dataset). The length
distribution, truncated to the context length L, is scaled to a nominal batch of `tokens_per_iter` tokens
(default 4096 per GPU), so a length bin holds a fractional expected number of sequences. Lengths are
binned on a 128-token grid; empty bins merge into the next non-empty one (an adaptive grid that is never
coarser than 128 tokens where data exists) and the last cell ends at L. An interval of cells run by d
pipelines of scheme P costs

    latency = max(W / d + B, F),    W = sum_seq (a*l^2 + b*l) + c * MB,    B = (pp - 1) * t(longest micro-batch),
                                    F = pp * T(l_max, P)

Micro-batch model, the packer's (planner/packing.py): on pp=1 every packing into V micro-batches costs
S + V*c, so the packer fills them to MaxLen and a sequence of length l adds l/MaxLen micro-batches (MB).
On pp>1 more micro-batches shrink the bubble: sequences shorter than UtilLen(P) are packed into
UtilLen-token micro-batches, longer ones run alone, so a sequence adds min(l, UtilLen)/UtilLen micro-batches
and the longest micro-batch of an interval with longest sequence l_max holds m = max(l_max, UtilLen) tokens
of such sequences: t = a*l_max*m + b*m + c, which is T(l_max, P) whenever l_max >= UtilLen. W is split over the
d pipelines; the bubble B is not. Nor is a sequence: the pipeline holding the interval's longest one takes
at least its micro-batch alone, F = pp * T(l_max, P) (sum + (pp-1)*max >= pp*max). Without this floor a
pp=1 interval's longest sequence would cost only its share of W, and the long tail would go to many narrow
pipelines on which one long sequence alone outlasts the iteration. The DP's value is the iteration
latency of the nominal batch (restricted to lengths <= L'); `expected_s_per_token` divides it by that
batch's tokens.

Algorithms. Eq. (4) minimises the largest interval latency subject to sum(d * GPUs) <= N. For a target
latency tau an interval needs F <= tau and d = ceil(W / (tau - B)) pipelines, so the fewest GPUs that
meet tau is a shortest path over cell boundaries; t[N][L] is the smallest tau whose path fits in N GPUs
(bisection). This computes exactly Eq. (4) with O(M^2 K) work per probe instead of a table over every
n <= N. In the continuous relaxation (fractional n and d) d = W / (tau - B) where F <= tau, and splitting
an interval never hurts (the lower part's bubble and floor are no larger), so every cell takes its own
cheapest scheme and t[N][L'] for every L' comes from one bisection vectorised over L' and cells.
Rounding (paper Fig. 12: "rounding requires scaling"): each scheme keeps its cells, and on d instead of x
fractional pipelines a cell finishes at max(B + (tau - B) * x / d, F); the integer d per scheme
minimising the largest such latency within N GPUs is found exactly (it covers every floor/ceil
combination of x), schemes holding under one pipeline may be dropped (their cells move, if need be to a
scheme whose floor exceeds tau), and leftover GPUs go to the slowest scheme that fits. The best rounding
per L' is the optimum for L'; the candidates are their union, plus the integer optimum for L and the
homogeneous fallback.

Objective (docs/formats.md, "End-to-end estimate"). With the end-to-end objective every latency above is
an iteration time: a pipeline of scheme k with propagation p > 0 takes f_k(p) = max(2 t_k, t_k + 2p/3, p),
t_k its one-direction LNK transfer (hydraplan.sync), so many narrow pipelines pay for their large parameter
slices. f_k is increasing, so a budget tau on iteration time is the budget g_k(tau) = min(tau, 1.5 (tau -
t_k)) on scheme k's propagation (no pipeline of k meets tau < 2 t_k): every probe, bisection and rounding
step above runs unchanged on per-scheme budgets g_k(tau) and reports f_k of the latencies it reaches, and
dominance between schemes also requires no larger t. The propagation objective is t = 0 (f and g identity).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from hydraplan.core.cluster import for_gpus
from hydraplan.core.cost import seq_cost
from hydraplan.core.errors import UserError
from hydraplan.core.schema import Candidate, PipelineSpec, Profile, Scheme, Strategies
from hydraplan.core.sync import end_to_end_s, objective_transfer_s, propagation_budget_s
from hydraplan.solve.placement import place_ranks

__all__ = ["CellCosts", "IntegerSolution", "RelaxedSolution", "build_cells", "solve_integer", "solve_relaxed",
           "round_relaxed", "best_homogeneous", "propose", "place_ranks", "strategy_label"]

LENGTH_STEP = 128
TOKENS_PER_GPU = 4096
# Every iteration bounds every candidate before solving the promising ones (planner/iterate.py), O(sequences)
# work per candidate: by default candidates are kept while candidates x expected sequences per iteration stays
# within this (every candidate up to ~4000 sequences per iteration, the 37 most useful at 8192 GPUs / 25M tokens)
CANDIDATE_SEQUENCES = 1_000_000


class _HasHistogram(Protocol):
    name: str

    def histogram(self) -> tuple[np.ndarray, np.ndarray]: ...


# --------------------------------------------------------------------------------------- cell costs
@dataclass(frozen=True)
class CellCosts:
    """Per-cell, per-scheme costs of the nominal batch; cell j covers lengths (hi[j-1], hi[j]]."""

    schemes: tuple[Scheme, ...]
    hi: np.ndarray  # (M,) upper boundary of each cell (the L' of Problem 1); hi[-1] == context_len
    lmax: np.ndarray  # (M,) longest length present in the cell
    tokens: np.ndarray  # (M,) expected tokens of the nominal batch in the cell
    count: np.ndarray  # (M,) expected sequences of the nominal batch in the cell
    work: np.ndarray  # (M, K) W of the cell on one pipeline of each scheme
    bubble: np.ndarray  # (M, K) (pp-1) * longest micro-batch time
    floor: np.ndarray  # (M, K) pp * T(lmax): the pipeline holding the cell's longest sequence takes at least this
    feasible: np.ndarray  # (M, K) MaxLen(P) >= hi
    gpus: np.ndarray  # (K,)
    transfer: np.ndarray | None = None  # (K,) one-direction LNK seconds per scheme (None: the propagation objective)

    def __post_init__(self) -> None:
        if self.transfer is None:
            object.__setattr__(self, "transfer", np.zeros(len(self.schemes)))

    @property
    def n_cells(self) -> int:
        return len(self.hi)

    def interval_latency(self, i: int, j: int, k: int, d: float) -> float:
        """Latency of cells i..j-1 (0-based, j exclusive) on d pipelines of scheme k."""
        return float(max(self.work[i:j, k].sum() / d + self.bubble[j - 1, k], self.floor[j - 1, k]))

    def interval_time(self, i: int, j: int, k: int, d: float) -> float:
        """The same in the objective: the end-to-end time of those pipelines (their propagation when t = 0)."""
        return float(end_to_end_s(self.transfer[k], self.interval_latency(i, j, k, d)))


def build_cells(schemes: list[Scheme], values: np.ndarray, counts: np.ndarray, context_len: int,
                tokens_per_iter: float, step: int = LENGTH_STEP, transfer: np.ndarray | None = None) -> CellCosts:
    """Bin a length histogram (already truncated to context_len) and cost every cell on every scheme;
    `transfer` (per scheme) makes every latency end to end."""
    values = np.asarray(values, dtype=np.int64)
    counts = np.asarray(counts, dtype=np.float64)
    keep = counts > 0
    values, counts = values[keep], counts[keep]
    order = np.argsort(values)
    values, counts = values[order], counts[order]
    counts = counts * (tokens_per_iter / float((values * counts).sum()))
    bins = np.minimum((values + step - 1) // step * step, context_len)
    starts = np.flatnonzero(np.r_[True, bins[1:] != bins[:-1]])
    hi = bins[starts].copy()
    hi[-1] = context_len
    lmax = values[np.r_[starts[1:] - 1, len(values) - 1]]
    lv = values.astype(np.float64)
    s1 = np.add.reduceat(counts * lv, starts)

    c = np.array([s.time.c for s in schemes])
    util = np.array([s.max_len if s.pp == 1 else min(s.util_len, s.max_len) for s in schemes], dtype=np.float64)
    pp = np.array([s.pp for s in schemes], dtype=np.float64)
    maxlen = np.array([s.max_len for s in schemes])
    seq = np.stack([seq_cost(s, values) for s in schemes], axis=1)  # canonical a*l^2 + b*l, (lengths, K)
    mb = np.minimum(lv[:, None], util) / util
    work = np.add.reduceat(counts[:, None] * (seq + mb * c), starts, axis=0)
    lm = lmax.astype(np.float64)[:, None]
    longest = np.stack([seq_cost(s, lmax) for s in schemes], axis=1)
    bubble = (pp - 1) * (np.maximum(lm, util) / lm * longest + c)  # m/l_max sequences of length l_max, + c
    return CellCosts(schemes=tuple(schemes), hi=hi, lmax=lmax, tokens=s1, count=np.add.reduceat(counts, starts),
                     work=work, bubble=bubble, floor=pp * (longest + c),
                     feasible=maxlen[None, :] >= hi[:, None], gpus=np.array([s.gpus for s in schemes]),
                     transfer=None if transfer is None else np.asarray(transfer, dtype=np.float64))


# ------------------------------------------------------------------------------ integer DP (Eq. 4)
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


# --------------------------------------------------------------------------------- relaxed DP
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


# ------------------------------------------------------------------------------------- rounding
@dataclass(frozen=True)
class Rounded:
    counts: tuple[tuple[int, int], ...]  # sorted (scheme index, pipelines)
    latency: float


class _Scaled:
    """Latency of an integer strategy whose schemes keep the relaxed optimum's cells (Fig. 12 scaling):
    a cell of scheme k on x_k fractional pipelines meets tau with slack tau - B; on d_k pipelines it
    finishes at max(B + (tau - B) * r, F), r = x_k / d_k. The worst cell of scheme k is therefore the one
    with the smallest bubble when r >= 1 and the largest when r < 1, or its largest floor (which no number
    of pipelines lowers), so per-scheme latency is closed-form. tau is per scheme (its propagation budget for
    the relaxed end-to-end optimum); the latencies compared are end to end, f_k of the propagation."""

    def __init__(self, gpus: np.ndarray, tau: np.ndarray, transfer: np.ndarray, mapping: np.ndarray, W: np.ndarray,
                 B: np.ndarray, F: np.ndarray):
        """tau, transfer: per scheme; mapping: scheme per cell; W, B, F: each cell's work, bubble and floor on
        its scheme."""
        present = np.bincount(mapping, minlength=len(gpus)) > 0
        self.schemes = np.flatnonzero(present)
        col = (np.cumsum(present) - 1)[mapping]
        S = len(self.schemes)
        self.load = np.bincount(col, weights=W / (tau[mapping] - B), minlength=S)
        self.bmin = np.full(S, np.inf)
        self.bmax = np.full(S, -np.inf)
        self.fmax = np.full(S, -np.inf)
        np.minimum.at(self.bmin, col, B)
        np.maximum.at(self.bmax, col, B)
        np.maximum.at(self.fmax, col, F)
        self.tau = tau[self.schemes]
        self.transfer = transfer[self.schemes]
        self.g = gpus[self.schemes]

    def per_scheme(self, d: np.ndarray) -> np.ndarray:
        r = self.load / d
        prop = np.maximum(self.tau * r - (r - 1) * np.where(r >= 1, self.bmin, self.bmax), self.fmax)
        return np.asarray(end_to_end_s(self.transfer, prop))

    def pipelines_for(self, T: np.ndarray) -> np.ndarray:
        """Fewest pipelines per scheme (columns) meeting each latency T (rows): inverts per_scheme."""
        T = np.asarray(propagation_budget_s(self.transfer, T[:, None]))
        r = np.where(T >= self.tau, 1 + (T - self.tau) / (self.tau - self.bmin),
                     1 - (self.tau - T) / (self.tau - self.bmax))
        ok = (r > 0) & (self.fmax <= T * (1 + 1e-12))
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.maximum(np.ceil(np.where(ok, self.load / (r * (1 + 1e-12)), np.inf)), 1)

    def allocate(self, gpus: int, beat: float = np.inf) -> np.ndarray | None:
        """Integer pipelines per scheme minimising the largest scaled latency within `gpus` GPUs (exact:
        the optimum is one of the values per_scheme takes at integer d), then leftover GPUs go one
        pipeline at a time to the slowest scheme that still fits. None if nothing fits or if no
        allocation can reach `beat` or less."""
        S = len(self.schemes)
        cap = (gpus - self.g.sum() + self.g) // self.g  # every other scheme keeps one pipeline
        if (cap < 1).any():
            return None
        bound = self.per_scheme(cap).max()  # no scheme does better than on its cap
        if bound > beat:
            return None
        ks = np.repeat(np.arange(S), cap)
        ds = (np.arange(len(ks)) - np.repeat(np.cumsum(cap) - cap, cap) + 1).astype(np.float64)
        r = self.load[ks] / ds
        values = np.maximum(self.tau[ks] * r - (r - 1) * np.where(r >= 1, self.bmin[ks], self.bmax[ks]), self.fmax[ks])
        values = np.asarray(end_to_end_s(self.transfer[ks], values))
        values = values[values >= bound]
        need = self.pipelines_for(values)
        fits = (need * self.g).sum(axis=1) <= gpus
        if not fits.any():
            return None
        d = need[fits][values[fits].argmin()]
        while True:
            room = self.g <= gpus - (d * self.g).sum()
            if not room.any():
                return d
            d[int(np.where(room, self.per_scheme(d), -np.inf).argmax())] += 1


def round_relaxed(cells: CellCosts, relaxed: RelaxedSolution, j: int, gpus: int) -> Rounded | None:
    """Best integer strategy near the relaxed optimum for L' = hi[j]. Each scheme keeps its cells and
    gets the integer pipeline counts that minimise the scaled latency within N GPUs (every floor/ceil
    combination of the fractional counts is among those considered); a scheme holding less than one
    pipeline may instead be dropped, its cells moving to the kept scheme that meets the relaxed latency
    with the fewest GPUs, or, when no kept scheme's floor is that low, to the one with the lowest floor
    (rounding raises the latency anyway: the relaxation spreads a long cell's few sequences over fractions
    of wide pipelines, and one whole pipeline of the widest is often more than N allows next to the rest).
    The best of these variants wins (ties: fewer GPUs)."""
    tau = np.asarray(propagation_budget_s(cells.transfer, float(relaxed.latency[j])))
    cs = relaxed.scheme[j, : j + 1]
    x = np.bincount(cs, weights=relaxed.share[j, : j + 1], minlength=len(cells.schemes))
    used = np.flatnonzero(x > 0)
    small = [k for k in used if x[k] < 1]
    best = _best_rounding(cells, j, tau, cs, used, small, gpus)
    if best is None:  # the kept schemes do not fit in N GPUs together: drop any, not only small ones
        best = _best_rounding(cells, j, tau, cs, used, list(used), gpus)
    return best


def _subsets(items: list) -> itertools.chain:
    """All subsets, smallest first."""
    return itertools.chain.from_iterable(itertools.combinations(items, n) for n in range(len(items) + 1))


def _best_rounding(cells: CellCosts, j: int, tau: np.ndarray, cs: np.ndarray, used: np.ndarray, droppable: list,
                   gpus: int) -> Rounded | None:
    """Best allocation over every way of dropping some of `droppable` (their cells move to a kept scheme).
    The cells that may move are costed on every used scheme once; a variant only masks the dropped ones.
    tau: each scheme's propagation budget."""
    g = cells.gpus
    c = np.arange(j + 1)
    base = (cells.work[c, cs], cells.bubble[c, cs], cells.floor[c, cs])
    dropped = np.zeros(len(g), dtype=bool)
    dropped[droppable] = True
    rows = np.flatnonzero(dropped[cs])
    sub = np.ix_(rows, used)
    Wu, Bu, Fu = cells.work[sub], cells.bubble[sub], cells.floor[sub]
    slack = tau[used] - Bu
    floor_u = np.where(cells.feasible[sub] & (slack > 0), Fu, np.inf)
    with np.errstate(divide="ignore", invalid="ignore"):
        need_u = np.where(floor_u <= tau[used], g[used] * Wu / slack, np.inf)
    best: Rounded | None = None
    best_key: tuple | None = None
    for drop in _subsets(droppable):
        dropped[:] = False
        dropped[list(drop)] = True
        kept = ~dropped[used]
        if not kept.any():
            continue
        mapping = cs
        W, B, F = base
        if drop:
            sel = dropped[cs[rows]]
            floor = np.where(kept, floor_u[sel], np.inf)
            if not np.isfinite(floor.min(axis=1)).all():
                continue
            need = np.where(kept, need_u[sel], np.inf)
            col = np.where(np.isfinite(need.min(axis=1)), need.argmin(axis=1), floor.argmin(axis=1))
            moved, r = rows[sel], np.arange(len(col))
            mapping, W, B, F = cs.copy(), W.copy(), B.copy(), F.copy()
            mapping[moved] = used[col]
            W[moved], B[moved], F[moved] = Wu[sel][r, col], Bu[sel][r, col], Fu[sel][r, col]
        scaled = _Scaled(g, tau, cells.transfer, mapping, W, B, F)
        d = scaled.allocate(gpus, np.inf if best_key is None else best_key[0])
        if d is None:
            continue
        counts = tuple((int(k), int(n)) for k, n in zip(scaled.schemes, d))
        key = (float(scaled.per_scheme(d).max()), int((d * scaled.g).sum()), counts)
        if best_key is None or key < best_key:
            best, best_key = Rounded(counts, key[0]), key
    return best


def best_homogeneous(cells: CellCosts, gpus: int) -> tuple[int, int, float] | None:
    """(scheme, pipelines, latency in the objective) of the fastest single-scheme strategy that holds the
    context length."""
    best = None
    for k in np.flatnonzero(cells.feasible[-1]):
        d = gpus // int(cells.gpus[k])
        lat = cells.interval_time(0, cells.n_cells, int(k), d)
        if best is None or lat < best[2]:
            best = (int(k), d, lat)
    return best


# --------------------------------------------------------------------------------------- propose
def _histogram(data: np.ndarray | _HasHistogram, context_len: int) -> tuple[np.ndarray, np.ndarray, str | None]:
    if isinstance(data, (np.ndarray, list, tuple)):
        values, counts = np.unique(np.asarray(data, dtype=np.int64), return_counts=True)
        name = None
    else:
        values, counts = data.histogram()
        name = getattr(data, "name", None)
    values = np.minimum(np.asarray(values, dtype=np.int64), context_len)
    keep = (values > 0) & (np.asarray(counts) > 0)
    if not keep.any():
        raise UserError(f"dataset {name or '(lengths)'}: no sequence of positive length")
    return values[keep], np.asarray(counts, dtype=np.float64)[keep], name


@dataclass
class _Entry:
    counts: tuple[tuple[int, int], ...]
    latency: float
    tokens: float
    lo: int
    hi: int
    sources: list[str]
    cells: set[int]
    p_longest: float = 0.0


def propose(profile: Profile, lengths_or_dataset: np.ndarray | _HasHistogram, gpus: int, context_len: int,
            gpus_per_node: int | None = None, tokens_per_iter: int | None = None,
            max_candidates: int | None = None, objective: str = "end-to-end") -> Strategies:
    """Candidate strategies for `gpus` GPUs: the rounded relaxed optimum for every L' <= context_len,
    the integer optimum of Eq. (4) for L, and the best homogeneous strategy; ranks placed. Latencies are
    end to end (the profile's sync model) or, with objective "propagation" or no sync model, propagation.

    Every candidate is bounded on every iteration, so when the union over L' is larger than max_candidates
    (0: keep all; None: as many as CANDIDATE_SEQUENCES allows for the nominal batch) only the relaxed optima
    most likely to be needed are kept: those whose L' range most often holds an iteration's longest sequence
    (p_longest, for a nominal batch of independently drawn sequences). The integer optimum and the
    homogeneous fallback are always kept."""
    view = for_gpus(profile, gpus)
    longest = max(view.schemes, key=lambda s: (s.max_len, -s.gpus))
    if context_len > longest.max_len:
        raise UserError(f"--context-len {context_len}: no scheme of profile {profile.name} within {gpus} GPUs holds "
                        f"it; the longest supported length is {longest.max_len} ({longest.label})")
    if context_len < 1:
        raise UserError(f"--context-len must be positive (got {context_len})")
    if max_candidates is not None and max_candidates < 0:
        raise UserError(f"--max-candidates must be 0 (keep all) or a positive count (got {max_candidates})")
    if tokens_per_iter is not None and tokens_per_iter < 1:
        raise UserError(f"--tokens-per-iter must be positive (got {tokens_per_iter})")
    tokens_per_iter = tokens_per_iter or TOKENS_PER_GPU * gpus
    values, counts, name = _histogram(lengths_or_dataset, context_len)
    transfer = objective_transfer_s(profile, np.array([s.tp for s in view.schemes]),
                                    np.array([s.pp for s in view.schemes]), gpus, objective)
    cells = build_cells(list(view.schemes), values, counts, context_len, tokens_per_iter, transfer=transfer)
    tokens_cum = np.cumsum(cells.tokens)

    entries: dict[tuple[tuple[int, int], ...], _Entry] = {}

    def add(counts_: tuple[tuple[int, int], ...], latency: float, j: int, source: str) -> None:
        lo = 1 if j == 0 else int(cells.hi[j - 1]) + 1
        e = entries.get(counts_)
        if e is None:
            entries[counts_] = _Entry(counts_, latency, float(tokens_cum[j]), lo, int(cells.hi[j]), [source], {j})
            return
        e.cells.add(j)
        if source not in e.sources:
            e.sources.append(source)
        e.lo = min(e.lo, lo)
        if cells.hi[j] >= e.hi:
            e.hi, e.latency, e.tokens = int(cells.hi[j]), latency, float(tokens_cum[j])

    relaxed = solve_relaxed(cells, gpus)
    r = None
    for j in range(cells.n_cells):
        r = round_relaxed(cells, relaxed, j, gpus)
        if r is not None:
            add(r.counts, r.latency, j, "relaxed-dp")
    M = cells.n_cells
    homo = best_homogeneous(cells, gpus)
    assert homo is not None  # context_len <= the longest scheme's MaxLen was checked above
    # bisection bracket: the relaxed optimum below; above, the rounded one for L when the interval DP
    # reaches it (it usually does, and it is much tighter than the homogeneous latency), else homogeneous
    exact = None
    if r is not None and r.latency < homo[2]:
        exact = solve_integer(cells, gpus, lower=float(relaxed.latency[-1]), upper=r.latency, rel_tol=1e-3)
    exact = exact or solve_integer(cells, gpus, lower=float(relaxed.latency[-1]), upper=homo[2], rel_tol=1e-3)
    if exact is not None:
        add(tuple(sorted(exact.pipelines().items())), exact.latency, M - 1, "integer-dp")
    add(((homo[0], homo[1]),), homo[2], M - 1, "homogeneous")

    # P(an iteration's longest sequence falls in cell j), for a batch of the nominal size
    cdf = np.cumsum(cells.count) / cells.count.sum()
    p_top = np.diff(np.r_[0.0, cdf ** cells.count.sum()])
    for e in entries.values():
        e.p_longest = float(p_top[sorted(e.cells)].sum())
    kept = [e for e in entries.values() if e.sources != ["relaxed-dp"]]
    rest = sorted((e for e in entries.values() if e.sources == ["relaxed-dp"]), key=lambda e: (-e.p_longest, e.hi))
    if max_candidates is None:
        per_iteration = tokens_per_iter * counts.sum() / float((values * counts).sum())
        max_candidates = max(1, int(CANDIDATE_SEQUENCES / per_iteration))
    if max_candidates:
        rest = rest[: max(0, max_candidates - len(kept))]
    ordered = sorted(kept + rest, key=lambda e: (e.hi, e.lo, e.latency, e.counts))
    gpn = gpus_per_node or profile.gpu.gpus_per_node
    candidates = []
    for n, e in enumerate(ordered):
        specs = [PipelineSpec(tp=s.tp, pp=s.pp, cp=s.cp) for k, d in
                 sorted(e.counts, key=lambda kd: (-cells.schemes[kd[0]].gpus, cells.schemes[kd[0]].key))
                 for s in [cells.schemes[k]] * d]
        candidates.append(Candidate(
            name=f"S{n}", pipelines=place_ranks(specs, gpus, gpn),
            max_len=max(cells.schemes[k].max_len for k, _ in e.counts),
            expected_s_per_token=e.latency / e.tokens, optimal_for=(e.lo, e.hi),
            sources=e.sources, kind="homogeneous" if len(e.counts) == 1 else "heterogeneous",
            p_longest=round(e.p_longest, 6)))
    return Strategies(profile=profile.name, gpus=gpus, context_len=context_len, candidates=candidates,
                      dataset=name, tokens_per_iter=int(tokens_per_iter), length_step=LENGTH_STEP,
                      length_cells=int(M), gpus_per_node=gpn, proposed=len(entries))


def strategy_label(candidate: Candidate) -> str:
    """'2x<8,1,1> + 4x<2,2,1>' in pipeline order."""
    groups: dict[tuple[int, int, int], int] = {}
    for p in candidate.pipelines:
        groups[p.key] = groups.get(p.key, 0) + 1
    return " + ".join(f"{n}x<{t},{p},{c}>" for (t, p, c), n in groups.items())
