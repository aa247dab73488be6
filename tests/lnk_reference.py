"""LNK planning as it was before it was vectorized (runtime/lnk.py at 17f8c0e): one numpy round per layer
group, per push round and per rank. Kept as the reference the fast `plan_link` must equal exactly
(tests/test_lnk.py); the exchange pieces and layouts are the module's own (unchanged)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hydraplan.runtime.lnk import Exchange, FlatLayout, Gather, Role, owner_ranges, plan_exchange


def role_ranges(numels: np.ndarray, sharded: np.ndarray, roles: Sequence[Role | None]) -> tuple[np.ndarray, np.ndarray]:
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


def gather_of(starts: np.ndarray, sizes: np.ndarray, src_len: int) -> Gather:
    keep = sizes > 0
    starts, sizes = starts[keep].astype(np.int64), sizes[keep].astype(np.int64)
    bounds = np.unique(np.concatenate(([0, src_len], starts, starts + sizes)))
    a = np.searchsorted(bounds, starts)
    counts = np.searchsorted(bounds, starts + sizes) - a
    first = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64)
    ids = np.repeat(a - first, counts) + np.arange(int(counts.sum()), dtype=np.int64)
    return Gather(np.diff(bounds), ids, int(sizes.sum()))


def contiguous_start(g: Gather) -> int | None:
    if not len(g.ids) or np.any(np.diff(g.ids) != 1):
        return None
    return int(g.seg_sizes[:g.ids[0]].sum())


@dataclass(frozen=True)
class RefGroup:
    src: tuple[int, int]
    dst: tuple[int, int]
    send_splits: list[int]
    recv_splits: list[int]
    pack: Gather
    rounds: tuple[Gather, ...]
    zero_tail: int
    stacked: int | None  # the start only: the count was len(rounds)


def _group_range(layout: FlatLayout, params: np.ndarray) -> tuple[int, int]:
    if len(params) == 0:
        return 0, 0
    lo = int(layout.offset[params[0]])
    return lo, lo + int((layout.hi - layout.lo)[params].sum())


def _rounds(dst_start, size, recv_off, n, tail) -> tuple[list[Gather], int]:
    keep = size > 0
    dst_start, size, recv_off = dst_start[keep], size[keep], recv_off[keep]
    bounds = np.unique(np.concatenate(([0, n], dst_start, dst_start + size)))
    seg_lo, seg_size = bounds[:-1], np.diff(bounds)
    a = np.searchsorted(bounds, dst_start)
    counts = np.searchsorted(bounds, dst_start + size) - a
    piece = np.repeat(np.arange(len(size)), counts)
    first = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64)
    seg = np.repeat(a - first, counts) + np.arange(int(counts.sum()), dtype=np.int64)
    order = np.lexsort((piece, seg))
    seg, piece = seg[order], piece[order]
    k = np.arange(len(seg)) - np.searchsorted(seg, seg)
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
        out.append(gather_of(starts, seg_size, tail + zero_tail))
    return out, zero_tail


def _stacked(rounds: list[Gather], n: int) -> int | None:
    starts = [contiguous_start(r) for r in rounds]
    if len(rounds) < 2 or starts[0] is None or any(s != starts[0] + k * n for k, s in enumerate(starts)):
        return None
    return starts[0]


def compile_exchange(ex: Exchange, src: FlatLayout, dst: FlatLayout, group_params: list[np.ndarray], world: int,
                     accumulate: bool) -> list[RefGroup]:
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
        pack = gather_of(s_start[ms] - s_lo, send_size, s_hi - s_lo)
        recv_off = np.concatenate(([0], np.cumsum(recv_size)[:-1])).astype(np.int64)
        total, n = int(recv_size.sum()), d_hi - d_lo
        tail = 0
        if accumulate:
            rounds, tail = _rounds(r_start[mr] - d_lo, recv_size, recv_off, n, total)
        else:
            order = np.argsort(r_start[mr], kind="stable")
            if not np.array_equal(np.cumsum(recv_size[order]) - recv_size[order], r_start[mr][order] - d_lo) or total != n:
                raise ValueError("pull pieces do not tile the destination")
            rounds = [gather_of(recv_off[order], recv_size[order], total)]
        out.append(RefGroup((s_lo, s_hi), (d_lo, d_hi), send_splits, recv_splits, pack, tuple(rounds), tail,
                            _stacked(rounds, n) if accumulate and tail == 0 else None))
    return out


@dataclass(frozen=True)
class RefPlan:
    owned: FlatLayout
    local: FlatLayout
    pull: Exchange
    push: Exchange
    group_params: tuple[np.ndarray, ...]
    pull_groups: list[RefGroup]
    push_groups: list[RefGroup]


def plan_link(numels, sharded, roles, rank: int, groups=None) -> RefPlan:
    numels = np.asarray(numels, dtype=np.int64)
    gid = np.zeros(len(numels), dtype=np.int64) if groups is None else np.asarray(groups, dtype=np.int64)
    group_params = tuple(np.flatnonzero(gid == g) for g in np.unique(gid))
    sharded = np.asarray(sharded, dtype=bool)
    world = len(roles)
    owners = owner_ranges(numels, world)
    needs = role_ranges(numels, sharded, roles)
    owned = FlatLayout.of(owners[0][rank], owners[1][rank])
    local = FlatLayout.of(needs[0][rank], needs[1][rank])
    pull_ex, push_ex = plan_exchange(owners, needs, rank), plan_exchange(needs, owners, rank)
    return RefPlan(owned, local, pull_ex, push_ex, group_params,
                   compile_exchange(pull_ex, owned, local, list(group_params), world, accumulate=False),
                   compile_exchange(push_ex, local, owned, list(group_params), world, accumulate=True))
