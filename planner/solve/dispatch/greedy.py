"""Algorithm 1 (Hydraulis §6.2): every sequence, in a trial's order, to the pipeline minimizing the resulting
maximum objective; LPT first, then randomized-LPT trials, the best finished by the local search."""

from __future__ import annotations

import numba
import numpy as np

from hydraplan.solve.dispatch.pipes import Costs, Pipes, busy_jit, cost_sorted
from hydraplan.solve.dispatch.search import local_search

BIG = 1e300  # "ineligible" cost: finite so that 0 * BIG stays 0 for pp=1 pipelines
NOISE = 0.3  # sigma of the log-length noise of the randomized LPT trials
MOVE = 8  # randomized trials (the best by their greedy cost) that get the move-only local search
POLISH = 4  # trials that get the full (move + swap) local search
WORK = 1_000_000  # cap on trials * sequences * pipelines the randomized trials evaluate


def greedy_trials(lengths: np.ndarray, W: np.ndarray | Costs, J: np.ndarray, P: Pipes, orders: np.ndarray) -> np.ndarray:
    """Algorithm 1 for every trial; returns (T, B) sorted-pipeline indices.

    Alg. 1 picks the pipeline minimizing the resulting maximum over all pipelines. That max is
    max(new_j, max_{k != j} O_k) >= current max, so the minimizer (ties broken by the smaller new_j) is
    simply argmin_j new_j: no top-2 bookkeeping. Compiled: at a thousand GPUs a trial is thousands of steps over
    a hundred pipelines, where numpy spends its time calling rather than computing."""
    D = W.shape[1]
    Wm = np.where(np.arange(D) < J[:, None], W[:], BIG)  # ineligible pipelines never win the argmin
    return _trials(np.ascontiguousarray(Wm, dtype=np.float64), lengths.astype(np.float64),
                   P.max_len.astype(np.float64), P.c.astype(np.float64), P.ppm1.astype(np.float64),
                   P.t.astype(np.float64), P.sync, np.ascontiguousarray(orders, dtype=np.int64))


@numba.njit(cache=True)
def _trials(Wm, lf, M, c, ppm1, t, sync, orders):  # pragma: no cover - compiled
    """greedy_trials' loop, in the order of operations of Eq. (2) as the running sums give it (new_j:
    (max(Mx_j, w) + c) (pp - 1) + C_j + w + c ceil((L_j + l) / M)), first minimum on a tie."""
    T, B = orders.shape
    D = Wm.shape[1]
    out = np.empty((T, B), dtype=np.int64)
    for r in range(T):
        C, L, Mx = np.zeros(D), np.zeros(D), np.zeros(D)
        for k in range(B):
            i = orders[r, k]
            li = lf[i]
            best, bj = np.inf, 0
            for j in range(D):
                w = Wm[i, j]
                new = ((max(Mx[j], w) + c[j]) * ppm1[j] + C[j] + w) + c[j] * np.ceil((L[j] + li) / M[j])
                if sync:
                    new = busy_jit(t[j], new)
                if new < best:
                    best, bj = new, j
            w = Wm[i, bj]
            C[bj] += w
            L[bj] += li
            Mx[bj] = max(Mx[bj], w)
            out[r, i] = bj
    return out


def greedy_one(lengths: np.ndarray, Wg: np.ndarray, P: Pipes, order: np.ndarray) -> np.ndarray:
    """Algorithm 1 for one trial in O(groups) per sequence instead of O(pipelines): the same argmin_j
    new_j as `greedy_trials`, found with a heap per group of identical pipelines keyed by current load O_j
    (new_j >= O_j + w, so popping stops as soon as O_j + w cannot beat the best) and one pool of empty
    pipelines per group (identical, so only the lowest index is a candidate). Used for the LPT trial,
    which at a thousand GPUs and more is the only one run; compiled (numba), since it is a loop over every
    sequence that no array operation replaces."""
    G = len(P.rep)
    r = P.rep
    members = np.argsort(P.gid, kind="stable")  # each group's pipelines, ascending, group after group
    starts = np.searchsorted(P.gid[members], np.arange(G + 1))
    by_len = np.argsort(-P.max_len[r], kind="stable")
    return _greedy_heaps(np.ascontiguousarray(lengths, dtype=np.int64), np.ascontiguousarray(Wg, dtype=np.float64),
                         np.ascontiguousarray(order, dtype=np.int64), members.astype(np.int64), starts.astype(np.int64),
                         by_len.astype(np.int64), P.c[r].astype(np.float64), P.ppm1[r].astype(np.float64),
                         P.max_len[r].astype(np.int64), P.t[r].astype(np.float64))


@numba.njit(cache=True)
def _before(k1: float, j1: int, k2: float, j2: int) -> bool:
    """(k1, j1) < (k2, j2), as Python compares the tuples."""
    return k1 < k2 or (k1 == k2 and j1 < j2)


@numba.njit(cache=True)
def _sift_up(hk: np.ndarray, hj: np.ndarray, base: int, i: int) -> None:
    while i > 0:
        p = (i - 1) >> 1
        if not _before(hk[base + i], hj[base + i], hk[base + p], hj[base + p]):
            return
        hk[base + i], hk[base + p] = hk[base + p], hk[base + i]
        hj[base + i], hj[base + p] = hj[base + p], hj[base + i]
        i = p


@numba.njit(cache=True)
def _sift_down(hk: np.ndarray, hj: np.ndarray, base: int, size: int) -> None:
    i = 0
    while True:
        small, a, b = i, 2 * i + 1, 2 * i + 2
        if a < size and _before(hk[base + a], hj[base + a], hk[base + small], hj[base + small]):
            small = a
        if b < size and _before(hk[base + b], hj[base + b], hk[base + small], hj[base + small]):
            small = b
        if small == i:
            return
        hk[base + i], hk[base + small] = hk[base + small], hk[base + i]
        hj[base + i], hj[base + small] = hj[base + small], hj[base + i]
        i = small


_I, _F = "int64[::1]", "float64[::1]"


@numba.njit(f"{_I}({_I}, float64[:, ::1], {_I}, {_I}, {_I}, {_I}, {_F}, {_F}, {_I}, {_F})", cache=True)  # loaded at import
def _greedy_heaps(lengths: np.ndarray, W: np.ndarray, order: np.ndarray, members: np.ndarray, starts: np.ndarray,
                  by_len: np.ndarray, gc: np.ndarray, gp: np.ndarray, gm: np.ndarray, gt: np.ndarray) -> np.ndarray:
    """greedy_one's loop. Group g owns slots starts[g]:starts[g+1] of the heap arrays (keys hk: load, ties by
    pipeline hj) and of `members`, its pipelines in ascending order, of which the first `used[g]` have work."""
    D, G = members.size, gc.size
    hk, hj = np.zeros(D), np.zeros(D, dtype=np.int64)
    size, used = np.zeros(G, dtype=np.int64), np.zeros(G, dtype=np.int64)
    C, L, Mx = np.zeros(D), np.zeros(D, dtype=np.int64), np.zeros(D)
    pg, po, pj = np.zeros(D, dtype=np.int64), np.zeros(D), np.zeros(D, dtype=np.int64)  # popped this step
    out = np.empty(lengths.size, dtype=np.int64)
    for i in order:
        l = lengths[i]
        best_obj, best_new, best_j, best_g, best_empty = np.inf, np.inf, D, -1, False
        npop = 0
        for g in by_len:
            if gm[g] < l:
                break
            w, t, base = W[i, g], gt[g], starts[g]
            if used[g] < starts[g + 1] - base:
                j = members[base + used[g]]
                new = w + gc[g] * -(-l // gm[g]) + gp[g] * (w + gc[g])
                obj = busy_jit(t, new) if t else new
                if _before(obj, j, best_obj, best_j):
                    best_obj, best_new, best_j, best_g, best_empty = obj, new, j, g, True
            while size[g] > 0:  # h_g(O_j + w) lower-bounds the objective of adding i to pipeline j
                least = hk[base] + w
                least = busy_jit(t, least) if t else least
                if not _before(least, hj[base], best_obj, best_j):
                    break
                o, j = hk[base], hj[base]
                size[g] -= 1
                hk[base], hj[base] = hk[base + size[g]], hj[base + size[g]]
                _sift_down(hk, hj, base, size[g])
                pg[npop], po[npop], pj[npop] = g, o, j
                npop += 1
                new = C[j] + w + gc[g] * -(-(L[j] + l) // gm[g]) + gp[g] * (max(Mx[j], w) + gc[g])
                obj = busy_jit(t, new) if t else new
                if _before(obj, j, best_obj, best_j):
                    best_obj, best_new, best_j, best_g, best_empty = obj, new, j, g, False
        for k in range(npop):
            if pj[k] != best_j:
                g = pg[k]
                hk[starts[g] + size[g]], hj[starts[g] + size[g]] = po[k], pj[k]
                _sift_up(hk, hj, starts[g], size[g])
                size[g] += 1
        if best_empty:
            used[best_g] += 1
        w = W[i, best_g]
        C[best_j] += w
        L[best_j] += l
        Mx[best_j] = max(Mx[best_j], w)
        base = starts[best_g]
        hk[base + size[best_g]], hj[base + size[best_g]] = best_new, best_j
        _sift_up(hk, hj, base, size[best_g])
        size[best_g] += 1
        out[i] = best_j
    return out


def trial_orders(lengths: np.ndarray, J: np.ndarray, trials: int, seed: int) -> np.ndarray:
    """Trial 0 is LPT (longest first); the others are randomized LPT: lengths scaled by lognormal noise
    (sigma 0.3) before sorting. On wikipedia/prolong batches this beat Alg. 1's uniform shuffles after the
    local search (shuffles start so unbalanced that the local search costs more, too). Sequences only one
    pipeline can hold always go first, as in Alg. 1."""
    B = len(lengths)
    keys = np.log(np.maximum(lengths, 1)).astype(np.float64)[None, :].repeat(trials, axis=0)
    if trials > 1:
        keys[1:] += np.random.default_rng(seed).normal(0.0, NOISE, size=(trials - 1, B))
    keys[:, J == 1] += 1e3
    return np.argsort(-keys, axis=1, kind="stable")


def greedy_best(lengths: np.ndarray, Wg: np.ndarray, W: Costs, J: np.ndarray, P: Pipes, trials: int, seed: int,
                bound: float) -> tuple[np.ndarray, float, int]:
    """LPT first, then the randomized trials. Every trial gets the move-only local search,
    the `POLISH` best then also the swaps: on wikipedia/prolong batches that is much cheaper than swaps
    everywhere and hardly worse. Stops early when the LPT trial meets `bound`."""
    D, B = W.shape[1], len(lengths)
    steps = 4 * D + 4 * B // D + 16
    trials = min(trials, max(1, WORK // (B * D)))
    orders = trial_orders(lengths, J, trials, seed)
    first = local_search(lengths, W, J, P, greedy_one(lengths, Wg, P, orders[0]), steps)
    first_cost = cost_sorted(lengths, W, P, first)
    if trials == 1 or first_cost <= bound * (1 + 1e-12):
        return first, first_cost, 1
    raw = greedy_trials(lengths, W, J, P, orders[1:])
    raw_costs = np.array([cost_sorted(lengths, W, P, a) for a in raw])
    keep = np.argsort(raw_costs, kind="stable")[:MOVE]
    cands = [first] + [local_search(lengths, W, J, P, raw[t], steps, swaps=False) for t in keep]
    costs = np.array([first_cost] + [cost_sorted(lengths, W, P, a) for a in cands[1:]])
    best, best_cost = first, first_cost
    for t in np.argsort(costs, kind="stable")[:POLISH]:
        a = cands[t] if t == 0 else local_search(lengths, W, J, P, cands[t], steps)
        c = cost_sorted(lengths, W, P, a)
        if c < best_cost * (1 - 1e-12):
            best, best_cost = a, c
    return best, best_cost, trials
