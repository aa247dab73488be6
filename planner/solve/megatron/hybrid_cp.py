"""hydraplan's schedule for Megatron's hybrid-CP executor (core.executors.HybridCP): one global batch in one round.

Each sequence gets a CP size from the cost model: the smallest power of two on which it fits (L / cp within the
per-rank limit, L within MaxLen of <tp,1,cp>),
doubled for the sequences on the critical path while that shortens the round (looking a few doublings ahead, since
spreading one sequence may pay only once the next one spreads too). Sequences sharing ranks (cp >= 2)
go first, largest CP first then longest, each onto the aligned block that frees up earliest; then the cp = 1
sequences, longest first, each onto the rank that frees up earliest (LPT, pricing the constant c each one costs),
and a local search moves and swaps them between the last rank to finish and the others. Every rank lists its
shared sequences in start order, so the CP groups never wait on each other in a cycle; one round means one
barrier. A rank left without work (fewer sequences than ranks) makes the longest single-rank sequence's CP
double until every rank has some.

Pure and deterministic: ties go to the lowest rank, no clock, no randomness.
"""

from __future__ import annotations

import heapq

import numpy as np

from hydraplan.core.errors import UserError
from hydraplan.core.executors import HybridCP, HybridSchedule

MAX_CP_STEPS = 64  # CP doublings tried on the critical path, per batch
LOOKAHEAD = 3  # doublings tried past one that does not shorten the round
SEARCH_STEPS_PER_RANK = 4  # local-search steps per rank, at most
SEARCH_PARTNERS = 4  # the earliest-finishing ranks the last one trades with


def schedule_hybrid_cp(lengths: np.ndarray, target: HybridCP) -> HybridSchedule:
    """[round][rank] -> positions into `lengths`, for Megatron's hybrid-CP executor."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.size == 0:
        raise UserError("hybrid CP: an empty global batch")
    n = target.dpcp
    kidx = target.min_cp_index(lengths)
    if kidx.max() >= len(target.cps):
        worst = int(lengths[np.argmax(kidx)])
        raise UserError(f"hybrid CP: a sequence of {worst} tokens fits on no CP size of <{target.tp},1,cp> up to "
                        f"{target.cps[-1]} ranks at {target.max_seqlen_per_rank} tokens per rank")
    times = target.times(lengths)  # (K, n_seq)
    fits = target.fits(lengths)
    top = int(np.searchsorted(target.cps, n, side="right"))  # CP sizes up to the whole job

    def grown(k: np.ndarray, i: int):
        k = k.copy()
        k[i] += 1
        return k, _place(times, k, target.cps, n)

    best = _place(times, kidx, target.cps, n)
    while best[0] == np.inf:  # a rank without work: spread the longest sequence of the smallest CP over more ranks
        smallest = np.flatnonzero(kidx == kidx.min())
        i = int(smallest[np.argmax(times[kidx[smallest], smallest])])
        if kidx[i] + 1 >= top or not fits[kidx[i] + 1, i]:
            raise UserError(f"hybrid CP: {lengths.size} sequences cannot give each of {n} ranks work")
        kidx, best = grown(kidx, i)
    state, k_now, misses = best, kidx, 0
    for _ in range(MAX_CP_STEPS):  # the critical path's longest sequence on twice the ranks, a few steps ahead
        cand = [i for i in state[2] if k_now[i] + 1 < top and fits[k_now[i] + 1, i]]
        if not cand:
            break
        k_now, state = grown(k_now, max(cand, key=lambda i: (times[k_now[i], i], -i)))
        if state[0] < best[0]:
            best, misses = state, 0
        else:
            misses += 1
            if misses > LOOKAHEAD:
                break
    return [best[1]]


def _place(times: np.ndarray, kidx: np.ndarray, cps: tuple[int, ...], n: int):
    """(makespan, rank lists, the sequences on the last rank to finish); makespan inf if a rank has no work."""
    t = times[kidx, np.arange(kidx.size)]
    cp = np.asarray(cps)[kidx]
    shared = np.flatnonzero(cp > 1)
    shared = shared[np.lexsort((shared, -t[shared], -cp[shared]))]
    ready = np.zeros(n)
    lists: list[list[int]] = [[] for _ in range(n)]
    for i in shared.tolist():
        c = int(cp[i])
        j = int(np.argmin(ready.reshape(-1, c).max(axis=1)))
        lo = j * c
        ready[lo:lo + c] = ready[lo:lo + c].max() + t[i]
        for r in range(lo, lo + c):
            lists[r].append(i)
    single = np.flatnonzero(cp == 1)
    single = single[np.lexsort((single, -t[single]))]
    tails: list[list[int]] = [[] for _ in range(n)]
    heap = [(float(ready[r]), r) for r in range(n)]
    heapq.heapify(heap)
    for i in single.tolist():
        f, r = heapq.heappop(heap)
        tails[r].append(i)
        ready[r] = f + t[i]
        heapq.heappush(heap, (float(ready[r]), r))
    _search(tails, ready, t)
    for r in range(n):
        lists[r].extend(tails[r])
    if any(not x for x in lists):
        return np.inf, lists, []
    last = int(np.argmax(ready))
    return float(ready[last]), lists, list(lists[last])


def _search(tails: list[list[int]], ready: np.ndarray, t: np.ndarray) -> None:
    """Moves and swaps of single-rank sequences between the last rank to finish and the earliest ones, each
    lowering that rank's finish without another reaching it; the one leaving the pair most even is taken."""
    n = ready.size
    for _ in range(SEARCH_STEPS_PER_RANK * n):
        hi = int(np.argmax(ready))
        top = ready[hi]
        if not tails[hi]:
            return
        tx = t[tails[hi]]
        for lo in np.argsort(ready, kind="stable")[:SEARCH_PARTNERS].tolist():
            gap = top - ready[lo]
            if lo == hi or gap <= 0:
                break
            ty = t[tails[lo]] if tails[lo] else np.zeros(0)
            # d: what hi hands lo, a move (x alone) or a swap (x for y); 0 < d < gap lowers hi, keeps lo below top
            d = np.concatenate([tx, (tx[:, None] - ty[None, :]).ravel()])
            ok = (d > 0) & (d < gap)
            if not ok.any():
                continue
            k = int(np.argmin(np.where(ok, np.abs(2 * d - gap), np.inf)))
            x = k if k < tx.size else (k - tx.size) // max(ty.size, 1)
            xi = tails[hi][x]
            if k < tx.size:
                tails[hi].pop(x)
                tails[lo].append(xi)
            else:
                y = (k - tx.size) % ty.size
                tails[hi][x], tails[lo][y] = tails[lo][y], xi
            ready[hi] -= d[k]
            ready[lo] += d[k]
            break
        else:
            return
