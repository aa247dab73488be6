"""Core-attention disaggregation at run time (plans with a `cad` section, hydraplan.solve.cad): pp = 1 replicas.

In step v replica j holds the pieces [start, end) of documents the plan gives it and runs the linear
layers on them. Core attention runs as tasks: task (seq, [s, e), home, rank) computes queries [s, e) of
seq against its keys [0, e) on replica `rank`. Per layer and TP rank (the replicas' ranks at the same TP
rank form the exchange group; each holds heads/tp heads), one all_to_all_single with uneven sizes sends
each executor what attention needs and nothing more: Q of the queries it runs, K and V of every token of
their key prefixes (once per document and executor, the cost model's K/V de-duplication); the executor
picks each task's key window out of them, runs bottom-right causal window attention
(runtime/attention.py, the shape of a CP rank's run), and a second all_to_all sends the outputs home.

Ping-pong (runtime/cad_exec.py): a step's documents are split into two halves, each replica's tokens of
half A and of half B run the layers as two micro-batches, and each half's exchanges are in flight while the
other half computes, in forward and backward, so transfers hide behind compute as the cost model charges
(max(compute, comm)). Documents never cross halves, so the halves are independent and the result is exact.

Everything a rank needs is planned here from the plan alone with numpy over intervals and token positions,
the same on every rank (`cad_context`); `check_cad` checks a plan at the level of intervals.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from hydraplan.core.schema import CADStep, Plan
from hydraplan.runtime.attention import Windows
from hydraplan.runtime.batches import IGNORE, PackedBatch, TokenData, to_device


# ------------------------------------------------------------------------------------------- arrays
@dataclass(frozen=True)
class StepArrays:
    """A step's pieces and tasks as arrays, in plan order (seq: the sequence ids of the plan)."""

    p_seq: np.ndarray
    p_start: np.ndarray
    p_end: np.ndarray
    p_rank: np.ndarray
    t_seq: np.ndarray
    t_start: np.ndarray
    t_end: np.ndarray
    t_home: np.ndarray
    t_rank: np.ndarray

    @classmethod
    def of(cls, step: CADStep) -> StepArrays:
        p = np.array([(x.seq, x.start, x.end, x.rank) for x in step.pieces], dtype=np.int64).reshape(-1, 4)
        t = np.array([(x.seq, x.start, x.end, x.home, x.rank) for x in step.tasks], dtype=np.int64).reshape(-1, 5)
        return cls(*p.T, *t.T)

    def subset(self, seqs: np.ndarray) -> StepArrays:
        """The pieces and tasks of these sequences only (plan order kept)."""
        pm, tm = np.isin(self.p_seq, seqs), np.isin(self.t_seq, seqs)
        return StepArrays(self.p_seq[pm], self.p_start[pm], self.p_end[pm], self.p_rank[pm], self.t_seq[tm],
                          self.t_start[tm], self.t_end[tm], self.t_home[tm], self.t_rank[tm])


def _spans(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The concatenation of arange(s, e) over the spans (empty spans contribute nothing)."""
    n = np.maximum(ends - starts, 0)
    total = int(n.sum())
    return np.repeat(starts - (np.cumsum(n) - n), n) + np.arange(total, dtype=np.int64)


def _offsets(lengths: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.concatenate(([0], np.cumsum(lengths)))).to(torch.int32)


# ------------------------------------------------------------------------------------------- checks
def check_cad(plan: Plan, source: str) -> str | None:
    """Why this runtime cannot replay the CAD plan, or None. Interval arithmetic per step: each sequence's
    pieces tile [0, n) once, its tasks tile the same range once, and every task's queries sit on its home."""
    assert plan.cad is not None
    if plan.cad.pp != 1 or any(p.pp != 1 or p.cp != 1 for p in plan.pipelines):
        return f"{source}: field cad.pp: the runtime replays CAD plans with pp = 1 and cp = 1 only"
    if len(plan.pipelines) != plan.cad.replicas:
        return f"{source}: field cad.replicas: {plan.cad.replicas}, but the plan has {len(plan.pipelines)} pipelines"
    if len({p.tp for p in plan.pipelines}) != 1:
        return f"{source}: field pipelines: CAD replicas must share one tp"
    d = plan.cad.replicas
    for v, step in enumerate(plan.cad.steps):
        if (why := _check_step(StepArrays.of(step), d)) is not None:
            return f"{source}: field cad.steps.{v}{why}"
    return None


def _check_step(a: StepArrays, d: int) -> str | None:
    if ((a.p_rank < 0) | (a.p_rank >= d)).any() or ((a.t_rank < 0) | (a.t_rank >= d) | (a.t_home < 0)
                                                     | (a.t_home >= d)).any():
        return f": a piece or task names a replica outside [0, {d})"
    if (a.p_end <= a.p_start).any() or (a.t_end <= a.t_start).any():
        return ": a piece or task is empty"
    if np.bincount(a.p_rank, minlength=d).min() == 0:
        return ".pieces: a replica holds no tokens"
    po = np.lexsort((a.p_start, a.p_seq))
    seq, lo, hi, rank = a.p_seq[po], a.p_start[po], a.p_end[po], a.p_rank[po]
    first = np.r_[True, seq[1:] != seq[:-1]]
    gap = np.flatnonzero(np.where(first, lo != 0, lo != np.r_[0, hi[:-1]]))
    if gap.size:
        return f".pieces: the pieces of sequence {int(seq[gap[0]])} do not hold its tokens from 0 exactly once"
    last = np.r_[seq[1:] != seq[:-1], True]
    n_of = dict(zip(seq[last].tolist(), hi[last].tolist()))
    to = np.lexsort((a.t_start, a.t_seq))
    tseq, ts, te = a.t_seq[to], a.t_start[to], a.t_end[to]
    tfirst = np.r_[True, tseq[1:] != tseq[:-1]]
    tlast = np.r_[tseq[1:] != tseq[:-1], True]
    covered = dict(zip(tseq[tlast].tolist(), te[tlast].tolist()))
    if (np.where(tfirst, ts != 0, ts != np.r_[0, te[:-1]]).any() or covered != n_of):
        return ".tasks: tasks do not cover every token's query exactly once"
    # every task's queries on its home: the pieces covering [s, e) in one coordinate over all sequences
    base = dict(zip(seq[first].tolist(), (np.cumsum(hi[last]) - hi[last]).tolist()))
    g_lo = np.array([base[s] for s in seq.tolist()], dtype=np.int64) + lo
    run = np.cumsum(np.r_[True, (rank[1:] != rank[:-1]) | first[1:]])
    t_lo = np.array([base[s] for s in a.t_seq.tolist()], dtype=np.int64)
    i0 = np.searchsorted(g_lo, t_lo + a.t_start, side="right") - 1
    i1 = np.searchsorted(g_lo, t_lo + a.t_end - 1, side="right") - 1
    bad = np.flatnonzero((run[i0] != run[i1]) | (rank[i0] != a.t_home))
    if bad.size:
        i = int(bad[0])
        return (f".tasks.{i}: queries [{int(a.t_start[i])}, {int(a.t_end[i])}) are not all on home "
                f"{int(a.t_home[i])}")
    return None


# ---------------------------------------------------------------------------------------- exchanges
@dataclass
class HalfContext:
    """One replica's view of one half of a step: what it sends (Q rows of the queries each executor runs, K/V
    rows of their key prefixes), how it finds its tasks' key windows in what it receives, and where outputs go.
    Row counts are per group rank in group order; element counts follow from the head sizes at run time."""

    group: dist.ProcessGroup | None
    q_send: torch.Tensor  # local rows whose Q goes out, grouped by destination
    q_send_counts: list[int]
    kv_send: torch.Tensor  # local rows whose K/V go out, grouped by destination
    kv_send_counts: list[int]
    q_recv_counts: list[int]  # received Q rows: this replica's tasks' queries, in task order
    kv_recv_counts: list[int]
    k_index: torch.Tensor  # rows of the received K/V: each task's key window [0, e), tasks back to back
    windows: Windows
    out_send_counts: list[int]  # output rows per home (task order groups them by home)
    out_recv_counts: list[int]
    out_place: torch.Tensor  # received output rows -> local token order
    stamps: list[tuple[Any, Any]] = field(default_factory=list)  # per layer: device stamps around its attention


def _lookup(a: StepArrays, r: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """Replica r's local layout (its pieces back to back in plan order): pieces sorted by (seq, start) as
    (seq, start, end, first local row), and its token count."""
    m = np.flatnonzero(a.p_rank == r)
    size = a.p_end[m] - a.p_start[m]
    offset = np.cumsum(size) - size
    o = np.lexsort((a.p_start[m], a.p_seq[m]))
    return a.p_seq[m][o], a.p_start[m][o], a.p_end[m][o], offset[o], int(size.sum())


def _rows(lookup: tuple, seq: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """Local rows of tokens (seq, pos) in a layout from `_lookup` (every token must be held there)."""
    lseq, lstart, _, loff, _ = lookup
    big = int(max(lstart.max(initial=0), pos.max(initial=0))) + 1
    keys = lseq * big + lstart
    i = np.searchsorted(keys, seq * big + pos, side="right") - 1
    return loff[i] + pos - lstart[i]


def half_context(a: StepArrays, replica: int, group_replicas: Sequence[int], group: dist.ProcessGroup | None,
                 device: torch.device | str = "cpu") -> HalfContext:
    """The exchange plan of `replica` for the pieces and tasks in `a`. group_replicas: the replica of each group
    rank, in order."""
    d = len(group_replicas)
    gpos = np.empty(max(group_replicas) + 1, dtype=np.int64)
    gpos[list(group_replicas)] = np.arange(d)
    seqs, t_seq = np.unique(a.t_seq, return_inverse=True)
    p_seq = np.searchsorted(seqs, a.p_seq)
    reach = np.zeros((len(seqs), d), dtype=np.int64)  # key prefix each executor (group position) reads per seq
    np.maximum.at(reach, (t_seq, gpos[a.t_rank]), a.t_end)
    mine = _lookup(a, replica)

    def kv_runs(src: int, dst: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Pieces of src (plan order) cut to the key prefix dst reads: (seq, start, stop, index of the piece)."""
        m = np.flatnonzero(a.p_rank == src)
        stop = np.minimum(a.p_end[m], reach[p_seq[m], gpos[dst]])
        keep = stop > a.p_start[m]
        return a.p_seq[m][keep], a.p_start[m][keep], stop[keep], m[keep]

    def query_tasks(home: int, executor: int) -> np.ndarray:
        return np.flatnonzero((a.t_home == home) & (a.t_rank == executor))

    size = a.p_end - a.p_start
    local_off = np.zeros(len(size), dtype=np.int64)  # first local row of each piece on its replica
    for r in np.unique(a.p_rank):
        m = np.flatnonzero(a.p_rank == r)
        local_off[m] = np.cumsum(size[m]) - size[m]
    q_send, q_counts, kv_send, kv_counts = [], [], [], []
    for dst in group_replicas:
        t = query_tasks(replica, dst)
        q_send.append(_rows(mine, np.repeat(a.t_seq[t], a.t_end[t] - a.t_start[t]), _spans(a.t_start[t], a.t_end[t])))
        q_counts.append(len(q_send[-1]))
        _, start, stop, piece = kv_runs(replica, dst)
        kv_send.append(_spans(local_off[piece], local_off[piece] + stop - start))
        kv_counts.append(len(kv_send[-1]))
    # received K/V: per source (group order) its runs, back to back; each task's window [0, e) looked up there
    runs = [kv_runs(src, replica) for src in group_replicas]
    r_seq = np.concatenate([r[0] for r in runs])
    r_lo = np.concatenate([r[1] for r in runs])
    r_len = np.concatenate([r[2] - r[1] for r in runs])
    r_off = np.cumsum(r_len) - r_len
    task = np.flatnonzero(a.t_rank == replica)
    task = task[np.argsort(gpos[a.t_home[task]], kind="stable")]  # by home in group order: as the Q rows arrive
    o = np.lexsort((r_lo, r_seq))
    big = int(a.p_end.max(initial=0)) + 1
    keys = r_seq[o] * big + r_lo[o]
    k_seq = np.repeat(a.t_seq[task], a.t_end[task])
    k_pos = _spans(np.zeros(len(task), dtype=np.int64), a.t_end[task])
    i = o[np.searchsorted(keys, k_seq * big + k_pos, side="right") - 1]
    k_index = r_off[i] + k_pos - r_lo[i]
    q_len, k_len = a.t_end[task] - a.t_start[task], a.t_end[task]
    out_send = np.bincount(gpos[a.t_home[task]], weights=q_len, minlength=d).astype(np.int64)
    came = [query_tasks(replica, ex) for ex in group_replicas]
    came_rows = np.concatenate([_rows(mine, np.repeat(a.t_seq[t], a.t_end[t] - a.t_start[t]),
                                      _spans(a.t_start[t], a.t_end[t])) for t in came])
    place = np.empty(mine[4], dtype=np.int64)
    place[came_rows] = np.arange(len(came_rows))

    def lt(x: np.ndarray | list[np.ndarray]) -> torch.Tensor:
        x = np.concatenate(x) if isinstance(x, list) else x
        return torch.from_numpy(np.ascontiguousarray(x, dtype=np.int64)).to(device)

    windows = Windows(_offsets(q_len).to(device), _offsets(k_len).to(device), int(q_len.max(initial=0)),
                      int(k_len.max(initial=0)))
    return HalfContext(group, lt(q_send), q_counts, lt(kv_send), kv_counts,
                       [int(a.t_end[t].sum() - a.t_start[t].sum()) for t in (query_tasks(src, replica)
                                                                            for src in group_replicas)],
                       [int(r[2].sum() - r[1].sum()) for r in runs], lt(k_index), windows,
                       out_send.tolist(), [int((a.t_end[t] - a.t_start[t]).sum()) for t in came], lt(place))


# ------------------------------------------------------------------------------------------- halves
def halves(a: StepArrays, d: int) -> list[np.ndarray]:
    """The step's sequences in two halves for ping-pong, documents whole: longest first, each to the half whose
    replicas (those holding the document's pieces) hold fewer of that half's tokens; empty halves dropped."""
    seqs = np.unique(a.p_seq)
    per = np.zeros((len(seqs), d), dtype=np.int64)
    np.add.at(per, (np.searchsorted(seqs, a.p_seq), a.p_rank), a.p_end - a.p_start)
    load = np.zeros((2, d), dtype=np.int64)
    side = np.zeros(len(seqs), dtype=np.int64)
    for i in np.argsort(-per.sum(axis=1), kind="stable"):
        held = per[i] > 0
        h = int(load[1][held].sum() < load[0][held].sum())
        side[i] = h
        load[h] += per[i]
    return [seqs[side == h] for h in (0, 1) if (side == h).any()]


@dataclass
class CADBatch:
    """One replica's micro-batch of one step: its tokens of each half as a PackedBatch whose `cp` is the
    half's HalfContext."""

    halves: list[PackedBatch]

    @property
    def num_tokens(self) -> int:
        return sum(h.num_tokens for h in self.halves)

    def attention_seconds(self, seconds) -> list[float]:
        """Per layer: this rank's attention seconds over both halves (`seconds`: the device's stamp resolver)."""
        per = [[seconds(b) - seconds(a) for a, b in h.cp.stamps] for h in self.halves]
        return [float(sum(x)) for x in zip(*per, strict=True)]


def pack_pieces(data: TokenData, plan: Plan, pieces: Sequence[tuple[int, int, int]], ctx: HalfContext,
                device: Any = "cpu") -> PackedBatch:
    """A replica's micro-batch of one half: its pieces back to back, labels the next token of each document."""
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
    empty = torch.zeros(0, dtype=torch.int64)
    return PackedBatch(tokens=to_device(torch.cat(toks) if toks else empty, device),
                       labels=to_device(torch.cat(labels) if labels else empty, device),
                       positions=to_device(torch.cat(pos) if pos else empty, device),
                       cu_seqlens=to_device(cu.to(torch.int32), device), max_seqlen=int(lengths.max()) if pieces else 0, cp=ctx)


def step_micro_batches(data: TokenData, plan: Plan, replica: int, tp_rank: int, group: dist.ProcessGroup | None,
                       device: Any = "cpu") -> list[CADBatch]:
    """Replica `replica`'s micro-batch of every step of a CAD plan (pp = 1), exchanging at TP rank `tp_rank`.
    `device`: a runtime Device (runtime/device.py) or a torch device."""
    assert plan.cad is not None
    ranks = [p.ranks[tp_rank] for p in plan.pipelines]
    group_replicas = sorted(range(len(ranks)), key=lambda j: ranks[j])  # torch orders a group by global rank
    target = device if isinstance(device, (torch.device, str)) else device.torch
    out = []
    for step in plan.cad.steps:
        a = StepArrays.of(step)
        parts = []
        for seqs in halves(a, plan.cad.replicas):
            h = a.subset(seqs)
            ctx = half_context(h, replica, group_replicas, group, target)
            m = np.flatnonzero(h.p_rank == replica)
            parts.append(pack_pieces(data, plan, list(zip(h.p_seq[m].tolist(), h.p_start[m].tolist(),
                                                           h.p_end[m].tolist())), ctx, device))
        out.append(CADBatch(parts))
    return out


def balance_report(per_rank: Sequence[Sequence[float]]) -> list[float]:
    """Per layer call (forward), max/mean of the ranks' attention seconds - 1 (0: perfectly balanced)."""
    a = np.asarray(per_rank, dtype=np.float64)  # [ranks, layer calls]
    mean = a.mean(axis=0)
    return [float(m / n - 1.0) if n > 0 else 0.0 for m, n in zip(a.max(axis=0), mean)]
