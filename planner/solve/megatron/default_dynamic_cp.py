"""Megatron-LM's dynamic-CP scheduler (`DefaultDynamicCPScheduler`, Megatron-LM dev, read at d48bd6b), written from
its behaviour so `hydraplan compare` and `python -m bench megatron` can run it without Megatron;
tests/test_megatron_dcp.py checks it equal to the outputs of Megatron's own code (tests/data/megatron_dcp.json).

What it does: the global batch sorted longest first; micro-batches are built one at a time from what is left. The
first (longest) sequence opens a block of the lowest ranks at its CP size, `2^ceil(log2(L / limit))` (at least
`min_cp_size`); it sets a workload cap, 1.05 x its length x the per-rank limit, workloads being L^2 / cp (neither
the linear term, the per-pack constant nor memory). Each later sequence, for every CP size from its own up to the
DPxCP size by doubling, may join an existing block of that size (its tokens per rank staying within the limit) or
open a new one on the lowest free ranks; it takes the option giving the lowest maximum rank workload within the cap
(the first one found on ties), or waits for a later micro-batch. Ranks left empty are filled by doubling the first
block of the smallest size over the next ranks (the later blocks shifted right), and where that cannot be done the
micro-batch becomes one block of all ranks holding, longest first, what fits. With a VPP micro-batch group, the
micro-batch count is then raised to a multiple of it by splitting micro-batches from the last one backwards: the
blocks starting at or past half the ranks move to a new micro-batch, and both halves fill their empty ranks by
doubling blocks. Megatron never reads `max_num_seqs` here (it passes it): its packs may hold any number of sequences.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from hydraplan.core.errors import UserError
from hydraplan.core.executors import DynamicCPSchedule

CAP_SLACK = 0.05  # the workload cap is (1 + CAP_SLACK) x the longest sequence x the per-rank limit

Item = tuple[int, int]  # (position in the batch, length)


def cp_needed(length: int, limit: int, min_cp_size: int = 1) -> int:
    return max(min_cp_size, max(1, 2 ** math.ceil(math.log2(length / limit))))


class _Block:
    """A block of one micro-batch: its size, its ranks, its tokens per rank, the workload of each of its ranks."""

    __slots__ = ("size", "ranks", "per_rank", "load")

    def __init__(self, size: int, ranks: list[int], per_rank: float, load: float) -> None:
        self.size, self.ranks, self.per_rank, self.load = size, ranks, per_rank, load


def _micro_batch(items: list[Item], n: int, limit: int, min_cp: int) -> tuple[list[list[int]], list[Item]]:
    """One micro-batch from `items` (longest first): (positions per rank, the items left for later, in order)."""
    lists: list[list[int]] = [[] for _ in range(n)]
    first, tall = items[0]
    k = cp_needed(tall, limit, min_cp)
    if k > n:
        raise UserError(f"dynamic CP: a sequence of {tall} tokens needs {k} ranks of {limit} tokens, more than {n}")
    cap = float(tall) * float(limit) * (1.0 + CAP_SLACK)
    blocks = [_Block(k, list(range(k)), tall / k, (tall * tall) / k)]
    used = k  # blocks hold the lowest ranks, so the free ones are used..n-1
    for r in range(k):
        lists[r].append(first)
    left: list[Item] = []
    for pos, length in items[1:]:
        best: tuple[float, int, _Block | None] | None = None  # (highest workload after, size, block or None: new)
        size = cp_needed(length, limit, min_cp)
        heavy = max(blocks, key=lambda o: o.load)  # the highest workload, and the highest of the other blocks
        rest = max((o.load for o in blocks if o is not heavy), default=0.0)
        while size <= n:
            work = (length * length) / size
            for b in blocks:
                if b.size != size or b.per_rank + length / size > limit:
                    continue
                after = max(b.load + work, rest if b is heavy else heavy.load)
                if after <= cap and (best is None or after < best[0]):
                    best = (after, size, b)
            if n - used >= size:  # the new block's ranks start from 0 work
                after = max(work, heavy.load)
                if after <= cap and (best is None or after < best[0]):
                    best = (after, size, None)
            size *= 2
        if best is None:
            left.append((pos, length))
            continue
        _, size, block = best
        if block is None:
            block = _Block(size, list(range(used, used + size)), length / size, (length * length) / size)
            blocks.append(block)
            used += size
        else:
            block.per_rank += length / size
            block.load += (length * length) / size
        for r in block.ranks:
            lists[r].append(pos)
    while any(not x for x in lists):
        if not _double_smallest(lists, blocks, n):
            return _whole_group(items, n, limit)
    return lists, left


def _double_smallest(lists: list[list[int]], blocks: list[_Block], n: int) -> bool:
    """Fill empty ranks: the first block of the smallest size that can grow doubles (up to n) over the ranks after it,
    the blocks after it moving right; False when no block of that size can."""
    empty = next(r for r in range(n) if not lists[r])
    smallest = min(b.size for b in blocks)
    grow = min(smallest * 2, n) - smallest
    for b in blocks:
        lo, hi = b.ranks[0], b.ranks[-1]
        if b.size != smallest or hi + 1 > empty or hi + grow >= n:
            continue
        moved = lists[hi + 1:empty]
        if hi + grow + len(moved) >= n:  # Megatron's own code fails here (an index past the last rank)
            raise UserError(f"dynamic CP: Megatron cannot double the block of ranks {lo}..{hi}: the blocks after it "
                            f"would move past rank {n - 1}")
        grown = [list(lists[hi]) for _ in range(hi + grow + 1 - lo)]
        lists[lo:] = grown + moved + [[] for _ in range(n - hi - grow - 1 - len(moved))]
        for o in blocks:
            if o is not b and o.ranks[0] > hi:
                o.ranks = [r + grow for r in o.ranks]
        b.size, b.ranks = smallest + grow, list(range(lo, hi + grow + 1))
        return True
    return False


def _whole_group(items: list[Item], n: int, limit: int) -> tuple[list[list[int]], list[Item]]:
    """The micro-batch as one block of all n ranks: the items, longest first, whose tokens per rank still fit."""
    chosen: list[int] = []
    left: list[Item] = []
    per_rank = 0.0
    for pos, length in items:
        if per_rank + length / n <= limit:
            chosen.append(pos)
            per_rank += length / n
        else:
            left.append((pos, length))
    if not chosen:
        raise UserError(f"dynamic CP: no sequence fits the whole DPxCP group of {n} ranks at {limit} tokens per rank")
    return [list(chosen) for _ in range(n)], left


# ------------------------------------------------------------------------------------------- VPP alignment
def _block_edges(mb: list[list[int]]) -> list[int]:
    """Where each block starts, from rank 0, and the rank count; blocks must not grow left to right."""
    edges, prev = [0], 0
    while edges[-1] != len(mb):
        lo = edges[-1]
        head = mb[lo][0]
        size = next((r for r in range(lo, len(mb)) if head not in mb[r]), len(mb)) - lo
        if prev and size > prev:
            raise UserError(f"dynamic CP: Megatron cannot split a micro-batch whose blocks grow ({prev} then {size} ranks)")
        edges.append(lo + size)
        prev = size
    return edges


def _expand(mb: list[list[int]]) -> list[list[int]]:
    """Fill the empty ranks at the end by doubling blocks: walking blocks from the right, the first block with a
    larger block on its left doubles (the ranks after it move right); with none, the leftmost block doubles if the
    empty ranks hold it."""
    while not mb[-1]:
        n_empty = sum(1 for x in mb if not x)
        full = len(mb) - n_empty
        i, prev = full - 1, 0
        for _ in range(len(mb) + 1):
            if i < 0:
                raise UserError("dynamic CP: Megatron's VPP alignment cannot fill the empty ranks (it would not stop)")
            head = mb[i][0]
            size = 0
            while i >= 0 and head in mb[i]:
                size, i = size + 1, i - 1
            if prev and size > prev:
                lo = i + 1 + size  # the block right of this one, of prev ranks, doubles
                mb = mb[:lo + prev] + mb[lo:lo + prev] + mb[lo + prev:full] + [[] for _ in range(max(n_empty - prev, 0))]
                break
            if i == -1 and size <= n_empty:
                mb = mb[:size] + mb[:size] + mb[size:full] + [[] for _ in range(n_empty - size)]
                break
            prev = size
    return mb


def _split(mb: list[list[int]]) -> tuple[list[list[int]], list[list[int]]] | None:
    """(the blocks from half the ranks on, the blocks before), each filled to all ranks; None for a single block."""
    edges = _block_edges(mb)
    if len(edges) == 2:
        return None
    n = len(mb)
    cut = next(e for e in edges if e >= n // 2)
    return _expand(mb[cut:] + [[] for _ in range(cut)]), _expand(mb[:cut] + [[] for _ in range(n - cut)])


def align_to_group(schedule: DynamicCPSchedule, group: int) -> DynamicCPSchedule:
    """Megatron's align_sample_id_groups: micro-batches split, from the last one backwards (wrapping around), until
    their count is a multiple of `group`; the later half of a split micro-batch takes its place, the earlier half
    goes to the end."""
    schedule = [list(mb) for mb in schedule]
    missing = -len(schedule) % group
    i, misses = len(schedule) - 1, 0
    while missing:
        if i < 0:
            if misses >= len(schedule):
                raise UserError(f"dynamic CP: no micro-batch can be split to make the count a multiple of {group}")
            i = len(schedule) - 1
        halves = _split(schedule[i])
        if halves is None:
            misses += 1
        else:
            schedule[i] = halves[0]
            schedule.append(halves[1])
            missing, misses = missing - 1, 0
        i -= 1
    return schedule


def default_dynamic_cp_schedule(lengths: Sequence[int] | np.ndarray, *, dpcp: int, max_seqlen_per_rank: int,
                                min_cp_size: int = 1, max_num_seqs: int | None = None,
                                vpp_group: int | None = None) -> DynamicCPSchedule:
    """sample_id_groups ([micro-batch][DPxCP rank] -> positions into `lengths`) as Megatron's DefaultDynamicCPScheduler
    makes them (`max_num_seqs`, which it is given, it does not use)."""
    del max_num_seqs
    items = sorted(((i, int(l)) for i, l in enumerate(lengths)), key=lambda t: t[1], reverse=True)
    schedule: DynamicCPSchedule = []
    while items:
        lists, items = _micro_batch(items, dpcp, max_seqlen_per_rank, min_cp_size)
        schedule.append(lists)
    if vpp_group is not None and vpp_group > 1:
        schedule = align_to_group(schedule, vpp_group)
    return schedule
