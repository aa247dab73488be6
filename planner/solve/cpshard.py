"""Context-parallel sharding of a packed micro-batch (WLB-LLM §5): per-sequence vs per-document, adaptive.

- per-sequence: the packed sequence is cut into 2*cp equal chunks and CP rank i takes chunks i and
  2*cp-1-i (the symmetric pair that balances a single causal document, but not a packed one);
- per-document: every document of length l = 2*cp*q + r is cut into 2*cp chunks of q tokens, rank i
  takes chunks i and 2*cp-1-i of each document, and the r remainder tokens (the document's tail) go
  round-robin over the ranks with a counter running across documents (padding-free, WLB-LLM §5.1), so
  every rank gets the same tokens (+-1) and, up to the remainders, the same attention work.

Attention time of a rank. Causal query token p (0-based in its document) attends to p+1 keys, so a
query range [s, e) of a document does e^2 - s^2 units of work (a document does l^2, the profile's
a*l^2). Each contiguous run of tokens a rank holds of one document is one query segment of the varlen kernel
(the runtime's own cut, runtime/context_parallel.py), which pads it to a multiple of the 128-token tile
(FlashAttention's tile; WLB-LLM §5.2), so its work is scaled by ceil(n/128)*128 / n. In seconds: a * cp * work
(perfectly balanced work takes a*l^2 on every rank, the profile's time). The CP group is synchronous, so a
sharding costs its slowest rank; `adaptive` picks the cheaper of the two (WLB-LLM §5.3).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from hydraplan.core.schema import CPShard, PlanPipeline, Scheme

TILE = 128
Strategy = Literal["per-sequence", "per-document"]


@dataclass(frozen=True)
class Shards:
    """Token ranges of a packed micro-batch per CP rank: rank[i] holds [start[i], end[i]); each range
    lies inside one document (doc[i])."""

    rank: np.ndarray
    start: np.ndarray
    end: np.ndarray
    doc: np.ndarray

    def ranges(self, cp: int) -> list[list[tuple[int, int]]]:
        """Per rank, sorted and merged [start, end) ranges (what a plan records)."""
        out: list[list[tuple[int, int]]] = []
        for r in range(cp):
            sel = self.rank == r
            order = np.argsort(self.start[sel], kind="stable")
            merged: list[tuple[int, int]] = []
            for s, e in zip(self.start[sel][order].tolist(), self.end[sel][order].tolist()):
                if merged and merged[-1][1] == s:
                    merged[-1] = (merged[-1][0], e)
                else:
                    merged.append((s, e))
            out.append(merged)
        return out


@dataclass(frozen=True)
class CPSharding:
    strategy: Strategy
    ranges: list[list[tuple[int, int]]]
    attention_s: np.ndarray  # per rank
    other_s: float  # max over ranks of the strategy not chosen

    @property
    def max_s(self) -> float:
        return float(self.attention_s.max())


def _doc_starts(lengths: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)


def _pair_rank(k: np.ndarray, cp: int) -> np.ndarray:
    """Chunk k of 2*cp goes to rank k, or 2*cp-1-k for the mirrored half."""
    return np.where(k < cp, k, 2 * cp - 1 - k)


def shard_per_sequence(lengths: np.ndarray, cp: int) -> Shards:
    lengths = np.asarray(lengths, dtype=np.int64)
    n = int(lengths.sum())
    chunk_bounds = (np.arange(2 * cp + 1, dtype=np.int64) * n) // (2 * cp)
    doc_bounds = np.concatenate([_doc_starts(lengths), [n]])
    cuts = np.union1d(chunk_bounds, doc_bounds)
    start, end = cuts[:-1], cuts[1:]
    keep = end > start
    start, end = start[keep], end[keep]
    chunk = np.searchsorted(chunk_bounds, start, side="right") - 1
    doc = np.searchsorted(doc_bounds, start, side="right") - 1
    return Shards(rank=_pair_rank(chunk, cp), start=start, end=end, doc=doc)


def shard_per_document(lengths: np.ndarray, cp: int) -> Shards:
    lengths = np.asarray(lengths, dtype=np.int64)
    starts = _doc_starts(lengths)
    q, rem = lengths // (2 * cp), lengths % (2 * cp)
    k = np.tile(np.arange(2 * cp), len(lengths))
    d = np.repeat(np.arange(len(lengths)), 2 * cp)
    c_start = starts[d] + k * q[d]
    body = Shards(rank=_pair_rank(k, cp), start=c_start, end=c_start + q[d], doc=d)
    rd = np.repeat(np.arange(len(lengths)), rem)  # remainder tokens, round-robin across documents
    j = np.arange(len(rd)) - np.repeat(np.cumsum(rem) - rem, rem)
    r_start = starts[rd] + 2 * cp * q[rd] + j
    tail = Shards(rank=np.arange(len(rd)) % cp, start=r_start, end=r_start + 1, doc=rd)
    keep = body.end > body.start
    return Shards(
        rank=np.concatenate([body.rank[keep], tail.rank]),
        start=np.concatenate([body.start[keep], tail.start]),
        end=np.concatenate([body.end[keep], tail.end]),
        doc=np.concatenate([body.doc[keep], tail.doc]),
    )


def attention_work(lengths: np.ndarray, shards: Shards, cp: int, tile: int = TILE) -> np.ndarray:
    """Per rank causal attention work in token^2 units, each query segment padded to a multiple of `tile`
    (tile=1: exact work). A segment is what the runtime hands the varlen kernel (runtime/context_parallel.py
    cuts a rank's merged ranges at document boundaries into runs): a rank's adjacent ranges of one document
    form one segment, its separate ranges of a document (per-document sharding's chunk pair, a remainder
    token) are segments of their own."""
    starts = _doc_starts(np.asarray(lengths, dtype=np.int64))
    order = np.lexsort((shards.start, shards.rank))
    rank, start, end, doc = shards.rank[order], shards.start[order], shards.end[order], shards.doc[order]
    joins = np.r_[False, (rank[1:] == rank[:-1]) & (doc[1:] == doc[:-1]) & (start[1:] == end[:-1])]
    seg = np.cumsum(~joins) - 1  # segment id per range
    s = (start - starts[doc]).astype(np.float64)
    e = (end - starts[doc]).astype(np.float64)
    work = np.bincount(seg, weights=e * e - s * s)
    tokens = np.bincount(seg, weights=e - s)
    pad = np.where(tokens > 0, np.ceil(tokens / tile) * tile / np.maximum(tokens, 1), 0.0)
    seg_rank = rank[np.r_[True, ~joins[1:]]]
    return np.bincount(seg_rank, weights=work * pad, minlength=cp)


def adaptive_shard(lengths: np.ndarray, cp: int, a: float, tile: int = TILE) -> CPSharding:
    """The cheaper of per-sequence and per-document sharding for one packed micro-batch (ties: the
    coarser per-sequence)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    options: dict[Strategy, tuple[Shards, np.ndarray]] = {}
    name: Strategy
    for name, fn in (("per-sequence", shard_per_sequence), ("per-document", shard_per_document)):
        sh = fn(lengths, cp)
        options[name] = (sh, a * cp * attention_work(lengths, sh, cp, tile))
    best: Strategy = min(options, key=lambda k: options[k][1].max())
    other = next(k for k in options if k != best)
    sh, t = options[best]
    return CPSharding(strategy=best, ranges=sh.ranges(cp), attention_s=t, other_s=float(options[other][1].max()))


def annotate_cp(pipe: PlanPipeline, scheme: Scheme, micro_batches: list[np.ndarray]) -> None:
    """Record adaptive CP sharding on a plan pipeline with cp > 1: per micro-batch `cp_shard` (strategy,
    per-rank [start, end) token ranges of its packed sequence, slowest rank's attention time of the
    chosen and of the other strategy)."""
    if scheme.cp == 1:
        return
    for mb, lengths in zip(pipe.micro_batches, micro_batches, strict=True):
        sh = adaptive_shard(lengths, scheme.cp, scheme.time.a)
        mb.cp_shard = CPShard(strategy=sh.strategy, ranges=sh.ranges, attention_s=sh.max_s, other_s=sh.other_s)
