"""The tight any-strategy relaxation: can some strategy of N GPUs run the batch within latency X?

A plan runs pipeline j (scheme P: a, b, c, pp, MaxLen M) in W_j + c V_j + (pp-1) (c + B_j), W_j its sequences'
work a l^2 + b l, V_j its micro-batches (each at most M tokens, so V_j >= L_j / M for L_j tokens) and B_j its
largest micro-batch, which is at least its longest sequence's work and at least W_j / V_j. Within X (end to end:
the scheme's propagation budget Y_P(X) of core/sync.py) one pipeline's (W, L), with its longest sequence costing
at least omega, therefore lies in the union over V of

    W + c V + (pp-1) (c + max(omega, W / V)) <= Y,    L <= V M,    rho_lo L <= W <= rho_hi L

(rho: work per token a l + b of the shortest and longest sequence it may hold), and n pipelines' summed loads
lie in n times the convex hull of that union (`capacity_facets`). The relaxation, a MILP per X:

- integer pipelines n_P per scheme within N GPUs;
- the LONG longest sequences whole (a binary scheme each); one is the longest of its pipeline (a host, h) unless
  it shares with a longer one it fits with (a pair that cannot share one pipeline within Y needs two), hosts of
  a scheme at most n_P;
- every other sequence fractional, as tokens of length groups (work counted at the group's shortest length,
  so never more than the real work) on the schemes whose MaxLen holds the group and whose pipeline runs its
  shortest sequence alone within Y;
- pp = 1: the scheme's summed loads in n_P times the hull (omega plays no part);
- pp > 1: pipelines told apart by the level of their longest sequence (a host, or a level of groups
  LEVEL_RATIO wide): m_λ pipelines of level λ carry loads in m_λ times the hull with omega = the level's
  shortest work, sum m_λ <= n_P, and the sequences of levels up to λ fit in the pipelines of levels up to λ
  (a sequence is never on a pipeline whose longest is shorter: running sums e_λ >= 0).

Every plan within X is a feasible point (its busy pipelines give n_P, m_λ and the hosts, its dispatch the
assignment, its loads the hull points), so the least feasible X is a lower bound on every plan of every
strategy. What it gives up: per-pipeline integrality of the short sequences and of V (a pipeline's loads are
a point of the hull, not of one V's region), and the work-per-token mix within a scheme.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np
from numpy.typing import ArrayLike

from hydraplan.core.schema import Scheme
from hydraplan.core.sync import charges, end_to_end_s, propagation_budget_s
from hydraplan.solve.highs import SparseModel

LONG = 8  # longest sequences kept whole
GROUP_RATIO = 1.1  # other sequences in geometric length groups this wide
LEVEL_RATIO = 1.5  # pp > 1 pipelines told apart by their longest sequence's level, levels this wide
C_FLOOR = 1e-6  # least per-micro-batch cost c, as a share of the latency Y (moves the hull by at most that per micro-batch)


@dataclass(frozen=True)
class Relaxation:
    """The relaxation's data for one batch, independent of X. Schemes are the kept ones (`keep` indexes the
    schemes given); lengths of the long sequences longest first, groups longest first."""

    keep: np.ndarray
    a: np.ndarray
    b: np.ndarray
    c: np.ndarray
    pp: np.ndarray
    max_len: np.ndarray
    g: np.ndarray  # GPUs per pipeline
    transfer: np.ndarray  # one-direction sync seconds (0: propagation objective)
    long: np.ndarray  # (K,)
    lo: np.ndarray  # (G,) shortest length of each group
    hi: np.ndarray  # (G,) longest
    tokens: np.ndarray  # (G,)
    level: np.ndarray  # (G,) level of each group, 0 the longest
    level_lo: np.ndarray  # (levels,) shortest length in each level
    level_hi: np.ndarray
    short: np.ndarray  # the other sequences' lengths, longest first: group g is short[start[g]:start[g + 1]]
    start: np.ndarray  # (G + 1,)
    shortest: int
    gpus: int

    @property
    def top(self) -> int:
        return int(self.long[0]) if self.long.size else int(self.hi.max(initial=0))

    def work(self, lengths: ArrayLike) -> np.ndarray:
        """(len, S) a l^2 + b l per scheme."""
        l = np.asarray(lengths, dtype=np.float64)[:, None]
        return (self.a * l + self.b) * l

    def alone_share(self, Y: np.ndarray) -> np.ndarray:
        """(G, S) the share of each group's tokens in sequences that run alone within each scheme's budget Y and
        fit its MaxLen: a pipeline of it holds no other of the group's sequences."""
        r = Y / self.pp - self.c  # a l^2 + b l <= r
        with np.errstate(invalid="ignore", divide="ignore"):
            root = np.where(self.a > 0, (np.sqrt(np.maximum(self.b ** 2 + 4 * self.a * r, 0.0)) - self.b) / (2 * self.a),
                            r / self.b)
        longest = np.where(r >= 0, np.minimum(np.floor(root * (1 + 1e-12)), self.max_len), -1.0)
        cum = np.r_[0.0, np.cumsum(self.short, dtype=np.float64)]
        first = np.searchsorted(-self.short, -longest, side="left")  # the first sequence no longer than that
        from_ = np.maximum(self.start[:-1, None], first[None, :])
        end = self.start[1:, None]
        return np.where(from_ < end, (cum[end] - cum[np.minimum(from_, end)]) / self.tokens[:, None], 0.0)

    def budget(self, X: float) -> np.ndarray:
        """Propagation budget of each scheme's busy pipelines at latency X (-inf: unusable)."""
        return np.asarray(propagation_budget_s(self.transfer, X), dtype=np.float64)

    def floor(self) -> float:
        """The least X at which the longest sequence runs alone on some scheme."""
        top = self.top
        alone = self.pp * (self.work([top])[0] + self.c)
        return float(np.where(top <= self.max_len, end_to_end_s(self.transfer, alone), np.inf).min())

    def volume(self) -> float:
        """The mean GPU-seconds over N of the cheapest (work + c per MaxLen of tokens) of every sequence, each at
        its own length: the slowest pipeline takes at least that (end to end too: it is at least its
        propagation)."""
        ls, count = np.unique(np.r_[self.long, self.short], return_counts=True)
        ok = ls[:, None] <= self.max_len
        per = np.where(ok, self.g * (self.work(ls) + self.c * ls[:, None] / self.max_len), np.inf)
        return float(count @ per.min(axis=1)) / self.gpus if ls.size else 0.0


def dominated(schemes: list[Scheme], transfer: np.ndarray) -> np.ndarray:
    """Schemes another needs no more GPUs than and beats (or ties) on every coefficient (a pipeline of it can
    replace one of them in any plan); exact ties keep the first."""
    keys = np.array([[s.gpus, -s.max_len, s.time.a, s.time.b, s.time.c, s.pp, t]
                     for s, t in zip(schemes, transfer, strict=True)], dtype=np.float64)
    le = np.all(keys[:, None, :] <= keys[None, :, :], axis=2)  # le[q, p]: q no worse than p everywhere
    K = len(schemes)
    eq = le & le.T
    beats = le & (~eq | (np.arange(K)[:, None] < np.arange(K)[None, :]))
    np.fill_diagonal(beats, False)
    return beats.any(axis=0)


def relaxation(lengths: np.ndarray, schemes: list[Scheme], gpus: int, transfer: np.ndarray | None = None, *,
               long: int = LONG, group_ratio: float = GROUP_RATIO, level_ratio: float = LEVEL_RATIO,
               prune: bool = True) -> Relaxation:
    """The data of the relaxation (`prune=False` keeps dominated schemes: a given strategy's are what they are)."""
    t_all = charges(transfer, len(schemes))
    usable = np.array([s.gpus <= gpus for s in schemes])
    if prune:
        usable &= ~dominated(schemes, np.where(usable, t_all, np.inf))
    keep = np.flatnonzero(usable)
    ks = [schemes[k] for k in keep]
    ls = np.sort(np.asarray(lengths, dtype=np.int64))[::-1]
    K = min(long, ls.size)
    short = ls[K:]
    # groups: geometric bins, cut where a MaxLen or half of one falls, so every member of a group fits the same
    # schemes and is over half of the same MaxLens
    cuts = np.unique([m for s in ks for m in (s.max_len, s.max_len // 2)])
    key = np.floor(np.log(np.maximum(short, 1)) / np.log(group_ratio)).astype(np.int64) * (cuts.size + 1)
    key += np.searchsorted(cuts, short, side="left")
    _, first, inv = np.unique(-key, return_index=True, return_inverse=True)  # longest first
    G = first.size
    lo = np.full(G, np.iinfo(np.int64).max)
    np.minimum.at(lo, inv, short)
    hi = np.zeros(G, dtype=np.int64)
    np.maximum.at(hi, inv, short)
    tokens = np.bincount(inv, weights=short.astype(np.float64), minlength=G)
    lv = np.floor(np.log(np.maximum(lo, 1)) / np.log(level_ratio)).astype(np.int64)
    _, level = np.unique(-lv, return_inverse=True)
    n_lev = int(level.max(initial=-1)) + 1
    level_lo = np.full(n_lev, np.iinfo(np.int64).max)
    np.minimum.at(level_lo, level, lo)
    level_hi = np.zeros(n_lev, dtype=np.int64)
    np.maximum.at(level_hi, level, hi)

    def arr(f) -> np.ndarray:
        return np.array([f(s) for s in ks], dtype=np.float64)

    return Relaxation(keep=keep, a=arr(lambda s: s.time.a), b=arr(lambda s: s.time.b), c=arr(lambda s: s.time.c),
                      pp=arr(lambda s: s.pp), max_len=arr(lambda s: s.max_len), g=arr(lambda s: s.gpus),
                      transfer=t_all[keep], long=ls[:K], lo=lo, hi=hi, tokens=tokens, level=level.astype(np.int64),
                      level_lo=level_lo, level_hi=level_hi, short=short, start=np.r_[first, short.size],
                      shortest=int(ls[-1]) if ls.size else 1, gpus=gpus)


# --------------------------------------------------------------------------------------------- the hull
def _cat(*parts: np.ndarray | float) -> np.ndarray:
    """np.r_ without its indexing machinery (a third of building a model: thousands of calls per batch)."""
    return np.concatenate([np.atleast_1d(p) for p in parts])


def capacity_facets(Y: float, p: float, c: float, omega: np.ndarray, rho_lo: float, rho_hi: np.ndarray
                    ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray] | None]:
    """Per level (its omega and rho_hi), the facets alpha W + beta L <= gamma (alpha, beta >= 0; L in micro-batches
    of M tokens, rho per M tokens) of the convex hull of one pipeline's feasible loads (module docstring), None
    when no V fits.

    For V micro-batches the loads lie below the point (min(cap_V, rho_hi V), min(V, cap_V / rho_lo)), cap_V
    the largest W: Y - p c - c V - p omega and (Y - p c - c V) V / (V + p). Past the V maximizing the second
    term and past V (c + rho_lo) >= Y - p c - p omega the points only shrink, so V stops there."""
    omega, rho_hi = np.atleast_1d(omega).astype(np.float64), np.atleast_1d(rho_hi).astype(np.float64)
    c = max(c, C_FLOOR * Y)  # a measured c fitted to 0 would leave V unbounded
    yp = Y - p * c
    room = yp - p * omega
    v_top = np.sqrt(p * yp / c) + 1.0 if p > 0 else 1.0
    vmax = np.minimum(np.floor(room / c), np.maximum(v_top, room / (c + rho_lo) + 1.0) + 1.0)
    V = np.arange(1, max(int(vmax.max(initial=1.0)), 1) + 1, dtype=np.float64)
    cap = room[:, None] - c * V
    if p > 0:
        cap = np.minimum(cap, (yp - c * V) * V / (V + p))
    W = np.minimum(cap, rho_hi[:, None] * V)
    L = np.minimum(V, cap / rho_lo)
    ok = (W >= omega[:, None] * (1 - 1e-12)) & (cap > 0) & (V <= vmax[:, None])
    return [_upper_right(W[j, ok[j]], L[j, ok[j]]) if ok[j].any() else None for j in range(omega.size)]


@numba.njit(cache=True)
def _upper_right(W: np.ndarray, L: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # pragma: no cover
    """The facets with nonnegative normals of the convex hull of points (W, L) and their projections on the axes.
    Compiled: a few points per level, thousands of levels per batch, where numpy spent its time calling."""
    order = np.argsort(-L, kind="mergesort")
    order = order[np.argsort(-W[order], kind="mergesort")]  # W descending, ties by L descending
    hw, hl = np.empty(W.size), np.empty(W.size)
    n, seen = 0, -np.inf
    for o in order:  # the Pareto front, W falling as L rises, folded into the hull by left turns
        w, l = W[o], L[o]
        if not l > seen:
            continue
        seen = l
        while n >= 2 and not (hw[n - 1] - hw[n - 2]) * (l - hl[n - 1]) - (hl[n - 1] - hl[n - 2]) * (w - hw[n - 1]) > 0:
            n -= 1
        hw[n], hl[n] = w, l
        n += 1
    al, be, ga = np.empty(n + 1), np.empty(n + 1), np.empty(n + 1)
    al[0], be[0], ga[0] = 1.0, 0.0, hw[0]
    for f in range(1, n):
        al[f], be[f] = hl[f] - hl[f - 1], hw[f - 1] - hw[f]
        ga[f] = al[f] * hw[f - 1] + be[f] * hl[f - 1]
    al[n], be[n], ga[n] = 0.0, 1.0, hl[n - 1]
    for f in range(n + 1):
        s = max(al[f], be[f])
        al[f], be[f], ga[f] = al[f] / s, be[f] / s, ga[f] / s
    return al, be, ga


# -------------------------------------------------------------------------------------------- the model
@dataclass
class _Loads:
    """Entries of one scheme's demand: the columns of its items and their work, token (in M) and big-sequence
    coefficients (sequences over half of MaxLen: no two share a micro-batch), with the level each belongs to
    (long sequences first, in order, then the short levels)."""

    cols: np.ndarray
    work: np.ndarray
    tok: np.ndarray
    big: np.ndarray
    level: np.ndarray


def _hosts(m: SparseModel, rel: Relaxation, Y: np.ndarray, wl: np.ndarray, zi: np.ndarray, zk: np.ndarray,
           z: np.ndarray) -> np.ndarray:
    """Host indicators h <= z, with h >= z - (z of the longer sequences it fits with on one pipeline)."""
    h = m.add_vars(z.size, 0.0, 1.0)
    e = np.arange(z.size)
    m.add_rows(z.size, _cat(e, e), _cat(h, z), _cat(np.ones(z.size), -np.ones(z.size)), upper=0.0)
    K, S = wl.shape
    idx = np.full((K, S), -1)
    idx[zi, zk] = np.arange(z.size)
    p = rel.pp - 1
    pair = (wl[:, None, :] + wl[None, :, :] + rel.c * np.ceil((rel.long[:, None, None] + rel.long[None, :, None])
                                                              / rel.max_len) + p * (rel.c + wl[:, None, :]))
    j, i, k = np.nonzero((pair <= Y) & (idx[:, None, :] >= 0) & (idx[None, :, :] >= 0)
                         & (np.arange(K)[:, None, None] < np.arange(K)[None, :, None]))
    rows = _cat(e, e, idx[i, k])
    m.add_rows(z.size, rows, _cat(h, z, z[idx[j, k]]), _cat(np.ones(z.size), -np.ones(z.size), np.ones(j.size)),
               lower=0.0)
    return h


def _facet_rows(m: SparseModel, facets: list, W: np.ndarray, L: np.ndarray, count: np.ndarray) -> None:
    """alpha W_j + beta L_j - gamma count_j <= 0 for every facet of every level j that has a hull."""
    have = [j for j, f in enumerate(facets) if f is not None]
    if not have:
        return
    al, be, ga = (np.concatenate([facets[j][x] for j in have]) for x in range(3))
    lev = np.repeat(have, [facets[j][0].size for j in have])
    F = al.size
    m.add_rows(F, np.repeat(np.arange(F), 3), np.column_stack([W[lev], L[lev], count[lev]]).ravel(),
               np.column_stack([al, be, -ga]).ravel(), upper=0.0)


def _pipelines(m: SparseModel, rel: Relaxation, k: int, Y: float, n: int, loads: _Loads, hosts: np.ndarray,
               host_level: np.ndarray) -> None:
    """Scheme k's capacity rows: its loads within its pipelines' hull, by level when pp > 1."""
    if loads.cols.size == 0:  # nothing it may hold: its pipelines stay idle
        return
    p, c, M = rel.pp[k] - 1, rel.c[k], rel.max_len[k]
    rho_lo = (rel.a[k] * rel.shortest + rel.b[k]) * M
    K = rel.long.size
    if p == 0:  # one hull for all its pipelines, whatever their longest sequence
        levels = np.zeros(1, dtype=np.int64)
        omega = np.zeros(1)
        top = np.array([min(max(float(rel.long.max(initial=0)), float(rel.hi.max(initial=0))), M)])
        item_level = np.zeros(loads.cols.size, dtype=np.int64)
        count = np.array([n])
    else:  # a level per long sequence (its pipeline's longest), then the short levels
        levels, item_level = np.unique(loads.level, return_inverse=True)
        short = levels >= K
        length = np.empty(levels.size, dtype=np.float64)  # the shortest a pipeline's longest sequence may be
        length[~short] = rel.long[levels[~short]]
        length[short] = rel.level_lo[levels[short] - K]
        omega = (rel.a[k] * length + rel.b[k]) * length
        top = length.copy()  # the longest any of its sequences may be
        top[short] = rel.level_hi[levels[short] - K]
        top = np.minimum(top, M)
        count = np.empty(levels.size, dtype=np.int64)
        count[~short] = hosts[np.searchsorted(host_level, levels[~short])] if (~short).any() else []
        count[short] = m.add_vars(int(short.sum()))
    facets = capacity_facets(Y, p, c, omega, rho_lo, (rel.a[k] * top + rel.b[k]) * M)
    J = levels.size
    hull = np.array([f is not None for f in facets])
    W = m.add_vars(J, 0.0, np.where(hull, np.inf, 0.0))
    L = m.add_vars(J, 0.0, np.where(hull, np.inf, 0.0))
    _facet_rows(m, facets, W, L, count)
    # running sums: e_j = e_(j-1) + supply_j - demand_j >= 0, for work, tokens (and big sequences)
    supply, demand = [W, L], [loads.work, loads.tok]
    if loads.big.any():  # sequences over M / 2 take a micro-batch each: V >= their count, each costs w(M / 2)
        half = np.floor(M / 2) + 1
        big_facets = capacity_facets(Y, p, c, omega, (rel.a[k] * half + rel.b[k]) * half, np.full(J, np.inf))
        B = m.add_vars(J, 0.0, np.where([f is not None for f in big_facets], np.inf, 0.0))
        _facet_rows(m, big_facets, W, B, count)
        supply.append(B)
        demand.append(loads.big)
    D = len(supply)
    e = m.add_vars(D * J).reshape(D, J)
    j = np.arange(J)
    rows = [(d * J + j, e[d], np.ones(J)) for d in range(D)]
    rows += [(d * J + j[1:], e[d, :-1], -np.ones(J - 1)) for d in range(D)]
    rows += [(d * J + j, supply[d], -np.ones(J)) for d in range(D)]
    rows += [(d * J + item_level, loads.cols, demand[d]) for d in range(D)]
    r, cc, v = (np.concatenate(x) for x in zip(*rows))
    nz = v != 0
    m.add_rows(D * J, r[nz], cc[nz], v[nz], lower=0.0, upper=0.0)
    used = count[hull] if p > 0 else np.zeros(0, dtype=np.int64)
    if p == 0:
        if not hull[0]:
            m.add_rows(1, np.zeros(1), np.array([n]), np.ones(1), upper=0.0)
        if hosts.size:
            m.add_rows(1, np.zeros(hosts.size + 1), _cat(hosts, n), _cat(np.ones(hosts.size), -1.0), upper=0.0)
        return
    dead = count[~hull & (levels < K)]  # (never: an eligible sequence runs alone within Y) hosts without a hull
    if dead.size:
        m.add_rows(dead.size, np.arange(dead.size), dead, np.ones(dead.size), upper=0.0)
    m.add_rows(1, np.zeros(used.size + 1), _cat(used, n), _cat(np.ones(used.size), -1.0), upper=0.0)


def _crowding(m: SparseModel, rel: Relaxation, Y: np.ndarray, n: np.ndarray, k: np.ndarray, cols: np.ndarray,
              work: np.ndarray, count: np.ndarray) -> None:
    """Sequences too costly to share a pipeline: two whose work each exceeds (Y - pp c) / (pp + 1) overrun Y
    together (their bubble counts the larger again), so each pipeline holds at most one; with pp = 1, the dual
    feasible function of Fekete and Schepers on work / (Y - c): over 2/3 counts 1, over 1/3 counts 1/2, and a
    pipeline's counts sum to at most 1. Items are (scheme k, column, work at least, sequences at least per unit)."""
    room = Y - rel.pp * rel.c
    pair = np.where(work > room[k] / (rel.pp[k] + 1), count, 0.0)
    third = np.where(rel.pp[k] == 1, np.where(work > 2 * room[k] / 3, count, np.where(work > room[k] / 3, count / 2, 0.0)), 0.0)
    for f in (pair, third):
        used = np.unique(k[f > 0])
        if used.size == 0:
            continue
        row = np.searchsorted(used, k)
        sel = f > 0
        m.add_rows(used.size, _cat(row[sel], np.arange(used.size)), _cat(cols[sel], n[used]),
                   _cat(f[sel], -np.ones(used.size)), upper=0.0)


def model(rel: Relaxation, X: float, most: np.ndarray | None = None) -> tuple[SparseModel, np.ndarray] | None:
    """The MILP at latency X and its pipeline-count columns, or None when some sequence fits no scheme within X
    (`most`: at most this many pipelines per kept scheme, a given strategy's)."""
    Y = rel.budget(X)
    usable = Y - rel.pp * rel.c > 0
    n_max = np.floor(rel.gpus / rel.g) if most is None else np.asarray(most, dtype=np.float64)
    usable &= n_max > 0
    wl = rel.work(rel.long)
    el = (rel.long[:, None] <= rel.max_len) & (rel.pp * (wl + rel.c) <= Y) & usable
    rho = rel.a * rel.lo[:, None] + rel.b  # work per token of each group's shortest sequence
    share = np.where(usable, rel.alone_share(Y), 0.0)  # of each group's tokens, what each scheme may hold
    eg = share > 0
    if not (el.any(axis=1).all() and (share.sum(axis=1) >= 1 - 1e-12).all()):
        return None
    m = SparseModel()
    S = rel.keep.size
    n = m.add_vars(S, 0.0, np.where(usable, n_max, 0.0), integer=True)
    m.add_rows(1, np.zeros(S), n, rel.g, upper=float(rel.gpus))
    zi, zk = np.nonzero(el)
    z = m.add_vars(zi.size, 0.0, 1.0, integer=True)
    m.add_rows(rel.long.size, zi, z, np.ones(z.size), lower=1.0, upper=1.0)
    h = _hosts(m, rel, Y, wl, zi, zk, z)
    gi, gk = np.nonzero(eg)
    x = m.add_vars(gi.size, 0.0, np.minimum(share[gi, gk], 1.0))  # the share of each group's tokens on each scheme
    m.add_rows(rel.lo.size, gi, x, np.ones(x.size), lower=1.0, upper=1.0)
    _crowding(m, rel, Y, n, _cat(zk, gk), _cat(z, x), _cat(wl[zi, zk], (rho * rel.lo[:, None])[gi, gk]),
              _cat(np.ones(z.size), rel.tokens[gi] / rel.hi[gi]))
    K = rel.long.size
    for k in np.flatnonzero(usable).tolist():
        on_z, on_x = zk == k, gk == k
        tok = rel.tokens[gi[on_x]]
        half = rel.max_len[k] / 2
        loads = _Loads(cols=_cat(z[on_z], x[on_x]), work=_cat(wl[zi[on_z], k], rho[gi[on_x], k] * tok),
                       tok=_cat(rel.long[zi[on_z]], tok) / rel.max_len[k],
                       big=_cat(rel.long[zi[on_z]] > half, (rel.lo[gi[on_x]] > half) * tok / rel.hi[gi[on_x]]),
                       level=_cat(zi[on_z], K + rel.level[gi[on_x]]))
        _pipelines(m, rel, k, float(Y[k]), int(n[k]), loads, h[on_z], zi[on_z])
    return m, n


def probe(rel: Relaxation, X: float, *, most: np.ndarray | None = None, relax: bool = False,
          max_nodes: int | None = None, time_limit_s: float | None = None, unknown_feasible: bool = False,
          fewest_gpus: bool = False, gap: float = 0.0, vertex: bool = True) -> np.ndarray | None:
    """Pipeline counts per kept scheme of a feasible point at X, or None when there is none. A search ended by
    `max_nodes` (deterministic) or `time_limit_s` (wall time: benchmarks only) without a point counts as
    infeasible, or with `unknown_feasible` as feasible (all-zero counts: what a bound needs, since taking an
    unproven X as feasible can only lower it). `relax`: the LP relaxation (counts fractional);
    `fewest_gpus`: among the feasible points one with the fewest GPUs (within `gap` of them, relative);
    `vertex=False`: any LP point will do, not a vertex (solved by interior point first, several times faster)."""
    built = model(rel, X, most)
    if built is None:
        return None
    m, n = built
    cost = None
    if fewest_gpus:
        cost = np.zeros(m.n_cols)
        cost[n] = rel.g
    sol = m.solve(relax=relax, max_nodes=max_nodes, time_limit_s=time_limit_s, cost=cost, rel_gap=gap, vertex=vertex)
    if sol.values is None:
        return np.zeros(rel.keep.size) if unknown_feasible and sol.status != "infeasible" else None
    return sol.values[n] if relax else np.round(sol.values[n])
