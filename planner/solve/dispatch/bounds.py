"""Bounds on the dispatch objective before solving: the Eq. (2) load of a given assignment, the pigeonhole and
top-sequences bounds the planner prunes candidates with, and the sequence-alone bound the greedy may meet."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hydraplan.core.schema import Scheme
from hydraplan.core.sync import charges, end_to_end_s
from hydraplan.solve.dispatch.pipes import Pipes, eq2


def scheme_arrays(schemes: Sequence[Scheme]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """a, b, c, pp - 1 and MaxLen per scheme, for the vectorized Eq. (2) forms."""
    a, b, c = (np.array([getattr(s.time, f) for s in schemes], dtype=np.float64) for f in "abc")
    ppm1 = np.array([s.pp - 1 for s in schemes], dtype=np.float64)
    return a, b, c, ppm1, np.array([s.max_len for s in schemes], dtype=np.int64)


def lower_bound(lengths: np.ndarray, assign: np.ndarray, schemes: list[Scheme]) -> np.ndarray:
    """Eq. (2) lower bound of every pipeline (in `schemes` order) under an assignment."""
    lengths = np.asarray(lengths, dtype=np.int64)
    assign = np.asarray(assign, dtype=np.int64)
    D = len(schemes)
    a, b, c, ppm1, ml = scheme_arrays(schemes)
    lf = lengths.astype(np.float64)
    w = (a[assign] * lf + b[assign]) * lf
    C = np.bincount(assign, weights=w, minlength=D)
    L = np.bincount(assign, weights=lf, minlength=D).astype(np.int64)
    lmax = np.zeros(D, dtype=np.int64)
    np.maximum.at(lmax, assign, lengths)
    mx = (a * lmax + b) * lmax
    return np.where(L > 0, eq2(C, L, mx, c, ppm1, ml), 0.0)


def _longest_first(lengths: np.ndarray) -> np.ndarray:
    """The lengths sorted descending (as given when they already are: the planner sorts once per batch)."""
    ls = np.asarray(lengths, dtype=np.int64)
    return ls if not np.any(ls[1:] > ls[:-1]) else np.sort(ls)[::-1]


def pigeonhole_bound(lengths: np.ndarray, schemes: list[Scheme], counts: np.ndarray,
                     transfer: np.ndarray | None = None) -> float:
    """A lower bound on every dispatch of `lengths` to counts[k] pipelines of schemes[k] (in the objective: with
    `transfer`, a pipeline's load mapped through its end-to-end map), before any solving.

    A sequence longer than a MaxLen level fits only on the N pipelines at or above it, so one of them holds at
    least m = ceil(t / N) of the t longest such sequences, each at least as long as the t-th, l_t: its load is at
    least m w(l_t) + c ceil(m l_t / MaxLen) + (pp-1)(w(l_t) + c) on the cheapest of those schemes. For each m
    only the first t matters (the bound falls with l_t). m = 1 is the sequence alone; m >= 2 is what decides
    candidates with few wide pipelines for many long sequences (two 32K documents on one pipeline)."""
    ls = _longest_first(lengths)
    a, b, c, ppm1, ml = scheme_arrays(schemes)
    t = charges(transfer, len(schemes))
    counts = np.asarray(counts, dtype=np.int64)
    levels = np.unique(ml)[::-1]
    best = 0.0
    for k, top in enumerate(levels.tolist()):
        below = int(levels[k + 1]) if k + 1 < len(levels) else 0
        s = int(np.searchsorted(-ls, -below, side="left"))  # sequences longer than the next level down
        ok = ml >= top
        n = int(counts[ok].sum())
        if s <= n:
            continue
        m = np.arange(2, -(-s // n) + 1, dtype=np.float64)[:, None]
        l = ls[(m[:, 0].astype(np.int64) - 1) * n].astype(np.float64)[:, None]
        w = (a[ok] * l + b[ok]) * l
        load = m * w + c[ok] * np.ceil(m * l / ml[ok]) + ppm1[ok] * (w + c[ok])
        best = max(best, float(np.asarray(end_to_end_s(t[ok], load)).min(axis=1).max()))
    return best


def top_sequences_bound(lengths: np.ndarray, schemes: list[Scheme], counts: np.ndarray,
                        transfer: np.ndarray | None = None, top: int = 1024) -> float:
    """A lower bound on every dispatch (as pigeonhole_bound) from the k longest sequences, for every k <= `top`:
    either two of them share a pipeline, costing at least the two shortest of them together on the cheapest
    scheme that holds both (pair_k), or each has a pipeline of its own, and then the largest of their costs
    alone is at least the bottleneck assignment's (each sequence to a scheme, at most counts[g] on scheme g,
    the largest alone cost as small as possible: own_k). It decides thirty 32K documents for nineteen wide
    pipelines, or two long documents for one fast pipeline, where sequence-by-sequence bounds see one alone.

    A sequence's cost alone rises with its length on every scheme, so at any threshold x the schemes a longer
    sequence may take are a subset of a shorter one's: the sets are nested, and Hall's condition reduces to
    the j longest fitting the pipelines of the j-th's set, for every j. The j-th alone therefore needs x >= x_j,
    the least of its alone costs whose cheaper-or-equal schemes hold j pipelines, and own_k = max_{j <= k} x_j.
    pair_k falls and own_k rises with k, so max_k min(pair_k, own_k) is at their crossing."""
    counts = np.asarray(counts, dtype=np.int64)
    K = min(len(lengths), int(counts.sum()) + 1, top)
    if K < 2:
        return 0.0
    ls = _longest_first(lengths)[:K]
    a, b, c, ppm1, ml = scheme_arrays(schemes)
    t = charges(transfer, len(schemes))
    l = ls.astype(np.float64)[:, None]
    w = (a * l + b) * l
    fits = ls[:, None] <= ml
    alone = np.where(fits, end_to_end_s(t, (ppm1 + 1) * (w + c)), np.inf)
    pair = w[:-1] + w[1:] + c * np.ceil((l[:-1] + l[1:]) / ml) + ppm1 * (w[:-1] + c)
    pair = np.r_[np.inf, np.inf, np.where(fits[:-1], end_to_end_s(t, pair), np.inf).min(axis=1)]  # index k
    if pair[2] <= alone[0].min():  # every min(pair_k, own_k) <= pair_2: nothing above the longest alone
        return 0.0
    order = np.argsort(alone, axis=1, kind="stable")
    cheapest = np.take_along_axis(alone, order, axis=1)
    held = np.cumsum(counts[order], axis=1)  # pipelines of each sequence's schemes up to each cost
    held[~np.isfinite(cheapest)] = 0  # schemes that cannot hold it add none
    j = np.arange(1, K + 1)
    enough = held >= j[:, None]
    x = np.where(enough.any(axis=1), cheapest[j - 1, enough.argmax(axis=1)], np.inf)
    own = np.r_[0.0, np.maximum.accumulate(x)]  # own[k], k = 1..K
    crossed = own[2:] >= pair[2:K + 1]
    k = int(crossed.argmax()) + 2 if crossed.any() else K + 1  # the least k with own_k >= pair_k (K + 1: none)
    best = float(own[k - 1]) if k - 1 >= 2 else 0.0
    return float(max(best, pair[k] if k <= K else 0.0))


def trivial_bound(Wg: np.ndarray, P: Pipes, lengths: np.ndarray) -> float:
    """max_i min_{j eligible} Eq. (2) of sequence i alone: a bound on Eq. (3) the greedy may meet."""
    r = P.rep
    alone = P.h(eq2(Wg, lengths[:, None], Wg, P.c[r], P.ppm1[r], P.max_len[r]), r, busy=True)
    alone[lengths[:, None] > P.max_len[r]] = np.inf
    return float(alone.min(axis=1).max())
