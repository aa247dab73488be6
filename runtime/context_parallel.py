"""Context parallelism inside a pipeline stage (WLB-LLM §5): each CP rank holds some of a micro-batch's tokens.

Sharding. CP rank c holds the [start, end) token ranges of the packed micro-batch that the plan's
`cp_shard.ranges[c]` lists (`pack --cp-shard`: per-sequence or per-document); without them, per-sequence
sharding into 2*cp symmetric chunks (planner/solve/cpshard.py), the load-balanced layout for causal attention.
A rank's local micro-batch is its tokens in packed order, with their labels and their global positions
in their documents, so embeddings, norms, projections, MLP, RoPE and the loss run unchanged on them.

Attention is the only op that mixes tokens: a query needs the keys and values of every earlier token of
its document, wherever they sit. Each layer gathers K and V of all CP ranks (one all_to_all_single with
per-rank sizes, as gloo's all_gather wants equal sizes); the backward of the gather sends each rank's
partial K/V gradient back to the rank that owns the token, which sums them. A rank's local tokens are
cut at document boundaries into runs; a run attends to its document's keys up to its own last token,
bottom-right causal: the shape of a Seq1F1B split's window (hydraplan.runtime.attention.window_attention). The
windows are picked from the gathered keys by index (backward: scatter-add).

With Seq1F1B splits (`shard_splits`), a CP rank's share of split [lo, hi) is its ranges cut to it; each
split gathers only its own K/V, and a run finds its keys in the gathered buffers of the earlier splits
(the Seq1F1B cache, runtime/seq1f1b.py) followed by the split's: split j's buffer holds tokens [lo_j,
hi_j), so the concatenation from the split that starts at `key_lo` is indexed like one gathered buffer.

Gradients. Each CP rank's parameter gradients are the partial sums over its own tokens' paths (queries,
and keys/values through the gather's backward), so the CP ranks' gradients add up to the unsharded
one; LNK push sums them at the owners like another pipeline's (runtime/lnk.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from hydraplan.core.schema import CPShard
from hydraplan.runtime.attention import Windows, window_attention
from hydraplan.runtime.batches import CPContext, PackedBatch
from hydraplan.solve.cpshard import shard_per_sequence

Ranges = list[list[tuple[int, int]]]


def shard_ranges(lengths: Sequence[int], cp: int, shard: CPShard | None) -> Ranges:
    """Per CP rank, the sorted [start, end) token ranges it holds of a micro-batch of these sequences."""
    if shard is not None:
        return [[(int(s), int(e)) for s, e in rs] for rs in shard.ranges]
    return shard_per_sequence(np.asarray(lengths, dtype=np.int64), cp).ranges(cp)


def check_ranges(ranges: Ranges, cp: int, total: int) -> str | None:
    """Why `ranges` is not a partition of [0, total) into cp ranks' sorted ranges, or None."""
    if len(ranges) != cp:
        return f"{len(ranges)} rank lists but cp={cp}"
    covered = np.zeros(total, dtype=np.int64)
    for c, rs in enumerate(ranges):
        for s, e in rs:
            if not 0 <= s < e <= total:
                return f"rank {c} range [{s}, {e}) is empty or outside the micro-batch's {total} tokens"
            covered[s:e] += 1
        if any(a[1] > b[0] for a, b in zip(rs, rs[1:])):
            return f"rank {c} ranges {rs} are not sorted and disjoint"
    if (covered != 1).any():
        return f"token {int(np.flatnonzero(covered != 1)[0])} is held by {int(covered[covered != 1][0])} ranks, not 1"
    return None


@dataclass(frozen=True)
class CPShards:
    """A CP rank's shares of a pipeline's micro-batches: per micro-batch ranges (`shard_ranges`), its CP
    rank, the global ranks of its CP group by CP rank, and the group."""

    ranges: list[Ranges]
    cp_rank: int
    cp_ranks: Sequence[int]
    group: dist.ProcessGroup | None

    @classmethod
    def of(cls, mbs: Sequence[PackedBatch], planned: Sequence[CPShard | None], cp_rank: int, cp_ranks: Sequence[int],
           group: dist.ProcessGroup | None) -> CPShards:
        """The shares of micro-batches with these planned shards (None: per-sequence, `shard_ranges`)."""
        ranges = [shard_ranges(torch.diff(mb.cu_seqlens).tolist(), len(cp_ranks), shard)
                  for mb, shard in zip(mbs, planned, strict=True)]
        return cls(ranges, cp_rank, cp_ranks, group)

    def split(self, m: int, mb: PackedBatch, bounds: Sequence[int]) -> list[PackedBatch]:
        """This rank's share of each split of micro-batch m (`shard_splits`)."""
        return shard_splits(mb, self.ranges[m], self.cp_rank, self.cp_ranks, self.group, bounds)


class _GatherTokens(torch.autograd.Function):
    """Forward: every group rank's tokens, in group rank order. Backward: each rank gets back, summed,
    every rank's gradient for its own tokens (an all-gather / reduce-scatter pair with uneven sizes)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup, sizes: list[int]) -> torch.Tensor:
        ctx.group, ctx.sizes = group, sizes
        out = x.new_empty(sum(sizes), *x.shape[1:])
        dist.all_to_all_single(out, x.repeat(len(sizes), *[1] * (x.dim() - 1)), sizes, [x.shape[0]] * len(sizes),
                               group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        cp, n = len(ctx.sizes), ctx.sizes[dist.get_rank(ctx.group)]
        parts = grad.new_empty(cp * n, *grad.shape[1:])
        dist.all_to_all_single(parts, grad.contiguous(), [n] * cp, ctx.sizes, group=ctx.group)
        return parts.view(cp, n, *grad.shape[1:]).sum(0), None, None


def gather_kv(k: torch.Tensor, v: torch.Tensor, ctx: CPContext) -> torch.Tensor:
    """K and V [n, Hkv, D] of every CP rank's tokens, concatenated on dim 1: [sum(sizes), 2*Hkv, D].
    Collective over the CP group, in forward and backward; `attend_gathered` then attends locally."""
    return _GatherTokens.apply(torch.cat([k, v], dim=1), ctx.group, ctx.sizes)


def attend_gathered(q: torch.Tensor, kv: torch.Tensor, ctx: CPContext) -> torch.Tensor:
    """Causal attention of this rank's queries q [n, Hq, D] to the keys and values of their documents on all
    CP ranks, picked from the gathered kv [sum(sizes), 2*Hkv, D] (`gather_kv`); no collective."""
    kv = kv.index_select(0, ctx.key_index)
    if q.shape[0] == 0:
        # No queries here, but the gather's backward is collective: keep it in this rank's graph.
        return q + 0 * kv.sum()
    k, v = kv.chunk(2, dim=1)
    return window_attention(q, k, v, ctx.windows)


def _runs(ranges: list[tuple[int, int]], cu: np.ndarray, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """A rank's ranges within [lo, hi) cut at document boundaries `cu`: run starts and ends."""
    cuts = [np.concatenate(([s], cu[(cu > s) & (cu < e)], [e])).astype(np.int64) for s, e in zip(*_clip(ranges, lo, hi))]
    empty = np.zeros(0, dtype=np.int64)
    return np.concatenate([c[:-1] for c in cuts] + [empty]), np.concatenate([c[1:] for c in cuts] + [empty])


def _indices(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The concatenation of arange(s, e) over the given spans."""
    lengths = ends - starts
    return np.repeat(starts - (np.cumsum(lengths) - lengths), lengths) + np.arange(lengths.sum())


def _offsets(lengths: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.concatenate(([0], np.cumsum(lengths)))).to(torch.int32)


def _clip(ranges: list[tuple[int, int]], lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """Starts and ends of the ranges cut to [lo, hi), empty ones dropped."""
    starts = np.array([max(s, lo) for s, _ in ranges], dtype=np.int64)
    ends = np.array([min(e, hi) for _, e in ranges], dtype=np.int64)
    keep = starts < ends
    return starts[keep], ends[keep]


def shard_batch(mb: PackedBatch, ranges: Ranges, cp_rank: int, cp_ranks: Sequence[int],
                group: dist.ProcessGroup) -> PackedBatch:
    """CP rank `cp_rank`'s local micro-batch of `mb` (its cu_seqlens: its runs), attending through the
    group of global ranks `cp_ranks` (indexed by CP rank)."""
    return shard_splits(mb, ranges, cp_rank, cp_ranks, group, [0, mb.num_tokens])[0]


def shard_splits(mb: PackedBatch, ranges: Ranges, cp_rank: int, cp_ranks: Sequence[int], group: dist.ProcessGroup,
                 bounds: Sequence[int]) -> list[PackedBatch]:
    """`shard_batch` for each Seq1F1B split [bounds[i], bounds[i+1]) of `mb`: the rank's tokens of the split,
    attending through the gathered K/V of the split and of the earlier ones (CPContext.key_lo)."""
    cu = mb.cu_seqlens.long().cpu().numpy()
    bounds = np.asarray(bounds, dtype=np.int64)
    order = sorted(range(len(cp_ranks)), key=lambda c: cp_ranks[c])  # CP ranks in process-group rank order
    where = np.empty(int(cu[-1]), dtype=np.int64)  # token -> its row in the splits' gathered buffers, concatenated
    held = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        held.append([_indices(*_clip(rs, lo, hi)) for rs in ranges])
        where[np.concatenate([held[-1][c] for c in order])] = np.arange(lo, hi)
    device = mb.tokens.device
    out = []
    for lo, hi, split_held in zip(bounds[:-1], bounds[1:], held):
        starts, ends = _runs(ranges[cp_rank], cu, lo, hi)
        doc_starts = cu[np.searchsorted(cu, starts, side="right") - 1]
        key_lo = int(bounds[np.searchsorted(bounds, doc_starts.min(initial=lo), side="right") - 1])
        q_len, k_len = ends - starts, ends - doc_starts
        mine = torch.from_numpy(split_held[cp_rank]).to(device)
        windows = Windows(_offsets(q_len).to(device), _offsets(k_len).to(device), int(q_len.max(initial=0)),
                          int(k_len.max(initial=0)))
        ctx = CPContext(group, [len(split_held[c]) for c in order],
                        torch.from_numpy(where[_indices(doc_starts, ends)] - key_lo).to(device), windows, key_lo)
        out.append(PackedBatch(tokens=mb.tokens[mine], labels=mb.labels[mine], positions=mb.positions[mine],
                               cu_seqlens=windows.cu_q, max_seqlen=windows.max_q, cp=ctx))
    return out
