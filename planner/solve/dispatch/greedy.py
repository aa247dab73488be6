"""Algorithm 1 (Hydraulis §6.2): every sequence, in a trial's order, to the pipeline minimizing the resulting
maximum objective; LPT first, then randomized-LPT trials all at once, the best finished by the local search."""

from __future__ import annotations

import heapq

import numpy as np

from hydraplan.core.sync import busy_float_s, busy_s
from hydraplan.solve.dispatch.pipes import Costs, Pipes, cost_sorted
from hydraplan.solve.dispatch.search import local_search

BIG = 1e300  # "ineligible" cost: finite so that 0 * BIG stays 0 for pp=1 pipelines
NOISE = 0.3  # sigma of the log-length noise of the randomized LPT trials
MOVE = 8  # randomized trials (the best by their greedy cost) that get the move-only local search
POLISH = 4  # trials that get the full (move + swap) local search
WORK = 1_000_000  # cap on trials * sequences * pipelines evaluated by the vectorized greedy


def greedy_trials(lengths: np.ndarray, W: np.ndarray, J: np.ndarray, P: Pipes, orders: np.ndarray) -> np.ndarray:
    """Algorithm 1 for every trial at once; returns (T, B) sorted-pipeline indices.

    Alg. 1 picks the pipeline minimizing the resulting maximum over all pipelines. That max is
    max(new_j, max_{k != j} O_k) >= current max, so the minimizer (ties broken by the smaller new_j) is
    simply argmin_j new_j: no top-2 bookkeeping, and all T trials advance together as (T, D) arrays,
    so a step costs a few numpy calls whatever T is.
    """
    T, B = orders.shape
    D = W.shape[1]
    Wm = np.where(np.arange(D) < J[:, None], W[:], BIG)  # ineligible pipelines never win the argmin
    lf = lengths.astype(np.float64)
    M = P.max_len.astype(np.float64)
    C = np.zeros((T, D))
    L = np.zeros((T, D))
    Mx = np.zeros((T, D))
    Cf, Lf, Mf = C.ravel(), L.ravel(), Mx.ravel()
    out = np.empty((T, B), dtype=np.int64)
    base = np.arange(T) * D
    rows = np.arange(T)
    for k in range(B):
        i = orders[:, k]
        w = Wm[i]
        li = lf[i]
        new = np.maximum(Mx, w)
        new += P.c
        new *= P.ppm1
        new += C
        new += w
        new += P.c * np.ceil((L + li[:, None]) / M)
        if P.sync:
            busy_s(P.t, new, out=new)
        f = base + new.argmin(axis=1)
        wj = w.ravel()[f]
        Cf[f] += wj
        Lf[f] += li
        Mf[f] = np.maximum(Mf[f], wj)
        out[rows, i] = f - base
    return out


def greedy_one(lengths: np.ndarray, Wg: np.ndarray, P: Pipes, order: np.ndarray) -> np.ndarray:
    """Algorithm 1 for one trial in O(groups) per sequence instead of O(pipelines): the same argmin_j
    new_j as `greedy_trials`, found with a heap per group of identical pipelines keyed by current load O_j
    (new_j >= O_j + w, so popping stops as soon as O_j + w cannot beat the best) and one pool of empty
    pipelines per group (identical, so only the lowest index is a candidate). Used for the LPT trial,
    which at 1024 GPUs (~900 pipelines, 4 distinct schemes) is the only one run."""
    G = len(P.rep)
    r = P.rep
    gc, gp, gm, gt = P.c[r].tolist(), P.ppm1[r].tolist(), P.max_len[r].tolist(), P.t[r].tolist()
    empty = [sorted(np.flatnonzero(P.gid == g).tolist(), reverse=True) for g in range(G)]  # pop() = lowest
    heaps: list[list[tuple[float, int]]] = [[] for _ in range(G)]
    D = len(P.gid)
    C, L, Mx = [0.0] * D, [0] * D, [0.0] * D
    out = np.empty(len(lengths), dtype=np.int64)
    by_len = sorted(range(G), key=lambda g: -gm[g])
    wrows = Wg.tolist()
    for i in order.tolist():
        l = int(lengths[i])
        wr = wrows[i]
        best_obj, best_new, best_j, best_g, best_empty = np.inf, np.inf, D, -1, False
        popped: list[tuple[int, float, int]] = []
        for g in by_len:
            if gm[g] < l:
                break
            w = wr[g]
            t = gt[g]
            if empty[g]:
                j = empty[g][-1]
                new = w + gc[g] * -(-l // gm[g]) + gp[g] * (w + gc[g])
                obj = busy_float_s(t, new) if t else new
                if (obj, j) < (best_obj, best_j):
                    best_obj, best_new, best_j, best_g, best_empty = obj, new, j, g, True
            h = heaps[g]
            while h:  # h_g(O_j + w) lower-bounds the objective of adding i to pipeline j
                least = h[0][0] + w
                least = busy_float_s(t, least) if t else least
                if not (least < best_obj or (least == best_obj and h[0][1] < best_j)):
                    break
                o, j = heapq.heappop(h)
                popped.append((g, o, j))
                new = C[j] + w + gc[g] * -(-(L[j] + l) // gm[g]) + gp[g] * (max(Mx[j], w) + gc[g])
                obj = busy_float_s(t, new) if t else new
                if (obj, j) < (best_obj, best_j):
                    best_obj, best_new, best_j, best_g, best_empty = obj, new, j, g, False
        for g, o, j in popped:
            if j != best_j:
                heapq.heappush(heaps[g], (o, j))
        if best_empty:
            empty[best_g].pop()
        w = wr[best_g]
        C[best_j] += w
        L[best_j] += l
        Mx[best_j] = max(Mx[best_j], w)
        heapq.heappush(heaps[best_g], (best_new, best_j))
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
    """LPT first, then the randomized trials (all at once). Every trial gets the move-only local search,
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
