"""Seq1F1B on one pipeline stage (seq1f1b.txt §3): each micro-batch is cut into K causal sub-sequences
("splits", token offsets from the plan) and the stage runs the planner's action list for it
(hydraplan.core.schedules.schedule_seq1f1b: forwards in order, backwards LIFO within a micro-batch).

Why it is exact. Only attention mixes tokens, so a split needs nothing from the earlier splits of its
micro-batch but their keys and values, per layer. The forward of split s keeps its post-RoPE K/V as
detached leaves; a later split attends to [cached K/V of its key window, its own K/V]. The window
starts at the first token of the document that holds the split's first token, so a document crossing
a split boundary keeps its whole causal context (positions come from the packed micro-batch, so RoPE
is unchanged), with the split's queries aligned bottom-right against the longer keys. The backward of
a later split leaves the gradient of those K/V in the leaves' .grad: the stash, summed over every later
split. The backward of split s runs after all later splits of its micro-batch (the LIFO order), so it
backpropagates its output gradient and its K/V stash in one autograd call and then drops both.

With context parallelism (runtime/context_parallel.py) a rank holds its CP share of each split; the
split's K/V are gathered over the CP group per layer and that gathered buffer is what the cache and the
stash hold. A rank's stash is then its partial gradient for every token of the split, and the gather's
backward (collective: CP ranks run the same action list) sums them at the tokens' owners. Empty splits
are skipped by the split's total size, so every CP rank joins the same gathers, even with no tokens.

model.py's Attention attends within its own micro-batch only, so `_split_forward` runs the stage's
layers itself, with the same parameters and sub-modules (sequence parallelism, and the attention core's
selective recomputation, as in model.py), and swaps in `cached_attention`. Under full recomputation a
layer keeps only its input and its K/V (the cache later splits read) and re-runs its forward in the
split's backward.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist

from hydraplan.core.errors import UserError
from hydraplan.core.schedules import Action, schedule_seq1f1b
from hydraplan.core.schema import Plan
from hydraplan.runtime.attention import Windows, window_attention
from hydraplan.runtime.batches import PackedBatch
from hydraplan.runtime.context_parallel import CPShards, attend_gathered, gather_kv
from hydraplan.runtime.model import Block, StageModule, rope_tables
from hydraplan.runtime.pipeline_exec import StageComm
from hydraplan.runtime.recompute import recomputed


# ------------------------------------------------------------------------------------------ splits
@dataclass(frozen=True)
class SplitView:
    """Split [lo, hi) of a packed micro-batch. Its queries are the split's tokens, its keys the packed
    tokens [key_lo, hi); cu_q/cu_k are the per-document query and key offsets into those (a document's
    keys end where its queries end, so causal alignment is bottom-right). Under CP, `batch` is this
    rank's share and batch.cp says how its queries find their keys (`cp_split_views`)."""

    batch: PackedBatch
    lo: int
    hi: int
    key_lo: int
    cu_q: torch.Tensor
    cu_k: torch.Tensor
    max_k: int

    @property
    def tokens(self) -> int:
        return self.hi - self.lo

    @functools.cached_property
    def windows(self) -> Windows:
        """Each document's queries in the split and its keys in the window (their concatenation)."""
        return Windows(self.cu_q, self.cu_k, self.batch.max_seqlen, self.max_k)


def split_views(mb: PackedBatch, bounds: Sequence[int]) -> list[SplitView]:
    """The K = len(bounds) - 1 splits of a micro-batch (bounds: token offsets, 0 first, total last)."""
    device = mb.tokens.device
    cu = mb.cu_seqlens.long().cpu()
    views = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        lo, hi = int(lo), int(hi)
        d0 = int(np.searchsorted(cu.numpy(), lo, side="right")) - 1  # the document holding token lo
        d1 = int(np.searchsorted(cu.numpy(), hi, side="left"))  # one past the document holding token hi - 1
        if lo == hi:
            d0 = d1 = 0
        key_lo = int(cu[d0]) if hi > lo else lo
        starts, ends = cu[d0:d1], cu[d0 + 1:d1 + 1].clamp(max=hi)
        q_len, k_len = ends - starts.clamp(min=lo), ends - starts
        cu_q = torch.cat([torch.zeros(1, dtype=torch.long), q_len.cumsum(0)]).to(torch.int32)
        cu_k = torch.cat([torch.zeros(1, dtype=torch.long), k_len.cumsum(0)]).to(torch.int32)
        batch = PackedBatch(tokens=mb.tokens[lo:hi], labels=mb.labels[lo:hi], positions=mb.positions[lo:hi],
                            cu_seqlens=cu_q.to(device), max_seqlen=int(q_len.max()) if hi > lo else 0)
        views.append(SplitView(batch, lo, hi, key_lo, cu_q.to(device), cu_k.to(device), int(k_len.max()) if hi > lo else 0))
    return views


def cp_split_views(shares: Sequence[PackedBatch], bounds: Sequence[int]) -> list[SplitView]:
    """The splits of a micro-batch for a CP rank with these shares of them (CPShards.split)."""
    return [SplitView(b, int(lo), int(hi), b.cp.key_lo, b.cp.windows.cu_q, b.cp.windows.cu_k, b.cp.windows.max_k)
            for b, lo, hi in zip(shares, bounds[:-1], bounds[1:], strict=True)]


def check_splits(plan: Plan, source: str) -> None:
    """UserError (file, field, value) unless every pipeline's splits are K+1 non-decreasing offsets from
    0 to its micro-batch's token count, with one K per pipeline, on all micro-batches or on none."""
    lengths = {s.id: s.length for s in plan.batch}
    for i, p in enumerate(plan.pipelines):
        ks = {None if mb.splits is None else len(mb.splits) - 1 for mb in p.micro_batches}
        if len(ks) > 1:
            raise UserError(f"{source}: field pipelines.{i}.micro_batches: splits must be given for all micro-batches "
                            f"with the same K, or for none (got K values {sorted(map(str, ks))})")
        for j, mb in enumerate(p.micro_batches):
            b = mb.splits
            if b is None:
                continue
            total = sum(lengths.get(sid, 0) for sid in mb.seqs)
            if len(b) < 2 or b[0] != 0 or b[-1] != total or any(x > y for x, y in zip(b, b[1:])):
                raise UserError(f"{source}: field pipelines.{i}.micro_batches.{j}.splits: {b} is not K+1 non-decreasing "
                                f"token offsets from 0 to the micro-batch's {total} tokens")


def pipeline_splits(plan: Plan, pipeline: int) -> list[list[int]] | None:
    """Per micro-batch split offsets of a pipeline, or None when it runs plain 1F1B."""
    mbs = plan.pipelines[pipeline].micro_batches
    return None if not mbs or mbs[0].splits is None else [list(mb.splits) for mb in mbs]


# --------------------------------------------------------------------------------------- attention
def cached_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, view: SplitView) -> torch.Tensor:
    """Causal attention of a split's queries q [n, Hq, D] to its key window k, v [hi - key_lo, Hkv, D]
    (hydraplan.runtime.attention.window_attention: each document's queries are the last of its keys)."""
    return window_attention(q, k, v, view.windows)


# ------------------------------------------------------------------------------------------- stage
@dataclass
class _LayerKV:
    kv: torch.Tensor  # K and V concatenated on the head dim (gathered under CP), attached to the split's graph
    leaf: torch.Tensor  # the same values, detached: what later splits attend to; .grad is the stash


@dataclass
class _Held:
    """What a split keeps from its forward until its backward."""

    input: torch.Tensor | None
    output: torch.Tensor | None
    kv: list[_LayerKV] = field(default_factory=list)


class Seq1F1BStage:
    """One stage's Seq1F1B state over an iteration's micro-batches: forward/backward of one split at a
    time in any order the dependencies allow (F(m, s-1) before F(m, s); B(m, s+1) before B(m, s)).

    peak_live: most splits held at once (forward done, backward not yet), to compare with the schedule's
    prediction (hydraplan.core.schedules Timeline.peak_live); `live` is 0 again once every backward ran.
    cpu_s[(op, m, s)]: this thread's CPU seconds in each action (runtime/profile.py's clock on shared CPUs).
    """

    def __init__(self, module: StageModule, mbs: Sequence[PackedBatch], splits: Sequence[Sequence[int]], loss_scale: float,
                 cp: CPShards | None = None):
        if len(mbs) != len(splits):
            raise ValueError(f"{len(mbs)} micro-batches but {len(splits)} split lists")
        self.module, self.loss_scale = module, loss_scale
        self.views = [split_views(mb, b) if cp is None else cp_split_views(cp.split(m, mb, b), b)
                      for m, (mb, b) in enumerate(zip(mbs, splits))]
        self.loss = torch.zeros((), dtype=torch.float64, device=mbs[0].tokens.device if mbs else "cpu")
        self._held: dict[tuple[int, int], _Held] = {}
        self.peak_live = 0
        self.cpu_s: dict[tuple[str, int, int], float] = {}

    def tokens(self, m: int, s: int) -> int:
        """Tokens of split s of micro-batch m (all CP ranks': a split runs unless this is 0)."""
        return self.views[m][s].tokens

    def local_tokens(self, m: int, s: int) -> int:
        """The rows of this rank's activations of split s of micro-batch m: its SP rows of its CP share."""
        return self.module.tp.rows(self.views[m][s].batch.num_tokens)

    def forward(self, m: int, s: int, x: torch.Tensor | None) -> torch.Tensor | None:
        """Forward of split s of micro-batch m (x: its input activations, None on the first stage).
        Returns what goes to the next stage (None on the last stage or for an empty split)."""
        start = time.thread_time()
        view = self.views[m][s]
        held = _Held(input=x, output=None)
        self._held[(m, s)] = held
        self.peak_live = max(self.peak_live, len(self._held))
        if view.tokens and x is not None:
            x.requires_grad_()
        if view.tokens:
            y = self._split_forward(x, view, m, s, held.kv)
            if self.module.last:
                y = y * self.loss_scale
                self.loss += y.detach().double()  # on the device: no host read per split
            held.output = y
        self.cpu_s[("F", m, s)] = time.thread_time() - start
        return None if self.module.last or held.output is None else held.output.detach()

    def backward(self, m: int, s: int, grad: torch.Tensor | None) -> torch.Tensor | None:
        """Backward of split s of micro-batch m with the gradient of its output (None on the last stage),
        plus the K/V gradients the later splits stashed. Returns the input gradient for the previous stage."""
        start = time.thread_time()
        held = self._held.pop((m, s))
        dx = None
        if held.output is not None:
            tensors, grads = [held.output], [grad]
            for kv in held.kv:
                if kv.leaf.grad is not None:
                    tensors.append(kv.kv)
                    grads.append(kv.leaf.grad)
            torch.autograd.backward(tensors, grads)
            dx = None if self.module.first else held.input.grad
        self.cpu_s[("B", m, s)] = time.thread_time() - start
        return dx

    @property
    def live(self) -> int:
        return len(self._held)

    def _window(self, m: int, s: int, layer: int, own: torch.Tensor) -> torch.Tensor:
        """K/V of split s's window: cached leaves of the earlier splits it reaches, then its own."""
        view = self.views[m][s]
        parts, start = [], view.lo
        for j in range(s - 1, -1, -1):
            if start <= view.key_lo:
                break
            prev = self.views[m][j]
            if prev.tokens:
                parts.append(self._held[(m, j)].kv[layer].leaf)
            start = prev.lo
        if not parts:
            return own
        return torch.cat([*reversed(parts), own])[view.key_lo - start:]

    def _split_forward(self, x: torch.Tensor | None, view: SplitView, m: int, s: int, kvs: list[_LayerKV]) -> torch.Tensor:
        """StageModule.forward for one split, attending to the cached K/V of the earlier ones."""
        mod, cfg = self.module, self.module.cfg
        mb = view.batch
        if mod.first:
            x = mod.embed(mb.tokens)
        cos, sin = rope_tables(mb.positions, cfg.head_dim, cfg.rope_theta, mod.dtype, cfg.rope_scaling)
        for layer, block in enumerate(mod.layers.values()):
            args = (x, block, cos, sin, view, lambda own, layer=layer: self._window(m, s, layer, own))
            x, own = recomputed(_split_layer, *args) if block.recompute == "full" else _split_layer(*args)
            kvs.append(_LayerKV(own, own.detach().requires_grad_()))
        return mod.head(mod.norm(x), mb.labels) if mod.last else x


def _split_layer(x: torch.Tensor, block: Block, cos: torch.Tensor, sin: torch.Tensor, view: SplitView,
                 window: Callable[[torch.Tensor], torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """One decoder layer of a split: its output, and its own K/V (gathered under CP), which `window` extends
    with the cached K/V of the earlier splits into the key window its queries attend to."""
    attn, mb = block.attn, view.batch
    q, k, v = attn.qkv(block.attn_norm(x), cos, sin, mb.num_tokens)
    own = torch.cat([k, v], dim=1) if mb.cp is None else gather_kv(k, v, mb.cp)
    kv = window(own)
    if mb.cp is None:
        o = attn.core(cached_attention, q, *kv.chunk(2, dim=1), view, windows=view.windows)
    else:
        o = attn.core(attend_gathered, q, kv, mb.cp, windows=mb.cp.windows)
    x = x + attn.out(o)
    return x + block.mlp(block.mlp_norm(x), mb.num_tokens), own


# ------------------------------------------------------------------------------------- one process
def run_in_process(stages: Sequence[Seq1F1BStage], before: Callable[[int, Action], None] | None = None) -> None:
    """Run a whole pipeline's stages in this process (tests, benchmarks): each stage's action list, an
    action as soon as its input exists (the order of hydraplan.core.schedules.simulate); a tensor handed to the
    next stage is cloned, as a receive buffer would be. `before(stage, action)` is called before each
    action. Raises RuntimeError if no stage can advance."""
    P = len(stages)
    if not stages[0].views:  # no micro-batch: nothing to run
        return
    sched = schedule_seq1f1b(P, len(stages[0].views), len(stages[0].views[0]))
    sent: dict[tuple[str, int, int, int], torch.Tensor | None] = {}
    ptr = [0] * P
    while any(ptr[r] < len(sched.stages[r]) for r in range(P)):
        progressed = False
        for r in range(P):
            while ptr[r] < len(sched.stages[r]):
                a = sched.stages[r][ptr[r]]
                needs = r > 0 if a.op == "F" else r < P - 1
                src = (a.op, a.mb, a.split, r - 1 if a.op == "F" else r + 1)
                if needs and src not in sent:
                    break
                inp = sent.pop(src) if needs else None
                if before is not None:
                    before(r, a)
                step = stages[r].forward if a.op == "F" else stages[r].backward
                sent[(a.op, a.mb, a.split, r)] = step(a.mb, a.split, None if inp is None else inp.clone())
                ptr[r] += 1
                progressed = True
        if not progressed:
            raise RuntimeError(f"Seq1F1B pipeline of {P} stages cannot advance")


# ------------------------------------------------------------------------------------ distributed
@dataclass(frozen=True)
class Transfer:
    """One point-to-point message of a stage, to (send) or from the neighbouring stage `peer`."""

    send: bool
    peer: int
    tag: int


def p2p_batches(actions: Sequence[Action], stage: int, pp: int, K: int,
                tokens: Callable[[int, int], int]) -> list[list[Transfer]]:
    """batches[i] is posted right before action i as one batch_isend_irecv: the send of action i-1's
    result together with action i's receive (batches[-1]: the last action's send). Pairing each send with
    the next receive generalizes Megatron's send_forward_recv_backward: the run cannot deadlock even
    where a send waits for its receive (NCCL), which tests check by simulation. Empty splits move nothing;
    tags are unique per (micro-batch, split, direction)."""
    out: list[list[Transfer]] = []
    pending: list[Transfer] = []
    for a in actions:
        batch, pending = pending, []
        if tokens(a.mb, a.split):
            tag = 2 * (a.mb * K + a.split) + (a.op == "B")
            src, dst = (stage - 1, stage + 1) if a.op == "F" else (stage + 1, stage - 1)
            if 0 <= src < pp:
                batch.append(Transfer(False, src, tag))
            if 0 <= dst < pp:
                pending.append(Transfer(True, dst, tag))
        out.append(batch)
    out.append(pending)
    return out


def run_seq1f1b(module: StageModule, mbs: Sequence[PackedBatch], splits: Sequence[Sequence[int]], comm: StageComm,
                loss_scale: float, cp: CPShards | None = None,
                before_last_backward: Callable[[], None] | None = None) -> tuple[torch.Tensor, Seq1F1BStage]:
    """Run this stage's Seq1F1B action list over the micro-batches; gradients accumulate in the module's
    .grad. Returns the scaled loss summed over splits (0 except on the last stage) and the stage state.

    Every rank derives the action list and each split's size from the plan, so receive buffers need no
    shape handshake and empty splits are skipped by all stages alike; messages go in `p2p_batches`.
    `before_last_backward` is called right before the stage's last backward action (runtime/grads.py).
    """
    stage = Seq1F1BStage(module, mbs, splits, loss_scale, cp)
    if not mbs:  # an idle pipeline (no sequence this iteration): every stage of it has no action and no message
        return torch.zeros((), dtype=torch.float64, device=comm.device), stage
    K = len(splits[0]) - 1
    actions = schedule_seq1f1b(comm.pp, len(mbs), K).stages[comm.stage]
    batches = p2p_batches(actions, comm.stage, comm.pp, K, stage.tokens)
    rank = {comm.stage - 1: comm.prev, comm.stage + 1: comm.next}
    last_b = max((i for i, a in enumerate(actions) if a.op == "B"), default=-1)
    result: torch.Tensor | None = None
    for i, batch in enumerate(batches):
        ops, received = [], None
        for t in batch:
            if t.send:
                ops.append(dist.P2POp(dist.isend, result, rank[t.peer], tag=t.tag))
            else:
                a = actions[i]
                received = torch.empty(stage.local_tokens(a.mb, a.split), comm.hidden, dtype=comm.dtype, device=comm.device)
                ops.append(dist.P2POp(dist.irecv, received, rank[t.peer], tag=t.tag))
        if ops:
            for work in dist.batch_isend_irecv(ops):
                work.wait()
        if i < len(actions):
            a = actions[i]
            if i == last_b and before_last_backward is not None:
                before_last_backward()
            result = (stage.forward if a.op == "F" else stage.backward)(a.mb, a.split, received)
    return stage.loss, stage
