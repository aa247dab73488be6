"""hydraplan's schedule for Megatron's hybrid-CP executor (core.executors.HybridCP): one global batch in one round.

Each sequence gets a CP size from the cost model: the smallest power of two on which it fits (L / cp within the
per-rank limit, L within MaxLen of <tp,1,cp>),
doubled for the sequences on the critical path while that shortens the round. Sequences sharing ranks (cp >= 2)
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
SEARCH_PASSES = 8  # local-search steps per single-rank sequence, at most
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
    for _ in range(MAX_CP_STEPS):  # the critical path's longest sequence on twice the ranks, while that helps
        cand = [i for i in best[2] if kidx[i] + 1 < top and fits[kidx[i] + 1, i]]
        if not cand:
            break
        trial_k, trial = grown(kidx, max(cand, key=lambda i: (times[kidx[i], i], -i)))
        if trial[0] >= best[0]:
            break
        kidx, best = trial_k, trial
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
    """Moves and swaps of single-rank sequences between the last rank to finish and the others, each lowering
    that rank's finish without another rank reaching it."""
    n = ready.size
    for _ in range(SEARCH_PASSES * max(1, len(t))):
        hi = int(np.argmax(ready))
        top = ready[hi]
        done = False
        for lo in np.argsort(ready, kind="stable")[:SEARCH_PARTNERS].tolist():
            if lo == hi or ready[lo] >= top:
                break
            gap = top - ready[lo]
            # move: the largest sequence of `hi` smaller than the gap
            for x in sorted(tails[hi], key=lambda i: (-t[i], i)):
                if t[x] < gap:
                    tails[hi].remove(x)
                    tails[lo].append(x)
                    ready[hi] -= t[x]
                    ready[lo] += t[x]
                    done = True
                    break
            if done:
                break
            # swap: x of hi for a shorter y of lo with 0 < t[x] - t[y] < gap
            ty = {y: t[y] for y in tails[lo]}
            for x in tails[hi]:
                for y, tyv in ty.items():
                    d = t[x] - tyv
                    if 0 < d < gap:
                        tails[hi][tails[hi].index(x)] = y
                        tails[lo][tails[lo].index(y)] = x
                        ready[hi] -= d
                        ready[lo] += d
                        done = True
                        break
                if done:
                    break
            if done:
                break
        if not done or n == 1:
            return
