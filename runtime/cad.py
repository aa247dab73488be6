"""Core-attention disaggregation at run time (plans with a `cad` section, hydraplan.solve.cad): pp = 1 replicas.

In step v replica j holds the pieces [start, end) of documents the plan gives it and runs the linear
layers on them. Core attention runs as tasks: task (seq, [s, e), home, rank) computes queries [s, e) of
seq against its keys [0, e) on replica `rank`. Per layer and TP rank (the replicas' ranks at the same TP
rank form the exchange group; each holds heads/tp heads):
1. every replica sends each executor the rows of its local [Q | K | V] that the executor's tasks need
   (the union over its tasks of the causal prefixes it holds; one all_to_all_single with uneven sizes);
2. the executor picks each task's queries and key window out of what it received (index_select) and
   runs bottom-right causal window attention (runtime/attention.py), the shape of a CP rank's run;
3. outputs go back to their home (a second all_to_all) and are put in local token order.
Both exchanges are one autograd Function whose backward is the reverse all_to_all with the gradient
scatter-added at the sent rows, as context_parallel._GatherTokens does for K/V. So each replica's
parameter gradients are partial sums over its tokens' paths, and LNK push adds them up like any pipeline's.
Attention seconds of each layer are recorded per rank (`CADContext.attention_s`) for the balance report.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist

from hydraplan.core.schema import CADStep, Plan
from hydraplan.runtime.attention import Windows, window_attention
from hydraplan.runtime.batches import IGNORE, PackedBatch, TokenData


class _Exchange(torch.autograd.Function):
    """Forward: rows x[send_index] go out (send_sizes per group rank), recv_sizes rows come in, in group rank
    order. Backward: the received rows' gradients go back and are summed into the rows they came from."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, send_index: torch.Tensor, send_sizes: list[int], recv_sizes: list[int],
                group: dist.ProcessGroup) -> torch.Tensor:
        ctx.save_for_backward(send_index)
        ctx.sizes, ctx.group, ctx.n = (send_sizes, recv_sizes), group, x.shape[0]
        out = x.new_empty(sum(recv_sizes), *x.shape[1:])
        dist.all_to_all_single(out, x.index_select(0, send_index).contiguous(), recv_sizes, send_sizes, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (send_index,) = ctx.saved_tensors
        send_sizes, recv_sizes = ctx.sizes
        back = grad.new_empty(sum(send_sizes), *grad.shape[1:])
        dist.all_to_all_single(back, grad.contiguous(), send_sizes, recv_sizes, group=ctx.group)
        out = grad.new_zeros(ctx.n, *grad.shape[1:]).index_add_(0, send_index, back)
        return out, None, None, None, None


@dataclass
class CADContext:
    """One replica's view of one step: what to send, how to find each local task's rows, where outputs go."""

    group: dist.ProcessGroup
    qkv_send: torch.Tensor  # local rows sent, grouped by destination in group rank order
    qkv_send_sizes: list[int]
    qkv_recv_sizes: list[int]
    q_index: torch.Tensor  # rows of the received buffer: each local task's queries, tasks back to back
    k_index: torch.Tensor  # the same for each task's key window [0, e)
    windows: Windows
    out_send_sizes: list[int]  # output rows per home (they are the task rows, grouped by home in group order)
    out_order: torch.Tensor  # permutation of the task rows grouping them by home
    out_recv_sizes: list[int]
    out_place: torch.Tensor  # received output rows -> local token order
    attention_s: list[float] = field(default_factory=list)  # per layer (forward), this rank's task compute


def cad_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: CADContext) -> torch.Tensor:
    """Causal attention of the local tokens' queries q [n, H, D] over their whole documents, computed on the
    replicas the plan names. Collective over the group in forward and backward."""
    h = q.shape[1]
    qkv = torch.cat([q, k, v], dim=1)
    got = _Exchange.apply(qkv, ctx.qkv_send, ctx.qkv_send_sizes, ctx.qkv_recv_sizes, ctx.group)
    tq = got.index_select(0, ctx.q_index)[:, :h]
    kv = got.index_select(0, ctx.k_index)
    t0 = time.perf_counter()
    if tq.shape[0]:
        o = window_attention(tq, kv[:, h:h + k.shape[1]], kv[:, h + k.shape[1]:], ctx.windows)
    else:  # no task here, but the exchange's backward is collective: keep it in the graph
        o = tq + 0 * got.sum()
    ctx.attention_s.append(time.perf_counter() - t0)
    back = _Exchange.apply(o.index_select(0, ctx.out_order), torch.arange(o.shape[0], device=o.device),
                           ctx.out_send_sizes, ctx.out_recv_sizes, ctx.group)
    return back.index_select(0, ctx.out_place)


def _rows(pieces: Sequence[tuple[int, int, int]]) -> dict[tuple[int, int], int]:
    """(seq, position) -> row of a buffer holding these (seq, start, end) pieces back to back."""
    out, n = {}, 0
    for seq, s, e in pieces:
        for p in range(s, e):
            out[(seq, p)] = n
            n += 1
    return out


def _spans(tokens: Sequence[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """Sorted (seq, pos) tokens as maximal (seq, start, end) runs."""
    out: list[list[int]] = []
    for seq, p in tokens:
        if out and out[-1][0] == seq and out[-1][2] == p:
            out[-1][2] += 1
        else:
            out.append([seq, p, p + 1])
    return [tuple(x) for x in out]  # type: ignore[misc]


def cad_context(step: CADStep, replica: int, group_replicas: Sequence[int], group: dist.ProcessGroup,
                device: torch.device | str = "cpu") -> CADContext:
    """The exchange plan of `replica` in one step. group_replicas: the replica of each group rank, in order."""
    d = len(group_replicas)
    held = [[(pc.seq, pc.start, pc.end) for pc in step.pieces if pc.rank == r] for r in range(d)]
    local = _rows(held[replica])

    def needs(src: int, dst: int) -> list[tuple[int, int]]:
        """Tokens `src` holds that the tasks run on `dst` read (keys and values; queries among them)."""
        ends: dict[int, int] = {}
        for t in step.tasks:
            if t.rank == dst:
                ends[t.seq] = max(ends.get(t.seq, 0), t.end)
        return sorted((seq, p) for seq, s, e in held[src] if seq in ends for p in range(s, min(e, ends[seq])))

    send = [needs(replica, dst) for dst in group_replicas]
    recv = [needs(src, replica) for src in group_replicas]
    where: dict[tuple[int, int], int] = {}
    off = 0
    for toks in recv:
        for i, tok in enumerate(toks):
            where[tok] = off + i
        off += len(toks)
    mine = [t for t in step.tasks if t.rank == replica]
    q_idx = [where[(t.seq, p)] for t in mine for p in range(t.start, t.end)]
    k_idx = [where[(t.seq, p)] for t in mine for p in range(0, t.end)]
    q_len = np.array([t.end - t.start for t in mine], dtype=np.int64)
    k_len = np.array([t.end for t in mine], dtype=np.int64)
    windows = Windows(_offsets(q_len), _offsets(k_len), int(q_len.max(initial=0)), int(k_len.max(initial=0)))
    # outputs: this replica's task rows grouped by home (group order); homes receive from every executor
    row0 = np.concatenate(([0], np.cumsum(q_len)))
    order, out_send = [], []
    for home in group_replicas:
        rows = [r for i, t in enumerate(mine) if t.home == home for r in range(int(row0[i]), int(row0[i + 1]))]
        order.extend(rows)
        out_send.append(len(rows))
    came: list[tuple[int, int]] = []
    out_recv = []
    for ex in group_replicas:
        toks = [(t.seq, p) for t in step.tasks if t.rank == ex and t.home == replica for p in range(t.start, t.end)]
        came.extend(toks)
        out_recv.append(len(toks))
    pos = {tok: i for i, tok in enumerate(came)}
    place = [pos[tok] for tok in sorted(local, key=local.__getitem__)]

    def lt(x: list[int]) -> torch.Tensor:
        return torch.tensor(x, dtype=torch.int64, device=device)

    return CADContext(group, lt([local[tok] for toks in send for tok in toks]), [len(s) for s in send],
                      [len(r) for r in recv], lt(q_idx), lt(k_idx),
                      Windows(windows.cu_q.to(device), windows.cu_k.to(device), windows.max_q, windows.max_k),
                      out_send, lt(order), out_recv, lt(place))


def _offsets(lengths: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.concatenate(([0], np.cumsum(lengths)))).to(torch.int32)


def pack_pieces(data: TokenData, plan: Plan, pieces: Sequence[tuple[int, int, int]], ctx: CADContext,
                device: torch.device | str = "cpu") -> PackedBatch:
    """A replica's micro-batch of one step: its pieces back to back, labels the next token of each document."""
    by_id = {s.id: s for s in plan.batch}
    toks, labels, pos = [], [], []
    for seq, s, e in pieces:
        d = data.sequence(by_id[seq])
        toks.append(d[s:e])
        lab = torch.full((e - s,), IGNORE, dtype=torch.int64)
        nxt = d[s + 1:e + 1]
        lab[: nxt.shape[0]] = nxt
        labels.append(lab)
        pos.append(torch.arange(s, e))
    lengths = torch.tensor([e - s for _, s, e in pieces], dtype=torch.int64)
    cu = torch.zeros(len(pieces) + 1, dtype=torch.int64)
    cu[1:] = torch.cumsum(lengths, 0)
    return PackedBatch(tokens=torch.cat(toks).to(device), labels=torch.cat(labels).to(device),
                       positions=torch.cat(pos).to(device), cu_seqlens=cu.to(torch.int32).to(device),
                       max_seqlen=int(lengths.max()), cp=ctx)


def step_micro_batches(data: TokenData, plan: Plan, replica: int, tp_rank: int, group: dist.ProcessGroup,
                       device: torch.device | str = "cpu") -> list[PackedBatch]:
    """Replica `replica`'s micro-batch of every step of a CAD plan (pp = 1), exchanging at TP rank `tp_rank`."""
    assert plan.cad is not None
    ranks = [p.ranks[tp_rank] for p in plan.pipelines]
    group_replicas = sorted(range(len(ranks)), key=lambda j: ranks[j])  # torch orders a group by global rank
    out = []
    for step in plan.cad.steps:
        ctx = cad_context(step, replica, group_replicas, group, device)
        pieces = [(pc.seq, pc.start, pc.end) for pc in step.pieces if pc.rank == replica]
        out.append(pack_pieces(data, plan, pieces, ctx, device))
    return out


def check_cad(plan: Plan, source: str) -> str | None:
    """Why this runtime cannot replay the CAD plan, or None."""
    assert plan.cad is not None
    if plan.cad.pp != 1 or any(p.pp != 1 or p.cp != 1 for p in plan.pipelines):
        return f"{source}: field cad.pp: the runtime replays CAD plans with pp = 1 and cp = 1 only"
    if len(plan.pipelines) != plan.cad.replicas:
        return f"{source}: field cad.replicas: {plan.cad.replicas}, but the plan has {len(plan.pipelines)} pipelines"
    if len({p.tp for p in plan.pipelines}) != 1:
        return f"{source}: field pipelines: CAD replicas must share one tp"
    d = plan.cad.replicas
    for v, step in enumerate(plan.cad.steps):
        if any(not 0 <= pc.rank < d for pc in step.pieces) or any(not 0 <= t.rank < d or not 0 <= t.home < d
                                                                   for t in step.tasks):
            return f"{source}: field cad.steps.{v}: a piece or task names a replica outside [0, {d})"
        if any(not any(pc.rank == j for pc in step.pieces) for j in range(d)):
            return f"{source}: field cad.steps.{v}.pieces: a replica holds no tokens"
        held = {(pc.seq, p): pc.rank for pc in step.pieces for p in range(pc.start, pc.end)}
        for i, t in enumerate(step.tasks):
            if any(held.get((t.seq, p)) != t.home for p in range(t.start, t.end)):
                return f"{source}: field cad.steps.{v}.tasks.{i}: queries [{t.start}, {t.end}) are not all on home {t.home}"
            if any((t.seq, p) not in held for p in range(t.end)):
                return f"{source}: field cad.steps.{v}.tasks.{i}: its key prefix is not all in this step"
        queries = sorted((t.seq, p) for t in step.tasks for p in range(t.start, t.end))
        if queries != sorted(held):
            return f"{source}: field cad.steps.{v}.tasks: tasks do not cover every token's query exactly once"
    return None


def balance_report(per_rank: Sequence[Sequence[float]]) -> list[float]:
    """Per layer call (forward), max/mean of the ranks' attention seconds - 1 (0: perfectly balanced)."""
    a = np.asarray(per_rank, dtype=np.float64)  # [ranks, layer calls]
    mean = a.mean(axis=0)
    return [float(m / n - 1.0) if n > 0 else 0.0 for m, n in zip(a.max(axis=0), mean)]
