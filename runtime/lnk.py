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

The planning (`plan_link`) is pure numpy, the same on every rank, so no sizes are ever exchanged; running the
exchanges, a bounded number of layer groups at a time, is runtime/lnk_streams.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
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
    lo = np.zeros((len(roles), len(numels)), dtype=np.int64)
    hi = np.zeros_like(lo)
    for r, role in enumerate(roles):
        if role is None:
            continue
        p = np.asarray(role.params, dtype=np.int64)
        n = numels[p]
        chunk = sharded[p]
        lo[r, p] = np.where(chunk, role.tp_rank * n // role.tp, 0)
        hi[r, p] = np.where(chunk, (role.tp_rank + 1) * n // role.tp, n)
    return lo, hi


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


@dataclass(frozen=True)
class Gather:
    """Copy ranges of a flat source into one contiguous buffer, in a given order, with one torch.cat.

    The source is cut once at every range boundary (`split` makes views, no copy) and each range is a run
    of those segments, so overlapping ranges (an owner sending one slice to several replicas) and gaps
    (what is not sent) need no per-piece Python: packing is one split, one C-level list pick and one cat."""

    seg_sizes: tuple[int, ...]  # partition of the source
    ids: tuple[int, ...]  # segments in output order
    total: int

    @classmethod
    def of(cls, starts: np.ndarray, sizes: np.ndarray, src_len: int) -> "Gather":
        keep = sizes > 0
        starts, sizes = starts[keep].astype(np.int64), sizes[keep].astype(np.int64)
        bounds = np.unique(np.concatenate(([0, src_len], starts, starts + sizes)))
        a = np.searchsorted(bounds, starts)
        counts = np.searchsorted(bounds, starts + sizes) - a
        first = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64)
        ids = np.repeat(a - first, counts) + np.arange(int(counts.sum()), dtype=np.int64)
        return cls(tuple(np.diff(bounds).tolist()), tuple(ids.tolist()), int(sizes.sum()))

    def contiguous_start(self) -> int | None:
        """Where in the source the output lies as one contiguous run (the gather is a view), or None."""
        if not self.ids or any(b != a + 1 for a, b in zip(self.ids, self.ids[1:])):
            return None
        return sum(self.seg_sizes[:self.ids[0]])

    def __call__(self, src: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        if not self.ids:
            return out
        chunks = src.split(self.seg_sizes)
        return torch.cat([chunks[i] for i in self.ids] if len(self.ids) < 2 else itemgetter(*self.ids)(chunks), out=out)


@dataclass(frozen=True)
class GroupExchange:
    """One layer group's exchange on one rank, compiled once per strategy: pack the source range into one
    send buffer (pieces already coalesced per peer, peers in rank order), one all_to_all_single, then
    unpack. `rounds`: pull has one (the received pieces tile the destination range exactly); push has one
    per contribution an owner element receives (each round tiles the owner range, padded from a zero tail
    of the receive buffer where a segment has fewer contributions) and the rounds are summed. `stacked`: when
    round r is the receive buffer's [start + r*n, start + (r+1)*n) for every r (n the owner range: each peer
    sends it whole, as in a data-parallel layout), that start: the push sum is then one batched reduction of
    a [rounds, n] view instead of one gather and add per round."""

    src: tuple[int, int]  # [lo, hi) in the source layout
    dst: tuple[int, int]  # [lo, hi) in the destination layout
    send_splits: list[int]
    recv_splits: list[int]
    pack: Gather
    rounds: tuple[Gather, ...]
    zero_tail: int
    stacked: int | None = None

    @property
    def recv_total(self) -> int:
        return sum(self.recv_splits)


def _group_range(layout: FlatLayout, params: np.ndarray) -> tuple[int, int]:
    if len(params) == 0:
        return 0, 0
    lo = int(layout.offset[params[0]])
    return lo, lo + int((layout.hi - layout.lo)[params].sum())


def _rounds(dst_start: np.ndarray, size: np.ndarray, recv_off: np.ndarray, n: int, tail: int) -> tuple[list[Gather], int]:
    """Per round k, the ranges of the receive buffer that tile [0, n) of the destination with each
    segment's k-th contribution (in piece order), or zeros from the tail at `tail`; and the tail's size."""
    keep = size > 0
    dst_start, size, recv_off = dst_start[keep], size[keep], recv_off[keep]
    bounds = np.unique(np.concatenate(([0, n], dst_start, dst_start + size)))
    seg_lo, seg_size = bounds[:-1], np.diff(bounds)
    a = np.searchsorted(bounds, dst_start)
    counts = np.searchsorted(bounds, dst_start + size) - a
    piece = np.repeat(np.arange(len(size)), counts)
    first = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64)
    seg = np.repeat(a - first, counts) + np.arange(int(counts.sum()), dtype=np.int64)
    order = np.lexsort((piece, seg))  # by segment, then piece: the k-th contribution of each segment
    seg, piece = seg[order], piece[order]
    k = np.arange(len(seg)) - np.searchsorted(seg, seg)  # rank of each contribution within its segment
    src = recv_off[piece] + seg_lo[seg] - dst_start[piece]
    per_seg = np.bincount(seg, minlength=len(seg_size))
    if len(seg) == 0:
        return [], 0
    zero_tail = int(seg_size.max()) if per_seg.min() < per_seg.max() else 0
    out = []
    for r in range(int(per_seg.max())):
        starts = np.full(len(seg_size), tail, dtype=np.int64)
        pick = k == r
        starts[seg[pick]] = src[pick]
        out.append(Gather.of(starts, seg_size, tail + zero_tail))
    return out, zero_tail


def _stacked(rounds: list[Gather], n: int) -> int | None:
    """GroupExchange.stacked of these rounds (None: not one regular [rounds, n] view)."""
    starts = [r.contiguous_start() for r in rounds]
    if len(rounds) < 2 or starts[0] is None or any(s != starts[0] + k * n for k, s in enumerate(starts)):
        return None
    return starts[0]


def compile_exchange(ex: Exchange, src: FlatLayout, dst: FlatLayout, group_params: list[np.ndarray], world: int,
                     accumulate: bool) -> list[GroupExchange]:
    """The exchange cut into one GroupExchange per layer group (pure numpy, once per strategy)."""
    s_start, r_start = src.starts(ex.send), dst.starts(ex.recv)
    out = []
    for params in group_params:
        s_lo, s_hi = _group_range(src, params)
        d_lo, d_hi = _group_range(dst, params)
        ms = np.isin(ex.send.param, params)
        mr = np.isin(ex.recv.param, params)
        send_size, recv_size = ex.send.size[ms], ex.recv.size[mr]
        send_splits = np.bincount(ex.send.peer[ms], weights=send_size, minlength=world).astype(np.int64).tolist()
        recv_splits = np.bincount(ex.recv.peer[mr], weights=recv_size, minlength=world).astype(np.int64).tolist()
        pack = Gather.of(s_start[ms] - s_lo, send_size, s_hi - s_lo)
        recv_off = np.concatenate(([0], np.cumsum(recv_size)[:-1])).astype(np.int64)
        total, n = int(recv_size.sum()), d_hi - d_lo
        tail = 0
        if accumulate:
            rounds, tail = _rounds(r_start[mr] - d_lo, recv_size, recv_off, n, total)
        else:
            order = np.argsort(r_start[mr], kind="stable")
            if not np.array_equal(np.cumsum(recv_size[order]) - recv_size[order], r_start[mr][order] - d_lo) or total != n:
                raise ValueError("pull pieces do not tile the destination")
            rounds = [Gather.of(recv_off[order], recv_size[order], total)]
        out.append(GroupExchange((s_lo, s_hi), (d_lo, d_hi), send_splits, recv_splits, pack, tuple(rounds), tail,
                                 _stacked(rounds, n) if accumulate and tail == 0 else None))
    return out


@dataclass(frozen=True)
class LinkPlan:
    """Everything one rank needs to pull and push for one strategy."""

    rank: int
    world: int
    owned: FlatLayout  # the rank's optimizer shard buffer
    local: FlatLayout  # the rank's stage parameters (and gradients), flattened in canonical order
    pull: Exchange
    push: Exchange
    group_params: tuple[np.ndarray, ...]  # parameter indices of each layer group, in canonical order
    pull_groups: tuple[GroupExchange, ...]
    push_groups: tuple[GroupExchange, ...]

    def needed(self, g: int) -> bool:
        """Whether this rank's stage holds anything of group g (what it waits for, and contributes)."""
        return self.pull_groups[g].dst[1] > self.pull_groups[g].dst[0]


def plan_link(numels: Sequence[int], sharded: Sequence[bool], roles: Sequence[Role | None], rank: int,
              groups: Sequence[int] | None = None) -> LinkPlan:
    """Pure: the pieces `rank` sends and receives in pull and push when rank i plays roles[i], compiled
    per layer group (`groups[p]`: non-decreasing group id of parameter p, e.g. its layer; default one group)."""
    numels = np.asarray(numels, dtype=np.int64)
    gid = np.zeros(len(numels), dtype=np.int64) if groups is None else np.asarray(groups, dtype=np.int64)
    if np.any(np.diff(gid) < 0):
        raise ValueError("groups must be non-decreasing in canonical parameter order")
    group_params = tuple(np.flatnonzero(gid == g) for g in np.unique(gid))
    sharded = np.asarray(sharded, dtype=bool)
    world = len(roles)
    owners = owner_ranges(numels, world)
    needs = role_ranges(numels, sharded, roles)
    owned = FlatLayout.of(owners[0][rank], owners[1][rank])
    local = FlatLayout.of(needs[0][rank], needs[1][rank])
    pull_ex, push_ex = plan_exchange(owners, needs, rank), plan_exchange(needs, owners, rank)
    return LinkPlan(
        rank=rank, world=world, owned=owned, local=local, pull=pull_ex, push=push_ex, group_params=group_params,
        pull_groups=tuple(compile_exchange(pull_ex, owned, local, list(group_params), world, accumulate=False)),
        push_groups=tuple(compile_exchange(push_ex, local, owned, list(group_params), world, accumulate=True)),
    )

