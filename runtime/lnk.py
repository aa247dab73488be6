"""Optimization-propagation disaggregation (Hydraulis §5.2): pull parameters, push gradients, via LNK.

Optimization phase: every parameter's flattened canonical tensor (runtime/model.py) is cut into N
contiguous shards, shard r = [r*n//N, (r+1)*n//N) owned by rank r, which keeps the fp32 master copy and
the Adam state of it for the whole run, whatever the strategy. Rank r stores its shards of all parameters
back to back in one flat buffer (canonical parameter order).

Propagation phase: a rank running stage s of a pipeline with TP degree tp at TP rank t needs, for every
parameter of that stage, the flat range [t*n/tp, (t+1)*n/tp) if the parameter is TP-sharded, else all
of it. So both phases hold plain intervals of the same flat tensor, and what rank a sends to rank b is the
intersection of a's interval with b's: one contiguous piece per (sender, receiver, parameter). Those
pieces are exactly runs of the paper's mutual slices, the common refinement of the N owner shards and the
TP shards of every pipeline (LCM(N, TPmax) even segments when the degrees divide the tensor and divide each
other); computing them as intersections also covers numels and degrees that do not divide evenly.

pull: owners send pieces (cast to the compute dtype first, the paper's "To" before LNK), local pieces are
  copied, the rest go through one all_to_all_single with per-peer splits (gloo and NCCL both support
  uneven splits, unlike all_gather).
push: TP rank t contributes chunk t of each of its stage's TP-sharded gradients and the whole of its
  gradient of a replicated parameter (a norm weight, which each TP rank applied to its own tokens' SP rows:
  a partial gradient), pieces go to the owners, which sum the contributions of all pipelines and TP ranks.
  So the TP ranks' partial norm gradients meet once per iteration, in the owners' sum, and no collective
  runs for them in the backward (Megatron all-reduces them once per iteration too). The CP ranks of a
  stage hold the same slices, each with the partial gradient of its own tokens: to LNK they are replicas
  like other pipelines (the same Role), each contributes its part and the owners' sum covers them too. So
  every owner shard still takes one update from the sum of all contributions. For a homogeneous strategy
  pull is an all-gather and push a reduce-scatter (tested); PP and CP never cut a tensor, so only TP and the
  owner shards shape the pieces.

The planning (`plan_link`) is pure numpy, the same on every rank, so no sizes are ever exchanged; it works on
every layer group and push round in one pass (a step with a new strategy waits for none of it: the runtime
makes it ahead, runtime/run_plan.py). Running the exchanges, a bounded number of layer groups at a time, is
runtime/lnk_streams.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from operator import itemgetter

import numpy as np
import torch


@dataclass(frozen=True)
class Role:
    """What one rank computes in an iteration: the parameters of its stage, for its TP rank."""

    params: tuple[int, ...]
    tp: int = 1
    tp_rank: int = 0


def owner_ranges(numels: np.ndarray, world: int) -> tuple[np.ndarray, np.ndarray]:
    """[world, P] lo/hi of the flat range of each parameter each rank owns."""
    r = np.arange(world, dtype=np.int64)[:, None]
    return r * numels[None, :] // world, (r + 1) * numels[None, :] // world


def role_ranges(numels: np.ndarray, sharded: np.ndarray, roles: Sequence[Role | None]) -> tuple[np.ndarray, np.ndarray]:
    """[world, P] lo/hi each rank holds during propagation (lo == hi: nothing): its TP chunk of a sharded
    parameter, a replicated one whole (what pull delivers, and push sends back)."""
    lo, hi, row = _role_rows(numels, sharded, roles)
    return lo[row], hi[row]


def _role_rows(numels: np.ndarray, sharded: np.ndarray,
               roles: Sequence[Role | None]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """role_ranges once per distinct Role (the replicas of a stage share one): [U + 1, P] lo/hi, the last row
    an idle rank's, and each rank's row (-1: idle)."""
    index: dict[Role, int] = {}
    row = np.array([-1 if role is None else index.setdefault(role, len(index)) for role in roles], dtype=np.int64)
    lo = np.zeros((len(index) + 1, len(numels)), dtype=np.int64)  # the last row: an idle rank's (row -1)
    hi = np.zeros_like(lo)
    for role, u in index.items():
        p = np.asarray(role.params, dtype=np.int64)
        n = numels[p]
        chunk = sharded[p]
        lo[u, p] = np.where(chunk, role.tp_rank * n // role.tp, 0)
        hi[u, p] = np.where(chunk, (role.tp_rank + 1) * n // role.tp, n)
    return lo, hi, row


@dataclass(frozen=True)
class Pieces:
    """One rank's side of an exchange: contiguous (param, [lo, hi)) pieces ordered by (peer, param),
    the order both ends derive independently."""

    peer: np.ndarray
    param: np.ndarray
    lo: np.ndarray
    hi: np.ndarray

    @property
    def size(self) -> np.ndarray:
        return self.hi - self.lo


def _intersect(lo_a, hi_a, lo_b, hi_b) -> Pieces:
    lo, hi = np.maximum(lo_a, lo_b), np.minimum(hi_a, hi_b)
    peer, param = np.nonzero(hi > lo)  # row-major: sorted by (peer, param)
    return Pieces(peer, param, lo[peer, param], hi[peer, param])


@dataclass(frozen=True)
class Exchange:
    send: Pieces
    recv: Pieces


def _by_group(lo_a, hi_a, lo_b, hi_b, gidx: np.ndarray) -> Pieces:
    """_intersect's pieces in (layer group, peer, param) order, the order compile_exchange works in
    (`gidx`: each parameter's group, non-decreasing): one stable radix sort of the (peer, param) pieces by group."""
    lo, hi = np.maximum(lo_a, lo_b), np.minimum(hi_a, hi_b)
    flat = np.flatnonzero(hi > lo)  # row-major: (peer, param) order
    nparams = lo.shape[1]
    flat = flat[_stable_order(gidx[flat % nparams], int(gidx[-1]) + 1 if len(gidx) else 0)]
    peer, param = np.divmod(flat, nparams)
    return Pieces(peer, param, lo.ravel()[flat], hi.ravel()[flat])


def _per_peer(distinct: Pieces, row: np.ndarray, gidx: np.ndarray, ngroups: int) -> tuple[np.ndarray, np.ndarray]:
    """_by_group of one range against every rank's role range, from its pieces against each distinct role's
    (`distinct`: _by_group order, peer = role row) repeated for the ranks playing it (`row`, -1: idle): no
    [world, P] pass and no sort, whatever the world. The peer of each and which distinct piece it repeats."""
    nroles = int(row.max(initial=-1)) + 1
    cnt = np.bincount(gidx[distinct.param] * nroles + distinct.peer, minlength=ngroups * nroles)
    first = _exclusive(cnt).reshape(ngroups, nroles)
    peers = np.flatnonzero(row >= 0)
    c, at = cnt.reshape(ngroups, nroles)[:, row[peers]].ravel(), first[:, row[peers]].ravel()  # (group, peer) order
    idx = np.repeat(at - _exclusive(c), c) + np.arange(int(c.sum()), dtype=np.int64)
    return np.repeat(np.tile(peers, ngroups), c), idx


def plan_exchange(src: tuple[np.ndarray, np.ndarray], dst: tuple[np.ndarray, np.ndarray], rank: int) -> Exchange:
    """Pieces `rank` sends (its src range cut by every peer's dst range) and receives (vice versa)."""
    (slo, shi), (dlo, dhi) = src, dst
    return Exchange(send=_intersect(slo[rank][None, :], shi[rank][None, :], dlo, dhi),
                    recv=_intersect(slo, shi, dlo[rank][None, :], dhi[rank][None, :]))


@dataclass(frozen=True)
class FlatLayout:
    """Where the range [lo[p], hi[p]) of each parameter p sits in a rank's flat local buffer."""

    lo: np.ndarray
    hi: np.ndarray
    offset: np.ndarray
    total: int

    @classmethod
    def of(cls, lo: np.ndarray, hi: np.ndarray) -> "FlatLayout":
        sizes = hi - lo
        offset = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
        return cls(lo, hi, offset, int(sizes.sum()))

    def starts(self, pieces: Pieces) -> np.ndarray:
        return self.offset[pieces.param] + pieces.lo - self.lo[pieces.param]


@dataclass(frozen=True, eq=False)
class Gather:
    """Copy ranges of a flat source into one contiguous buffer, in a given order, with one torch.cat (made by
    _gathers and _tiling).

    The source is cut once at every range boundary (`split` makes views, no copy) and each range is a run
    of those segments, so overlapping ranges (an owner sending one slice to several replicas) and gaps
    (what is not sent) need no per-piece Python: packing is one split, one C-level list pick and one cat.
    Both index arrays stay numpy (views of the planner's arrays): planning makes no Python object per piece
    (300K pieces per direction at 1024-way data parallelism); their list forms are made on the first call, on
    the LNK thread, and kept for the strategy's later iterations."""

    seg_sizes: np.ndarray  # partition of the source
    ids: np.ndarray  # segments in output order
    total: int

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Gather) and self.total == other.total and \
            np.array_equal(self.seg_sizes, other.seg_sizes) and np.array_equal(self.ids, other.ids)

    __hash__ = None  # type: ignore[assignment]  # numpy fields: compared by value, not hashable

    @cached_property
    def _lists(self) -> tuple[list[int], list[int]]:
        return self.seg_sizes.tolist(), self.ids.tolist()

    def __call__(self, src: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        if not len(self.ids):
            return out
        sizes, ids = self._lists
        chunks = src.split(sizes)
        return torch.cat([chunks[i] for i in ids] if len(ids) < 2 else itemgetter(*ids)(chunks), out=out)


@dataclass(frozen=True)
class GroupExchange:
    """One layer group's exchange on one rank, compiled once per strategy: pack the source range into one
    send buffer (pieces already coalesced per peer, peers in rank order), one all_to_all_single, then
    unpack. `rounds`: pull has one (the received pieces tile the destination range exactly); push has one
    per contribution an owner element receives (each round tiles the owner range, padded from a zero tail
    of the receive buffer where a segment has fewer contributions) and the rounds are summed. `stacked`:
    (start, count) when round r is the receive buffer's [start + r*n, start + (r+1)*n) for each of count >= 2
    rounds (n the owner range: each peer sends it whole, as in a data-parallel layout); the push sum is then
    one batched reduction of a [count, n] view and `rounds` is empty (no gather per round is ever built)."""

    src: tuple[int, int]  # [lo, hi) in the source layout
    dst: tuple[int, int]  # [lo, hi) in the destination layout
    send_splits: list[int]
    recv_splits: list[int]
    pack: Gather
    rounds: tuple[Gather, ...]
    zero_tail: int
    stacked: tuple[int, int] | None = None

    @property
    def recv_total(self) -> int:
        return sum(self.recv_splits)


_KEY = 40  # composite sort keys batch << _KEY | offset: offsets below 2**40 elements, batches below 2**23


def _keys(batch: np.ndarray, offset: np.ndarray) -> np.ndarray:
    return (batch << _KEY) + offset


def _cuts(lengths: np.ndarray, batch: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every batch b's [0, lengths[b]] cut at the starts and ends of its ranges: the sorted distinct cut keys
    (_keys) and where each batch's cuts begin in them (nb + 1 entries)."""
    nb = len(lengths)
    if nb >= 1 << (63 - _KEY) or (nb and int(lengths.max()) >= 1 << _KEY):
        raise ValueError(f"LNK planning: {nb} batches or {int(lengths.max(initial=0))} elements exceed the key range")
    b = np.arange(nb, dtype=np.int64)
    keys = np.sort(np.concatenate((_keys(b, 0), _keys(b, lengths), _keys(batch, starts), _keys(batch, ends))))
    keys = keys[np.concatenate((keys[:1] == keys[:1], keys[1:] != keys[:-1]))]  # np.unique hashes: 20x slower here
    return keys, np.searchsorted(keys >> _KEY, np.arange(nb + 1))


def _gathers(batch: np.ndarray, starts: np.ndarray, sizes: np.ndarray, lengths: np.ndarray,
             cuts: tuple[np.ndarray, np.ndarray] | None = None, via: np.ndarray | None = None) -> list[Gather]:
    """The Gathers of many batches in one numpy pass: batch b copies the ranges with batch == b (batch
    non-decreasing, ranges in output order) out of a source of lengths[b] elements. A push group has a
    round per contribution (1024 at 1024-way data parallelism), so one numpy round per Gather is what made
    planning take seconds. `cuts`: _cuts of these batches when known (from the distinct ranges only). `via`:
    the ranges are the (non-empty) given ones taken at `via`, so each distinct range is searched once (an owner
    sends its slice for a role to every rank playing it)."""
    if via is None:
        keep = sizes > 0
        batch, starts, sizes = batch[keep], starts[keep], sizes[keep]
    starts, sizes = starts.astype(np.int64), sizes.astype(np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    keys, first = cuts or _cuts(lengths, batch, starts, starts + sizes)
    a = np.searchsorted(keys, _keys(batch, starts))
    counts = np.searchsorted(keys, _keys(batch, starts + sizes)) - a
    if via is not None:
        batch, sizes, a, counts = batch[via], sizes[via], a[via], counts[via]
    before = np.cumsum(counts) - counts
    ids = np.repeat(a - first[batch] - before, counts) + np.arange(int(counts.sum()), dtype=np.int64)
    nb = len(lengths)
    per = np.concatenate(([0], np.cumsum(np.bincount(batch, weights=counts, minlength=nb)))).astype(np.int64).tolist()
    totals = np.bincount(batch, weights=sizes, minlength=nb).astype(np.int64).tolist()
    seg, fl = np.diff(keys & ((1 << _KEY) - 1)), first.tolist()
    return [Gather(seg[fl[b]:fl[b + 1] - 1], ids[per[b]:per[b + 1]], totals[b]) for b in range(nb)]


def _exclusive(x: np.ndarray) -> np.ndarray:
    return np.cumsum(x) - x


def _stable_order(keys: np.ndarray, bound: int) -> np.ndarray:
    """Stable argsort of small non-negative ints (numpy radix-sorts 16-bit keys: linear in the pieces)."""
    return np.argsort(keys.astype(np.uint16) if bound <= 1 << 16 else keys, kind="stable")


@dataclass(frozen=True)
class _Side:
    """One side's pieces of an exchange, regrouped by layer group (stable: (peer, param) order within each),
    with offsets relative to the group's range of the layout."""

    group: np.ndarray
    peer: np.ndarray
    param: np.ndarray
    start: np.ndarray
    size: np.ndarray
    lo: np.ndarray  # [G] the group's range in the layout
    hi: np.ndarray
    _splits: list[list[int]] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def of(cls, pieces: Pieces, layout: FlatLayout, gidx: np.ndarray, ngroups: int) -> "_Side":
        """`pieces` in (group, peer, param) order (_by_group)."""
        g = gidx[pieces.param]
        lo, hi = cls.ranges(layout, gidx, ngroups)
        return cls(g, pieces.peer, pieces.param, layout.starts(pieces) - lo[g], pieces.size, lo, hi)

    @staticmethod
    def ranges(layout: FlatLayout, gidx: np.ndarray, ngroups: int) -> tuple[np.ndarray, np.ndarray]:
        """Each group's [lo, hi) in the layout (its parameters are contiguous)."""
        first = np.searchsorted(gidx, np.arange(ngroups))
        last = np.searchsorted(gidx, np.arange(ngroups), side="right") - 1
        lo = layout.offset[first]
        return lo, layout.offset[last] + (layout.hi - layout.lo)[last]

    def splits(self, world: int) -> list[list[int]]:
        """Per group, the elements each peer's pieces hold (made once: pull and push share a side)."""
        if self._splits is None:
            object.__setattr__(self, "_splits", np.bincount(
                self.group * world + self.peer, weights=self.size,
                minlength=len(self.lo) * world).astype(np.int64).reshape(len(self.lo), world).tolist())
        return self._splits

    @cached_property
    def counts(self) -> np.ndarray:
        return np.bincount(self.group, minlength=len(self.lo))

    @cached_property
    def totals(self) -> np.ndarray:
        return np.bincount(self.group, weights=self.size, minlength=len(self.lo)).astype(np.int64)


def _owner_cuts(side: _Side) -> tuple[np.ndarray, np.ndarray]:
    """_cuts of the owner side of both exchanges (pull's send source, push's destination): the owned range
    cut where some role's range starts or ends. `side`: the owned range cut by each distinct role once
    (peer = role row), the same boundaries as cutting it by every rank's, which repeat them."""
    return _cuts(side.hi - side.lo, side.group, side.start, side.start + side.size)


def _tiling(side: _Side, nparams: int, unpack: bool, what: str) -> list[Gather]:
    """Gathers of the rank's own side, whose pieces tile each group's range of its stage layout (owners cut
    every parameter into a partition): the segments are the pieces themselves, in layout order (param, then
    peer), so nothing is searched. unpack (pull): from the receive buffer (the side's (peer, param) order)
    into layout order; else (push's pack) from the layout into the side's order."""
    lay = _stable_order(side.param, nparams)
    counts, totals = side.counts, side.totals
    first = _exclusive(counts)
    if not np.array_equal(_exclusive(side.size[lay]) - _exclusive(totals)[side.group[lay]], side.start[lay]) or \
            not np.array_equal(totals, side.hi - side.lo):
        raise ValueError(f"{what} pieces do not tile the rank's stage layout")
    if unpack:
        seg, ids = side.size, lay - first[side.group[lay]]
    else:
        pos = np.empty_like(lay)
        pos[lay] = np.arange(len(lay))
        seg, ids = side.size[lay], pos - first[side.group]
    cut, totals = np.cumsum(counts).tolist(), totals.tolist()
    return [Gather(seg[c - n:c], ids[c - n:c], t) for n, c, t in zip(counts.tolist(), cut, totals)]


def _stacked_whole(d: _Side, row: np.ndarray) -> list[tuple[int, int] | None] | None:
    """GroupExchange.stacked of every group when each peer contributing to a group sends its owner range whole
    and in order (a data-parallel layout): contribution k is then peer block k of the receive buffer, and
    _push_rounds need not search the 300K contributions of 1024 peers. Decided per distinct role (`d`: the
    owner side cut by each role, peer = role row; `row`: each rank's role, -1 idle). None when some group is not
    so, or has a single contributor (one round, built)."""
    if not len(d.size):
        return None
    new = np.ones(len(d.size), dtype=bool)  # the first piece of each (group, role) block
    new[1:] = (d.group[1:] != d.group[:-1]) | (d.peer[1:] != d.peer[:-1])
    end = d.start + d.size
    last = np.append(new[1:], True)
    if not np.array_equal(d.start[1:][~new[1:]], end[:-1][~new[1:]]) or np.any(d.start[new]) or \
            not np.array_equal(end[last], (d.hi - d.lo)[d.group[last]]):
        return None
    has = np.zeros((len(d.lo), int(row.max()) + 1), dtype=bool)
    has[d.group[new], d.peer[new]] = True
    blocks = has[:, row[row >= 0]].sum(axis=1)
    if np.any(blocks == 1):
        return None
    return [(0, c) if c else None for c in blocks.tolist()]


def _push_rounds(r: _Side, total: np.ndarray, cuts: tuple[np.ndarray, np.ndarray]
                 ) -> tuple[list[tuple[Gather, ...]], np.ndarray, list[tuple[int, int] | None]]:
    """Per group, the rounds that tile the owner range [0, n) with each segment's k-th contribution (in piece
    order) from the receive buffer, or zeros from its tail at `total` (rounds for a stacked group are not
    built), the zero tail's size and GroupExchange.stacked; all groups in one numpy pass. `cuts`: the owner
    range's segments (_owner_cuts)."""
    ng = len(r.lo)
    n = r.hi - r.lo
    recv_off = _exclusive(r.size) - _exclusive(total)[r.group]  # where each piece lands in its group's buffer
    keys = cuts[0]
    kb, kv = keys >> _KEY, keys & ((1 << _KEY) - 1)
    is_seg = kb[:-1] == kb[1:]  # consecutive cuts of one group bound a segment
    seg_lo, seg_size, seg_g = kv[:-1][is_seg], np.diff(kv)[is_seg], kb[:-1][is_seg]
    seg_of_key = np.cumsum(is_seg) - 1
    a_key = np.searchsorted(keys, _keys(r.group, r.start))
    counts = np.searchsorted(keys, _keys(r.group, r.start + r.size)) - a_key
    piece = np.repeat(np.arange(len(r.size)), counts)
    seg = np.repeat(seg_of_key[a_key] - _exclusive(counts), counts) + np.arange(int(counts.sum()), dtype=np.int64)
    order = _stable_order(seg, len(seg_size))  # by segment, then piece: the k-th contribution of each segment
    seg, piece = seg[order], piece[order]
    per_seg = np.bincount(seg, minlength=len(seg_size))
    k = np.arange(len(seg)) - _exclusive(per_seg)[seg]
    src = recv_off[piece] + seg_lo[seg] - r.start[piece]
    most, fewest, widest = np.zeros(ng, np.int64), np.full(ng, np.iinfo(np.int64).max), np.zeros(ng, np.int64)
    np.maximum.at(most, seg_g, per_seg)
    np.minimum.at(fewest, seg_g, per_seg)
    np.maximum.at(widest, seg_g, seg_size)
    has = r.counts > 0
    tail = np.where(has & (fewest < most), widest, 0)
    rounds = np.where(has, most, 0)
    eg = seg_g[seg]  # each contribution's group
    seg_first = np.searchsorted(seg_g, np.arange(ng))
    first_src = src[np.minimum(np.searchsorted(eg, np.arange(ng)), len(src) - 1)] if len(src) else np.zeros(ng, np.int64)
    off = src != first_src[eg] + k * n[eg] + seg_lo[seg]
    stacked = has & (tail == 0) & (rounds >= 2) & (np.bincount(eg, weights=off, minlength=ng) == 0)
    # the rounds of the other groups: batch (g, k) lists g's segments, filled where a segment has a k-th contribution
    built = np.where(stacked, 0, rounds)
    batch_g = np.repeat(np.arange(ng), built)
    nseg = np.bincount(seg_g, minlength=ng)[batch_g]
    range_first = _exclusive(nseg)
    range_batch = np.repeat(np.arange(len(batch_g)), nseg)
    range_seg = seg_first[batch_g][range_batch] + np.arange(int(nseg.sum()), dtype=np.int64) - range_first[range_batch]
    starts = total[batch_g][range_batch]
    m = ~stacked[eg]
    starts[range_first[_exclusive(built)[eg[m]] + k[m]] + seg[m] - seg_first[eg[m]]] = src[m]
    gathers = _gathers(range_batch, starts, seg_size[range_seg], (total + tail)[batch_g])
    per_group = [tuple(gathers[c - b:c]) for b, c in zip(built.tolist(), np.cumsum(built).tolist())]
    first_src, rounds = first_src.tolist(), rounds.tolist()
    return per_group, tail, [(first_src[g], rounds[g]) if s else None for g, s in enumerate(stacked.tolist())]


def compile_exchange(s: _Side, r: _Side, nparams: int, world: int, roles: tuple[_Side, np.ndarray, np.ndarray],
                     push: bool) -> list[GroupExchange]:
    """The exchange, its send and receive sides (_Side.of), cut into one GroupExchange per layer group, all groups
    in one numpy pass, once per strategy. Pull sends from the owner side to the stage side, push the other way
    (the same two sides: an intersection is the same piece both ways); `roles`: the owner side cut by each
    distinct role (peer = role row), which of its pieces each owner-side piece repeats (_per_peer) and each
    rank's role row."""
    cuts = _owner_cuts(roles[0])
    ngroups = len(s.lo)
    total = r.totals
    if push:
        packs = _tiling(s, nparams, unpack=False, what="push")
        stacked = _stacked_whole(roles[0], roles[2])
        if stacked is None:
            rounds, tail, stacked = _push_rounds(r, total, cuts)
        else:
            rounds, tail = [()] * ngroups, np.zeros(ngroups, np.int64)
    else:
        d, via, _ = roles
        packs = _gathers(d.group, d.start, d.size, s.hi - s.lo, cuts, via)
        rounds = [(g,) for g in _tiling(r, nparams, unpack=True, what="pull")]
        tail, stacked = np.zeros(ngroups, np.int64), [None] * ngroups
    send_splits, recv_splits = s.splits(world), r.splits(world)
    s_lo, s_hi, d_lo, d_hi, tail = s.lo.tolist(), s.hi.tolist(), r.lo.tolist(), r.hi.tolist(), tail.tolist()
    return [GroupExchange((s_lo[g], s_hi[g]), (d_lo[g], d_hi[g]), send_splits[g], recv_splits[g], packs[g], rounds[g],
                          tail[g], stacked[g]) for g in range(ngroups)]


@dataclass(frozen=True)
class LinkPlan:
    """Everything one rank needs to pull and push for one strategy. `pull` and `push`, the exchanges' pieces in
    (peer, param) order, are made when read (the runtime reads only the compiled groups)."""

    rank: int
    world: int
    owned: FlatLayout  # the rank's optimizer shard buffer
    local: FlatLayout  # the rank's stage parameters (and gradients), flattened in canonical order
    group_params: tuple[np.ndarray, ...]  # parameter indices of each layer group, in canonical order
    pull_groups: tuple[GroupExchange, ...]
    push_groups: tuple[GroupExchange, ...]
    roles: tuple[np.ndarray, np.ndarray, np.ndarray] = field(repr=False)  # _role_rows, for pull and push
    numels: np.ndarray = field(repr=False)

    def needed(self, g: int) -> bool:
        """Whether this rank's stage holds anything of group g (what it waits for, and contributes)."""
        return self.pull_groups[g].dst[1] > self.pull_groups[g].dst[0]

    def _ranges(self) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
        lo, hi, row = self.roles
        return owner_ranges(self.numels, self.world), (lo[row], hi[row])

    @cached_property
    def pull(self) -> Exchange:
        owners, needs = self._ranges()
        return plan_exchange(owners, needs, self.rank)

    @cached_property
    def push(self) -> Exchange:
        owners, needs = self._ranges()
        return plan_exchange(needs, owners, self.rank)


def plan_link(numels: Sequence[int], sharded: Sequence[bool], roles: Sequence[Role | None], rank: int,
              groups: Sequence[int] | None = None) -> LinkPlan:
    """Pure: the pieces `rank` sends and receives in pull and push when rank i plays roles[i], compiled
    per layer group (`groups[p]`: non-decreasing group id of parameter p, e.g. its layer; default one group)."""
    numels = np.asarray(numels, dtype=np.int64)
    gid = np.zeros(len(numels), dtype=np.int64) if groups is None else np.asarray(groups, dtype=np.int64)
    if np.any(np.diff(gid) < 0):
        raise ValueError("groups must be non-decreasing in canonical parameter order")
    values, gidx = np.unique(gid, return_inverse=True)
    ngroups = len(values)
    group_params = tuple(np.flatnonzero(gidx == g) for g in range(ngroups))
    sharded = np.asarray(sharded, dtype=bool)
    world = len(roles)
    olo, ohi = owner_ranges(numels, world)
    ulo, uhi, row = _role_rows(numels, sharded, roles)
    nlo, nhi = ulo[row], uhi[row]
    owned = FlatLayout.of(olo[rank], ohi[rank])
    local = FlatLayout.of(nlo[rank], nhi[rank])
    distinct = _by_group(owned.lo[None], owned.hi[None], ulo[:-1], uhi[:-1], gidx)  # the owner shard by each role
    peer, via = _per_peer(distinct, row, gidx, ngroups)  # what the rank's owner shard meets, per peer
    needs = _by_group(olo, ohi, nlo[rank][None], nhi[rank][None], gidx)  # what its stage range meets
    d = _Side.of(distinct, owned, gidx, ngroups)
    owner = _Side(d.group[via], peer, d.param[via], d.start[via], d.size[via], d.lo, d.hi)  # d's, repeated
    stage = _Side.of(needs, local, gidx, ngroups)
    by_role = (d, via, row)
    return LinkPlan(
        rank=rank, world=world, owned=owned, local=local, group_params=group_params,
        pull_groups=tuple(compile_exchange(owner, stage, len(numels), world, by_role, push=False)),
        push_groups=tuple(compile_exchange(stage, owner, len(numels), world, by_role, push=True)),
        roles=(ulo, uhi, row), numels=numels,
    )
