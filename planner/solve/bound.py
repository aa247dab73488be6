"""The any-strategy lower bound: no plan on N GPUs, whatever its strategy, runs a batch faster than this.

For a latency X the relaxation is a small MILP (HiGHS): integer pipeline counts n_P per scheme with
sum g_P n_P <= N, and a fractional assignment x_iP >= 0 of every sequence (sum_P x_iP = 1), allowed only
where l_i <= MaxLen(P) and pp_P (w_iP + c_P) <= X (w = a l^2 + b l: a sequence's micro-batch alone takes
pp_P of its time through the pipeline). Per scheme

    sum_i x_iP (w_iP + c_P l_i / MaxLen_P) <= n_P (X - (pp_P - 1) c_P)   (V >= tokens/MaxLen micro-batches)
    sum_i x_iP w_iP                        <= n_P (X - pp_P c_P)         (V >= 1)

because a pipeline's canonical time is sum_v t(m_v) + (pp-1) max_v t(m_v) >= sum w + V c + (pp-1) c; and
sum_{i big on P} x_iP <= n_P, where i is big on P when w_iP > (X - pp_P c_P) / 2: two big sequences on one
pipeline would already exceed X, so each busy pipeline holds at most one (the integrality of the long
sequences, which the fractional x would otherwise spread over many pipelines). Every
real plan of latency X satisfies them (its busy pipelines give n_P, its dispatch x), so the least feasible X,
found by bisection, is a valid bound on the best plan of any strategy.

End to end (core/sync.py): a busy pipeline of scheme P with one-direction transfer t_P and propagation
p takes max(2t, t + 2p/3, p), so it meets X when p <= min(X, 1.5 (X - t_P)) and X >= 2 t_P: the same MILP
with that propagation budget per scheme.

Sequences of equal length are interchangeable in the relaxation, so they form one item with a count; a
scheme another beats on every coefficient (no more GPUs, MaxLen no shorter, a, b, c, pp and transfer no
larger) is dropped, since swapping its pipelines for the other's keeps every constraint.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import highspy
import numpy as np

from hydraplan.core.schema import Scheme
from hydraplan.core.sync import end_to_end_s, propagation_budget_s
from hydraplan.solve.highs import run_mip

REL_TOL = 1e-3  # bisection stops when the bracket is this tight (relative)
MAX_NODES = 200  # branch-and-bound nodes per probe; a probe left open there counts as feasible (bound stays valid)


@dataclass(frozen=True)
class BoundResult:
    """The bound and the integer pipeline counts of a feasible MILP solution at (just above) it."""

    latency_s: float  # least feasible X within rel_tol: a lower bound on every plan's time
    pipelines: dict[int, int]  # scheme index (into the schemes passed) -> pipelines n_P at `feasible_s`
    feasible_s: float  # the X the pipeline counts were found for (>= latency_s, within rel_tol)
    probes: int  # MILPs solved


@dataclass(frozen=True)
class _Instance:
    lengths: np.ndarray  # (I,) distinct lengths (of a group of sequences: its longest)
    count: np.ndarray  # (I,) how many sequences have each
    keep: np.ndarray  # indices of the non-dominated schemes
    g: np.ndarray  # (K,) GPUs per pipeline
    pp: np.ndarray
    c: np.ndarray
    max_len: np.ndarray
    transfer: np.ndarray  # (K,) one-direction sync seconds (0: propagation objective)
    w: np.ndarray  # (I, K) a l^2 + b l (of a group: its mean)
    lin: np.ndarray  # (I, K) w + c l / MaxLen (of a group: its mean)
    alone: np.ndarray  # (I, K) pp (w + c) of the item's longest sequence
    w_min: np.ndarray  # (I, K) w of the item's shortest sequence
    gpus: int

    def budget(self, X: float) -> np.ndarray:
        """Propagation budget of each scheme's pipelines at end-to-end latency X (-inf: unusable)."""
        return np.asarray(propagation_budget_s(self.transfer, X))

    def floor(self) -> float:
        """The least X at which every sequence fits whole on some scheme (X where pp (w + c) fits the budget)."""
        alone = self.alone
        ok = self.lengths[:, None] <= self.max_len
        need = np.asarray(end_to_end_s(self.transfer, alone))  # budget's inverse: alone > 0
        return float(np.where(ok, need, np.inf).min(axis=1).max())

    def volume(self) -> float:
        """GPU-seconds over N: the slowest pipeline takes at least the mean of the cheapest linear loads."""
        ok = self.lengths[:, None] <= self.max_len
        per = np.where(ok, self.g * self.lin, np.inf).min(axis=1)
        return float((self.count * per).sum() / self.gpus)


def _dominated(schemes: Sequence[Scheme], transfer: np.ndarray) -> np.ndarray:
    """Schemes another needs no more GPUs than and beats (or ties) on every coefficient; exact ties keep the first."""
    keys = np.array([[s.gpus, -s.max_len, s.time.a, s.time.b, s.time.c, s.pp, t]
                     for s, t in zip(schemes, transfer, strict=True)], dtype=np.float64)
    le = np.all(keys[:, None, :] <= keys[None, :, :], axis=2)  # le[q, p]: q no worse than p everywhere
    K = len(schemes)
    eq = le & le.T
    beats = le & (~eq | (np.arange(K)[:, None] < np.arange(K)[None, :]))
    np.fill_diagonal(beats, False)
    return beats.any(axis=0)


def _instance(lengths: np.ndarray, schemes: Sequence[Scheme], gpus: int, transfer: np.ndarray | None,
              group: np.ndarray | None = None, prune: bool = True) -> _Instance:
    """The MILP's data. Items are the distinct lengths, or with `group` (a label per sequence) groups of
    sequences costed at their mean and held to their longest: no longer a relaxation then, but a smaller
    model with the same structure (solve/synthesis.py uses it to shape strategies, never as a bound).
    `prune=False` keeps dominated schemes (a given strategy's pipelines are what they are)."""
    t_all = np.zeros(len(schemes)) if transfer is None else np.asarray(transfer, dtype=np.float64)
    usable = np.array([s.gpus <= gpus for s in schemes])
    keep = np.flatnonzero(usable & ~_dominated(schemes, np.where(usable, t_all, np.inf))) if prune else np.flatnonzero(usable)
    ks = [schemes[k] for k in keep]
    lengths = np.asarray(lengths, dtype=np.int64)
    a = np.array([s.time.a for s in ks])
    b = np.array([s.time.b for s in ks])
    c = np.array([s.time.c for s in ks])
    ml = np.array([s.max_len for s in ks], dtype=np.float64)
    pp = np.array([s.pp for s in ks], dtype=np.float64)
    _, inv, count = np.unique(lengths if group is None else group, return_inverse=True, return_counts=True)
    l = lengths.astype(np.float64)[:, None]
    w_seq = (a * l + b) * l
    w = np.zeros((len(count), len(ks)))
    np.add.at(w, inv, w_seq)
    longest = np.zeros(len(count), dtype=np.int64)
    np.maximum.at(longest, inv, lengths)
    shortest = np.full(len(count), np.iinfo(np.int64).max)
    np.minimum.at(shortest, inv, lengths)
    tok = np.bincount(inv, weights=lengths.astype(np.float64))
    w /= count[:, None]
    lm = longest.astype(np.float64)[:, None]
    return _Instance(lengths=longest, count=count.astype(np.float64), keep=keep,
                     g=np.array([s.gpus for s in ks], dtype=np.float64), pp=pp, c=c, max_len=ml,
                     transfer=t_all[keep], w=w, lin=w + c * (tok / count)[:, None] / ml,
                     alone=pp * ((a * lm + b) * lm + c), w_min=(a * shortest[:, None] + b) * shortest[:, None],
                     gpus=gpus)


def _probe(inst: _Instance, X: float, minimize: bool = False, max_nodes: int | None = None,
           unknown_feasible: bool = False, time_limit_s: float | None = None, relax: bool = False,
           most: np.ndarray | None = None) -> np.ndarray | None:
    """Pipeline counts per kept scheme meeting X within N GPUs (with `minimize`, the fewest GPUs), or None when
    none do. With `max_nodes` (deterministic) a search that ends at the limit without a solution counts as
    infeasible (None: fine for shaping strategies), or with `unknown_feasible` as feasible (all-zero counts:
    what the bound needs, since treating an unproven X as feasible can only lower it). `time_limit_s` (wall
    seconds, so not deterministic: benchmarks only) ends a probe the same way. `most`: at most this many
    busy pipelines per kept scheme (a given strategy's)."""
    budget = inst.budget(X)
    ok = (inst.lengths[:, None] <= inst.max_len) & (inst.alone <= budget)
    ok &= (budget - inst.pp * inst.c > 0)
    if not ok.any(axis=1).all():
        return None
    used = np.flatnonzero(ok.any(axis=0))
    ii, kk = np.nonzero(ok[:, used])
    nx, nk, I = ii.size, used.size, len(inst.lengths)
    k_sch = used[kk]
    # rows: I item rows, then per used scheme the linear-load row, the V>=1 row and the one-big-per-pipeline
    # row, then the GPU row
    cap_lin = budget[used] - (inst.pp[used] - 1) * inst.c[used]
    cap_one = budget[used] - inst.pp[used] * inst.c[used]
    big = inst.w_min[ii, k_sch] > cap_one[kk] / 2
    rows = np.concatenate([ii, I + kk, I + nk + kk, (I + 2 * nk + kk)[big], I + np.arange(nk), I + nk + np.arange(nk),
                           I + 2 * nk + np.arange(nk), np.full(nk, I + 3 * nk)])
    cols = np.concatenate([np.arange(nx)] * 3 + [np.flatnonzero(big)] + [nx + np.arange(nk)] * 4)
    vals = np.concatenate([np.ones(nx), inst.lin[ii, k_sch], inst.w[ii, k_sch], np.ones(int(big.sum())), -cap_lin,
                           -cap_one, -np.ones(nk), inst.g[used]])
    n_rows = I + 3 * nk + 1
    order = np.argsort(rows, kind="stable")
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = nx + nk, n_rows
    lp.col_cost_ = np.r_[np.zeros(nx), inst.g[used] * float(minimize)]
    lp.col_lower_ = np.zeros(nx + nk)
    lp.col_upper_ = np.r_[inst.count[ii], np.floor(inst.gpus / inst.g[used]) if most is None else most[used]]
    lp.row_lower_ = np.r_[inst.count, np.full(3 * nk + 1, -highspy.kHighsInf)]
    lp.row_upper_ = np.r_[inst.count, np.zeros(3 * nk), float(inst.gpus)]
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.start_ = np.searchsorted(rows[order], np.arange(n_rows + 1))
    lp.a_matrix_.index_ = cols[order]
    lp.a_matrix_.value_ = vals[order]
    if not relax:
        lp.integrality_ = [highspy.HighsVarType.kContinuous] * nx + [highspy.HighsVarType.kInteger] * nk
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", 1)
    h.setOptionValue("random_seed", 0)
    h.setOptionValue("mip_rel_gap", 0.0)
    if max_nodes is not None:
        h.setOptionValue("mip_max_nodes", max_nodes)
    if time_limit_s is not None:
        h.setOptionValue("time_limit", float(time_limit_s))
    h.passModel(lp)
    h.run() if relax else run_mip(h)
    status = h.getModelStatus()
    if status == highspy.HighsModelStatus.kInfeasible:
        return None
    if (max_nodes is not None or time_limit_s is not None) and status != highspy.HighsModelStatus.kOptimal:
        if h.getInfo().primal_solution_status != 2:  # no feasible point found within the node limit
            return np.zeros(len(inst.keep), dtype=np.int64) if unknown_feasible else None
    elif status != highspy.HighsModelStatus.kOptimal:
        raise RuntimeError(f"any-strategy bound: HiGHS status {h.modelStatusToString(status)} at X={X}")
    n = np.zeros(len(inst.keep), dtype=np.int64)
    n[used] = np.round(np.asarray(h.getSolution().col_value)[nx:]).astype(np.int64)
    return n


def least_feasible(inst: _Instance, upper: float | None, rel_tol: float, max_nodes: int | None = None,
                   unknown_feasible: bool = False, time_limit_s: float | None = None) -> tuple[float, float, np.ndarray, int]:
    """Bisection on X (feasibility is monotone: every budget grows with X): (lo, hi, counts at hi, probes)
    with lo proven infeasible or a valid floor, hi feasible and hi - lo <= rel_tol * hi (`max_nodes`: see
    `_probe`: lo is then a bound only with `unknown_feasible`)."""
    lo = max(inst.floor(), inst.volume())
    if not np.isfinite(lo):
        raise ValueError(f"any-strategy bound: a sequence of length {int(inst.lengths.max())} fits no scheme")
    probes = 0
    best = None
    hi = upper if upper is not None and upper >= lo else None
    if hi is not None:
        best = _probe(inst, hi, max_nodes=max_nodes, unknown_feasible=unknown_feasible, time_limit_s=time_limit_s)
        probes += 1
        if best is None:
            lo, hi = hi, None
    if hi is None:  # grow the bracket until feasible
        step = max(lo * 0.05, 1e-12)
        while best is None:
            hi = lo + step
            best = _probe(inst, hi, max_nodes=max_nodes, unknown_feasible=unknown_feasible, time_limit_s=time_limit_s)
            probes += 1
            if best is None:
                lo, step = hi, step * 2
    else:
        found = _probe(inst, lo, max_nodes=max_nodes, unknown_feasible=unknown_feasible, time_limit_s=time_limit_s)
        probes += 1
        if found is not None:
            hi, best = lo, found
    while hi - lo > rel_tol * hi:
        mid = 0.5 * (lo + hi)
        found = _probe(inst, mid, max_nodes=max_nodes, unknown_feasible=unknown_feasible, time_limit_s=time_limit_s)
        probes += 1
        if found is None:
            lo = mid
        else:
            hi, best = mid, found
    return lo, hi, best, probes


def any_strategy_bound(lengths: np.ndarray | Sequence[int], schemes: Sequence[Scheme], gpus: int, *,
                       transfer: np.ndarray | Sequence[float] | None = None, upper: float | None = None,
                       rel_tol: float = REL_TOL, max_nodes: int | None = MAX_NODES,
                       time_limit_s: float | None = None) -> BoundResult:
    """The least latency X (within rel_tol) at which the MILP is feasible: a lower bound on the propagation
    time (transfer None) or end-to-end time (transfer_s per scheme) of every plan of the batch on `gpus` GPUs.

    `schemes` are the profile's schemes with MaxLen for this N (costmodel.for_gpus); `upper`, a latency known
    to be feasible (e.g. a plan's), only narrows the first bracket; `max_nodes` (None: no limit) trades
    tightness for time, never validity; so does `time_limit_s` per probe (wall time: not deterministic)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.size == 0:
        return BoundResult(0.0, {}, 0.0, 0)
    inst = _instance(lengths, schemes, gpus, None if transfer is None else np.asarray(transfer, dtype=np.float64))
    lo, hi, best, probes = least_feasible(inst, upper, rel_tol, max_nodes, unknown_feasible=True,
                                          time_limit_s=time_limit_s)
    counts = {int(inst.keep[k]): int(n) for k, n in enumerate(best) if n > 0}
    return BoundResult(latency_s=float(lo), pipelines=counts, feasible_s=float(hi), probes=probes)


def strategy_meets(lengths: np.ndarray, schemes: Sequence[Scheme], counts: np.ndarray, X: float,
                   transfer: np.ndarray | None = None) -> bool:
    """Whether the relaxation above, for the given strategy (counts[k] pipelines of schemes[k]: at most that
    many busy), is feasible at latency X (end to end with `transfer` per scheme). False proves every plan of
    the strategy slower than X: the planner's pruning asks this of a candidate before dispatching it. One LP
    (pipeline counts continuous, which only loosens it)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    counts = np.asarray(counts, dtype=np.float64)
    inst = _instance(lengths, schemes, int(sum(s.gpus * n for s, n in zip(schemes, counts))), transfer, prune=False)
    return _probe(inst, X, relax=True, most=counts[inst.keep]) is not None
