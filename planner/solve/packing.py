"""Sequences -> micro-batches inside one pipeline (Hydraulis §6.1, Eq. 1, V search of appendix D).

For a fixed V the canonical estimate ``sum_v t(m_v) + (pp-1) max_v t(m_v)`` is ``S + V*c + (pp-1) *
(max_v load_v + c)`` with S the total sequence cost, so only the largest micro-batch depends on the
packing: Eq. (1) for that V is min-max partitioning under the MaxLen token capacity. With pp=1 every
feasible packing of V micro-batches costs the same, so only feasibility matters there.

Per V: LPT into V bins respecting capacity (first-fit-decreasing split when LPT gets stuck), a
move/swap local search off the largest bin, then CP-SAT (integer-scaled costs, hinted with the greedy,
deterministic time limit, one worker: identical output run to run) only when the greedy is more than
`rel_gap` above the lower bound max(longest item, S/V, w_V + w_{V+1}).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from hydraplan.core.schema import Scheme
from hydraplan.solve import milp

_SCALE = 1e7  # the greedy's largest micro-batch maps to this many integer units in CP-SAT
_TOL = 1e-12
DEFAULT_TIME_LIMIT_S = 2.0  # CP-SAT deterministic seconds per pack() call
# Largest Eq. (1) model handed to CP-SAT, in item-bin variables. Building and loading the model is Python
# work outside the deterministic time limit, growing with the variables; bigger models keep the greedy, which
# the ILP rarely beats at that size.
_MAX_CPSAT_VARS = 25_000


@dataclass(frozen=True)
class PackResult:
    micro_batches: list[np.ndarray]  # indices into `lengths`, one array per micro-batch
    estimate_s: float  # canonical pipeline time (hydraplan.core.cost)
    solver: str  # greedy | greedy+cpsat | greedy+cpsat-limit | greedy+warm-start | cpsat | empty
    optimal: bool  # proven optimal over the enumerated V range (for pack_fixed_v: for that V)
    warm_start_s: float  # the greedy warm start's estimate for the chosen V (>= estimate_s)
    dtime_s: float = 0.0  # CP-SAT deterministic time spent: callers sharing one budget charge this


@dataclass(frozen=True)
class _Fixed:
    """One V solved, in the sorted (longest first) item order."""

    bins: np.ndarray  # bin per sorted item
    mx: float  # largest bin cost (without c)
    warm_mx: float
    solver: str
    optimal: bool  # proven for this V (infeasible counts as proven when mx is inf)
    dtime: float = 0.0  # CP-SAT deterministic time spent


# ---------------------------------------------------------------------------------------- greedy
def _lpt(l: np.ndarray, w: np.ndarray, V: int, M: int) -> np.ndarray | None:
    """Longest first into the least loaded bin with room; None when an item finds no room."""
    load = np.zeros(V)
    tok = np.zeros(V, dtype=np.int64)
    bins = np.empty(len(l), dtype=np.int64)
    for i in range(len(l)):
        masked = np.where(tok + l[i] <= M, load, np.inf)
        v = int(masked.argmin())
        if masked[v] == np.inf:
            return None
        bins[i] = v
        load[v] += w[i]
        tok[v] += l[i]
    return bins


def _split(bins: np.ndarray, w: np.ndarray, V: int) -> np.ndarray:
    """Grow a feasible packing to V bins by moving the costliest item of the costliest multi-item bin
    into a new bin (stays feasible: single items fit)."""
    bins = bins.copy()
    for nb in range(int(bins.max()) + 1, V):
        load = np.bincount(bins, weights=w, minlength=nb)
        count = np.bincount(bins, minlength=nb)
        v = int(np.where(count > 1, load, -np.inf).argmax())
        bins[np.flatnonzero(bins == v)[0]] = nb
    return bins


def _improve(l: np.ndarray, w: np.ndarray, bins: np.ndarray, V: int, M: int) -> np.ndarray:
    """Moves, then swaps, off the costliest bin while its cost strictly drops below the old maximum."""
    bins = bins.copy()
    load = np.bincount(bins, weights=w, minlength=V)
    tok = np.bincount(bins, weights=l, minlength=V).astype(np.int64)
    for _ in range(4 * len(l)):
        p = int(load.argmax())
        top = load[p]
        mem = np.flatnonzero(bins == p)
        val = np.maximum(top - w[mem][:, None], load[None, :] + w[mem][:, None])
        val[(tok[None, :] + l[mem][:, None]) > M] = np.inf
        val[:, p] = np.inf
        r, q = np.unravel_index(int(val.argmin()), val.shape)
        if val[r, q] < top * (1 - _TOL):
            i = mem[r]
            bins[i] = q
            load[p] -= w[i]; load[q] += w[i]
            tok[p] -= l[i]; tok[q] += l[i]
            continue
        oth = np.flatnonzero(bins != p)
        if len(oth) == 0:
            break
        qs = bins[oth]
        d = w[mem][:, None] - w[oth][None, :]
        dl = l[mem][:, None] - l[oth][None, :]
        ok = (d > 0) & (tok[p] - dl <= M) & (tok[qs][None, :] + dl <= M)
        val = np.where(ok, np.maximum(top - d, load[qs][None, :] + d), np.inf)
        r, s = np.unravel_index(int(val.argmin()), val.shape)
        if not val[r, s] < top * (1 - _TOL):
            break
        i, k, qq = mem[r], oth[s], int(qs[s])
        bins[i], bins[k] = qq, p
        load[p] -= d[r, s]; load[qq] += d[r, s]
        tok[p] -= dl[r, s]; tok[qq] += dl[r, s]
    return bins


def _max_load(bins: np.ndarray, w: np.ndarray, V: int) -> float:
    return float(np.bincount(bins, weights=w, minlength=V).max())


def _bound(w: np.ndarray, V: int) -> float:
    """Lower bound on the largest bin: the costliest item, the average, and two of the V+1 costliest
    items sharing a bin (pigeonhole)."""
    lb = max(float(w[0]), float(w.sum()) / V)
    if len(w) > V:
        lb = max(lb, float(w[V - 1] + w[V]))
    return lb


# ------------------------------------------------------------------------------------------ CP-SAT
def _cpsat(l: np.ndarray, w: np.ndarray, V: int, M: int, hint: np.ndarray | None, lb: float,
           abs_gap: float, budget: float, seed: int) -> tuple[np.ndarray | None, str, float]:
    """Eq. (1) for one V. Items sorted longest first may only use bins 0..i (symmetry breaking).
    Returns (bins or None, status, deterministic time); status is optimal (proven, no gap used) |
    feasible | infeasible | unknown."""
    from ortools.sat.python import cp_model  # loads in half a second; most pipelines never need it
    U = len(l)
    ref = float(w.sum()) if hint is None else _max_load(hint, w, V)
    scale = _SCALE / max(ref, 1e-30)
    wi = np.round(w * scale).astype(np.int64)
    m = cp_model.CpModel()
    x = [[m.new_bool_var("") for _ in range(min(i + 1, V))] for i in range(U)]
    for row in x:
        m.add_exactly_one(row)
    hi = int(wi.sum()) if hint is None else int(np.bincount(hint, weights=wi, minlength=V).max())
    z = m.new_int_var(max(0, int(np.floor(lb * scale)) - U), hi, "z")
    for v in range(V):
        m.add(sum(x[i][v] for i in range(v, U)) >= 1)  # exactly V micro-batches, as Eq. (1) counts them
        m.add(sum(int(l[i]) * x[i][v] for i in range(v, U)) <= M)
        m.add(sum(int(wi[i]) * x[i][v] for i in range(v, U)) <= z)
    m.minimize(z)
    if hint is not None:
        # relabel bins by their first item so the hint obeys "item i in bins 0..i"
        first = np.full(V, U)
        np.minimum.at(first, hint, np.arange(U))
        relabel = np.empty(V, dtype=np.int64)
        relabel[np.argsort(first, kind="stable")] = np.arange(V)
        h = relabel[hint]
        for i in range(U):
            for v in range(len(x[i])):
                m.add_hint(x[i][v], int(h[i] == v))
        m.add_hint(z, hi)
    sol = milp.cpsat(m, seed=seed, max_dtime_s=max(budget, 1e-3), abs_gap=abs_gap * scale)
    if sol.values is None:
        return None, ("infeasible" if sol.status == "infeasible" else "unknown"), sol.dtime_s
    bins = np.array([next(v for v, var in enumerate(row) if sol.values[var.index]) for row in x], dtype=np.int64)
    # CP-SAT calls a search ended by the gap limit optimal too: proven only when the bound reaches the objective
    proven = (sol.status == "optimal" and sol.bound is not None and sol.objective_value is not None
              and sol.bound >= sol.objective_value)
    return bins, ("optimal" if proven else "feasible"), sol.dtime_s


def _cpsat_vars(U: int, V: int) -> int:
    """Item-bin variables of `_cpsat`'s model: item i may use bins 0..min(i, V-1)."""
    k = min(U, V)
    return k * (k + 1) // 2 + (U - k) * V


def _solve_v(l: np.ndarray, w: np.ndarray, V: int, M: int, pp: int, c: float, ffd: np.ndarray,
             budget: float, rel_gap: float, seed: int) -> _Fixed:
    """Eq. (1) for one V; mx is inf when no packing was found (optimal then means proven infeasible)."""
    if _cpsat_vars(len(l), V) > _MAX_CPSAT_VARS:
        budget = 0.0
    lb = _bound(w, V)
    greedy = _lpt(l, w, V, M)
    if greedy is None and V >= int(ffd.max()) + 1:
        greedy = _split(ffd, w, V)
    if greedy is None:
        if budget <= 0:
            return _Fixed(np.empty(0, dtype=np.int64), np.inf, np.inf, "unknown", False)
        bins, status, dt = _cpsat(l, w, V, M, None, lb, 0.0, budget, seed)
        if bins is None:
            return _Fixed(np.empty(0, dtype=np.int64), np.inf, np.inf, status, status == "infeasible", dt)
        if pp > 1:
            bins = _improve(l, w, bins, V, M)
        mx = _max_load(bins, w, V)
        return _Fixed(bins, mx, mx, "cpsat", status == "optimal" or pp == 1, dt)
    if pp > 1:
        greedy = _improve(l, w, greedy, V, M)
    mx = _max_load(greedy, w, V)
    if pp == 1 or mx <= lb * (1 + _TOL):
        return _Fixed(greedy, mx, mx, "greedy", True)
    est_lb = _estimate(float(w.sum()), V, lb, c, pp)
    if (pp - 1) * (mx - lb) <= rel_gap * est_lb or budget <= 0:
        return _Fixed(greedy, mx, mx, "greedy", False)
    bins, status, dt = _cpsat(l, w, V, M, greedy, lb, rel_gap * est_lb / (pp - 1), budget, seed)
    smx = _max_load(bins, w, V) if bins is not None else np.inf
    proven = status == "optimal"
    if bins is not None and smx < mx * (1 - _TOL):
        return _Fixed(bins, smx, mx, "greedy+cpsat" if proven else "greedy+cpsat-limit", proven, dt)
    return _Fixed(greedy, mx, mx, "greedy+cpsat" if proven else "greedy+warm-start", proven, dt)


# -------------------------------------------------------------------------------------- enumeration
def v_range(w: np.ndarray, total_tokens: int, max_len: int, c: float, pp: int, upper: float) -> list[int]:
    """The V worth trying, by cost (appendix D's UtilLen cap is dropped: c is charged per micro-batch, so the
    estimate itself says when more micro-batches stop paying): from ceil(sum/MaxLen) up, every V whose
    estimate lower bound reaches no higher than `upper`, the estimate of a feasible packing (first-fit
    decreasing: its V is included). `w` are the items' costs sorted descending."""
    n = len(w)
    lo = max(-(-total_tokens // max_len), 1)
    V = np.arange(lo, n + 1)
    S = float(w.sum())
    pair = np.where(V < n, w[np.minimum(V - 1, n - 1)] + w[np.minimum(V, n - 1)], 0.0)
    lb = S + V * c + (pp - 1) * (np.maximum(np.maximum(w[0], S / V), pair) + c)
    return V[lb <= upper * (1 + _TOL)].tolist()


def _estimate(S: float, V: int, mx: float, c: float, pp: int) -> float:
    return S + V * c + (pp - 1) * (mx + c)


def _search(l: np.ndarray, w: np.ndarray, vs: list[int], M: int, c: float, pp: int, ffd: np.ndarray,
            budget: float, rel_gap: float, seed: int) -> tuple[tuple[float, int, _Fixed] | None, bool, float]:
    """Best (estimate, V, packing) over `vs`, tried in order of their estimate's lower bound and pruned
    once that bound reaches the best found; also whether that is proven and the budget left."""
    S = float(w.sum())
    lbs = {V: _estimate(S, V, _bound(w, V), c, pp) for V in vs}
    order = sorted(vs, key=lambda V: (lbs[V], V))
    best: tuple[float, int, _Fixed] | None = None
    proven = True
    for k, V in enumerate(order):
        if best is not None and lbs[V] >= best[0] * (1 - _TOL):
            break
        fx = _solve_v(l, w, V, M, pp, c, ffd, budget / (len(order) - k), rel_gap, seed)
        budget -= fx.dtime
        if not np.isfinite(fx.mx):
            proven &= fx.optimal
            continue
        est = _estimate(S, V, fx.mx, c, pp)
        if best is None or est < best[0] * (1 - _TOL):
            if best is not None:
                proven &= best[2].optimal
            best = (est, V, fx)
        else:
            proven &= fx.optimal
    return best, proven and best is not None and best[2].optimal, budget


@lru_cache(maxsize=4096)
def _pack_sorted(key: bytes, M: int, a: float, b: float, c: float, pp: int,
                 time_limit_s: float, rel_gap: float, seed: int, only_v: int) -> tuple | None:
    """pack() on lengths sorted longest first, cached: candidates often hand a pipeline the same
    sequences (one long sequence alone, say)."""
    from hydraplan.solve.ffd import first_fit_bins  # compiled: loaded here, so importing this module stays cheap

    l = np.frombuffer(key, dtype=np.int64)
    w = (a * l.astype(np.float64) + b) * l
    ffd = first_fit_bins(l, M)
    n_ffd = int(ffd.max()) + 1
    if pp == 1 and n_ffd == max(only_v, -(-int(l.sum()) // M)):
        # pp=1 costs S + V*c whatever the packing: FFD meeting the volume bound is optimal (the common case)
        est = float(w.sum()) + n_ffd * c
        return ffd, est, "greedy", True, est, 0.0
    vs = [only_v] if only_v else v_range(w, int(l.sum()), M, c, pp, _estimate(float(w.sum()), n_ffd,
                                                                            _max_load(ffd, w, n_ffd), c, pp))
    best, proven, left = _search(l, w, vs, M, c, pp, ffd, time_limit_s, rel_gap, seed)
    if best is None:
        return None
    est, V, fx = best
    return fx.bins, est, fx.solver, proven, _estimate(float(w.sum()), V, fx.warm_mx, c, pp), time_limit_s - left


def _result(lengths: np.ndarray, out: tuple | None) -> PackResult | None:
    if out is None:
        return None
    bins, est, solver, optimal, warm, dtime = out
    order = np.argsort(-lengths, kind="stable")  # sorted position -> input index
    by_bin = np.argsort(bins, kind="stable")
    mbs = np.split(order[by_bin], np.flatnonzero(np.diff(bins[by_bin])) + 1)
    return PackResult(mbs, float(est), solver, bool(optimal), float(warm), float(dtime))


def _prepare(lengths: np.ndarray, scheme: Scheme) -> np.ndarray:
    lengths = np.asarray(lengths, dtype=np.int64)
    if len(lengths) and int(lengths.max()) > scheme.max_len:
        from hydraplan.solve.dispatch import Infeasible

        raise Infeasible(int(lengths.max()), scheme.max_len)
    return lengths


def pack(lengths: np.ndarray, scheme: Scheme, *, time_limit_s: float = DEFAULT_TIME_LIMIT_S, seed: int = 0,
         rel_gap: float = 1e-3) -> PackResult:
    """Pack one pipeline's sequences into micro-batches minimizing the canonical pipeline estimate over
    the appendix-D range of V. `time_limit_s` is CP-SAT deterministic time for the whole call;
    `rel_gap` skips (or stops) the ILP once the estimate is within that fraction of its lower bound."""
    lengths = _prepare(lengths, scheme)
    if len(lengths) == 0:
        return PackResult([], 0.0, "empty", True, 0.0)
    t = scheme.time
    key = np.sort(lengths)[::-1].astype(np.int64).tobytes()
    res = _result(lengths, _pack_sorted(key, scheme.max_len, t.a, t.b, t.c, scheme.pp,
                                        float(time_limit_s), float(rel_gap), int(seed), 0))
    assert res is not None  # every V of the range is tried, FFD's among them: one always fits
    return res


def pack_fixed_v(lengths: np.ndarray, scheme: Scheme, V: int, *, time_limit_s: float = DEFAULT_TIME_LIMIT_S,
                 seed: int = 0, rel_gap: float = 1e-3) -> PackResult | None:
    """Eq. (1) for exactly V micro-batches; None when no packing into V was found."""
    lengths = _prepare(lengths, scheme)
    if not 1 <= V <= len(lengths):
        raise ValueError(f"V must be in [1, {len(lengths)}] (got {V})")
    t = scheme.time
    key = np.sort(lengths)[::-1].astype(np.int64).tobytes()
    return _result(lengths, _pack_sorted(key, scheme.max_len, t.a, t.b, t.c, scheme.pp,
                                         float(time_limit_s), float(rel_gap), int(seed), int(V)))
