"""Megatron-LM's hybrid-CP scheduler (`BalancedCPScheduler`, megatron-core 0.17-0.19), written from its documented
behaviour so `hydraplan compare` can run it without Megatron; tests/test_megatron_hcp.py checks it equal, batch
for batch, to the scheduler of the downloaded megatron-core wheel.

What it does: sequences sorted longest first; each gets the CP size `2^ceil(log2(L / limit))` and the workload
L^2 / cp (neither the linear term nor the per-sequence constant). Rounds are formed one at a time: the remaining
sequences are cut, in order, into as many buckets as there are distinct CP sizes (a bucket closes past 110% of
the mean or when the rest is needed for the buckets still to come); the first bucket head that fits goes to a
new group of the lowest free ranks, or to the least loaded group of its size; once a smaller CP size has been
placed, the round closes as soon as the spread of rank loads is within 5%. Then the most loaded group's last
sequence goes back while that narrows the spread, and ranks left empty are filled by doubling the first
smallest group over them (the later groups' work shifted right). What is left is scheduled the same way, in its
order, in the next round.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from hydraplan.core.errors import UserError

DELTA = 0.05  # a round may close once max - min rank load <= DELTA * max
BUCKET_SLACK = 1.1  # a bucket closes past this share of the mean bucket workload


def cp_needed(length: int, limit: int) -> int:
    return max(1, 2 ** math.ceil(math.log2(length / limit)))


def _workload(length: int, cp: int) -> float:
    return (length * length) / cp


def _buckets(items: list[tuple[int, int]], limit: int) -> list[list[tuple[int, int]]]:
    k = len({cp_needed(l, limit) for _, l in items})
    target = sum(_workload(l, cp_needed(l, limit)) for _, l in items) / k
    buckets: list[list[tuple[int, int]]] = []
    cur: list[tuple[int, int]] = []
    cur_work, closed = 0.0, 0
    for pos, (sid, l) in enumerate(items):
        w = _workload(l, cp_needed(l, limit))
        # Megatron counts the buckets still to fill as k minus twice the closed ones
        if cur and (cur_work + w > target * BUCKET_SLACK or len(items) - pos <= k - 2 * closed):
            buckets.append(cur)
            cur, cur_work, closed = [], 0.0, closed + 1
        cur.append((sid, l))
        cur_work += w
    if cur:
        buckets.append(cur)
    return buckets


def _round(items: list[tuple[int, int]], limit: int, n: int) -> tuple[list[list[int]], list[tuple[int, int]]]:
    """One round: (ids per rank, the leftover (id, length) pairs in the order the next round takes them)."""
    buckets = _buckets(items, limit)
    lens: list[list[int]] = [[] for _ in range(n)]
    ids: list[list[int]] = [[] for _ in range(n)]
    load = [0.0] * n
    group_of: list[int | None] = [None] * n
    members: list[list[int]] = []  # by group id
    sizes: list[int] = []
    first_need = None
    check = False
    while buckets:
        pick = None
        free = [r for r in range(n) if group_of[r] is None]
        for b, bucket in enumerate(buckets):
            if not bucket:
                continue
            need = cp_needed(bucket[0][1], limit)
            if need in sizes or len(free) >= need:
                pick = b
                break
        if pick is None:
            break
        sid, l = buckets[pick][0]
        need = cp_needed(l, limit)
        first_need = need if first_need is None else first_need
        same = [g for g in range(len(sizes)) if sizes[g] == need]
        best, best_load = None, math.inf
        for g in same:
            gl = max(load[r] for r in members[g])
            if gl < best_load:
                best, best_load = g, gl
        if len(free) >= need and 0.0 < best_load:  # free ranks carry no load yet, so a new group wins any tie but 0
            best = len(sizes)
            members.append(free[:need])
            sizes.append(need)
            for r in free[:need]:
                group_of[r] = best
        assert best is not None  # no group of this size: pick's condition left enough free ranks for a new one
        w = _workload(l, need)
        for r in members[best]:
            lens[r].append(l)
            ids[r].append(sid)
            load[r] += w
        buckets[pick].pop(0)
        while buckets and not buckets[0]:
            buckets.pop(0)
        check = check or need < first_need
        if check and buckets and max(load) - min(load) <= DELTA * max(load):
            break
    leftovers = [it for bucket in buckets for it in bucket]
    _trim(lens, ids, load, group_of, members, leftovers, limit)
    while any(not x for x in lens):
        lens, ids = _fill_empty(lens, ids, members, sizes, n)
    return ids, leftovers


def _trim(lens, ids, load, group_of, members, leftovers, limit) -> None:
    """Hand back the most loaded group's last sequence while that narrows the spread of rank loads."""
    while True:
        hi, lo = max(load), min(load)
        if hi - lo <= DELTA * hi or lo == 0:
            return
        r = load.index(hi)
        if len(lens[r]) <= 1:
            return
        group = members[group_of[r]]
        l = lens[r][-1]
        w = _workload(l, cp_needed(l, limit))
        after = list(load)
        for m in group:
            after[m] -= w
        if max(after) - min(after) >= hi - lo:
            return
        leftovers.append((ids[r][-1], l))
        for m in group:
            lens[m].pop()
            ids[m].pop()
            load[m] -= w


def _fill_empty(lens, ids, members, sizes, n):
    """Double the first group of the smallest size over the next ranks, shifting the work after it right."""
    small = min(sizes)
    grow = min(small * 2, n) - small
    g = sizes.index(small)
    start, end = members[g][0], members[g][-1]
    empty = next(r for r in range(n) if not lens[r])
    new_lens: list[list[int]] = [[] for _ in range(n)]
    new_ids: list[list[int]] = [[] for _ in range(n)]
    new_lens[:start], new_ids[:start] = lens[:start], ids[:start]
    for r in range(start, end + grow + 1):
        new_lens[r], new_ids[r] = list(lens[end]), list(ids[end])
    for i, r in enumerate(range(end + 1, empty)):
        new_lens[end + grow + 1 + i], new_ids[end + grow + 1 + i] = lens[r], ids[r]
    sizes[g] += grow
    members[g] = list(range(start, end + grow + 1))
    for h in range(g + 1, len(members)):
        members[h] = [r + grow for r in members[h]]
    return new_lens, new_ids


def balanced_cp_schedule(lengths: Sequence[int] | np.ndarray, limit: int, n: int) -> list[list[list[int]]]:
    """sample_id_groups ([round][rank] -> positions into `lengths`) as Megatron's scheduler makes them."""
    if any(cp_needed(int(l), limit) > n for l in lengths):
        raise UserError(f"hybrid CP: a sequence of {max(lengths)} tokens needs more than {n} ranks of {limit} tokens")
    items = sorted(((i, int(l)) for i, l in enumerate(lengths)), key=lambda t: t[1], reverse=True)
    rounds = []
    while items:
        ids, items = _round(items, limit, n)
        rounds.append(ids)
    return rounds
