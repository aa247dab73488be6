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
push: TP rank t contributes chunk t of each of its stage's gradients (of the identical full gradient for
  a replicated parameter, so every element is contributed once per pipeline), pieces go to the owners,
  which sum the contributions of all pipelines. The CP ranks of a stage hold the same slices, each with
  the partial gradient of its own tokens: to LNK they are replicas like other pipelines (the same Role),
  each contributes its chunk and the owners' sum covers them too. So every owner shard still takes one
  update from the sum of all contributions. For a homogeneous strategy pull is an all-gather and push
  a reduce-scatter (tested); PP and CP never cut a tensor, so only TP and the owner shards shape the pieces.

The planning (`plan_link`) is pure numpy, the same on every rank, so no sizes are ever exchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Role:
    """What one rank computes in an iteration: the parameters of its stage, for its TP rank."""

    params: tuple[int, ...]
    tp: int = 1
    tp_rank: int = 0


def shard_bounds(numel: int, parts: int) -> np.ndarray:
    """parts+1 boundaries of `parts` balanced contiguous shards of a flat tensor."""
    return np.arange(parts + 1, dtype=np.int64) * numel // parts


def owner_ranges(numels: np.ndarray, world: int) -> tuple[np.ndarray, np.ndarray]:
    """[world, P] lo/hi of the flat range of each parameter each rank owns."""
    r = np.arange(world, dtype=np.int64)[:, None]
    return r * numels[None, :] // world, (r + 1) * numels[None, :] // world


def role_ranges(numels: np.ndarray, sharded: np.ndarray, roles: Sequence[Role | None],
                whole_replicated: bool) -> tuple[np.ndarray, np.ndarray]:
    """[world, P] lo/hi each rank holds during propagation (lo == hi: nothing). With `whole_replicated`
    a replicated parameter counts whole (what pull delivers), else as its TP chunk (what push sends)."""
    lo = np.zeros((len(roles), len(numels)), dtype=np.int64)
    hi = np.zeros_like(lo)
    for r, role in enumerate(roles):
        if role is None:
            continue
        p = np.asarray(role.params, dtype=np.int64)
        n = numels[p]
        chunk = ~(whole_replicated & ~sharded[p])
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

    def split_sizes(self, world: int, rank: int) -> list[int]:
        """Elements per peer, 0 for this rank itself (local pieces are copied, not sent)."""
        sizes = np.bincount(self.peer, weights=self.size, minlength=world).astype(np.int64)
        sizes[rank] = 0
        return sizes.tolist()


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
class LinkPlan:
    """Everything one rank needs to pull and push for one strategy."""

    rank: int
    world: int
    owned: FlatLayout  # the rank's optimizer shard buffer
    local: FlatLayout  # the rank's stage parameters (and gradients), flattened in canonical order
    pull: Exchange
    push: Exchange


def plan_link(numels: Sequence[int], sharded: Sequence[bool], roles: Sequence[Role | None], rank: int) -> LinkPlan:
    """Pure: the pieces `rank` sends and receives in pull and push when rank i plays roles[i]."""
    numels = np.asarray(numels, dtype=np.int64)
    sharded = np.asarray(sharded, dtype=bool)
    world = len(roles)
    owners = owner_ranges(numels, world)
    needs = role_ranges(numels, sharded, roles, whole_replicated=True)
    contribs = role_ranges(numels, sharded, roles, whole_replicated=False)
    return LinkPlan(
        rank=rank,
        world=world,
        owned=FlatLayout.of(owners[0][rank], owners[1][rank]),
        local=FlatLayout.of(needs[0][rank], needs[1][rank]),
        pull=plan_exchange(owners, needs, rank),
        push=plan_exchange(contribs, owners, rank),
    )


def _exchange(ex: Exchange, rank: int, world: int, src: torch.Tensor, src_layout: FlatLayout,
              dst: torch.Tensor, dst_layout: FlatLayout, wire: torch.dtype, accumulate: bool) -> None:
    s_start, r_start = src_layout.starts(ex.send), dst_layout.starts(ex.recv)
    s_size, r_size = ex.send.size, ex.recv.size
    s_remote, r_remote = ex.send.peer != rank, ex.recv.peer != rank
    # Local movement: the pieces this rank sends itself, in the same (param) order on both sides.
    for a, b, n in zip(s_start[~s_remote], r_start[~r_remote], s_size[~s_remote]):
        _put(dst[b:b + n], src[a:a + n].to(wire), accumulate)
    send = [src[a:a + n] for a, n in zip(s_start[s_remote], s_size[s_remote])]
    send_buf = torch.cat(send).to(wire) if send else src.new_empty(0, dtype=wire)
    recv_buf = dst.new_empty(int(r_size[r_remote].sum()), dtype=wire)
    dist.all_to_all_single(recv_buf, send_buf, ex.recv.split_sizes(world, rank), ex.send.split_sizes(world, rank))
    at = 0
    for b, n in zip(r_start[r_remote], r_size[r_remote]):
        _put(dst[b:b + n], recv_buf[at:at + n], accumulate)
        at += n


def _put(dst: torch.Tensor, piece: torch.Tensor, accumulate: bool) -> None:
    if accumulate:
        dst.add_(piece.to(dst.dtype))
    else:
        dst.copy_(piece)


def pull(plan: LinkPlan, shard: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """This rank's stage parameters, flat in canonical order, gathered from the owners' master shards."""
    out = shard.new_empty(plan.local.total, dtype=dtype)
    _exchange(plan.pull, plan.rank, plan.world, shard, plan.owned, out, plan.local, dtype, False)
    return out


def push(plan: LinkPlan, grads: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Gradient of this rank's optimizer shard: the sum over all pipelines of their contributions.
    `grads` is the rank's stage gradients flat like pull's output (empty when the rank is idle)."""
    out = grads.new_zeros(plan.owned.total, dtype=dtype)
    _exchange(plan.push, plan.rank, plan.world, grads, plan.local, out, plan.owned, grads.dtype, True)
    return out
