"""Executing CAD steps with ping-pong (runtime/cad.py plans the exchanges): the two halves of a step run the
stage's layers interleaved so that each half's attention exchanges travel while the other half computes.

Per layer, forward: A's projections, post A's exchange; B's projections, post B's; wait A's, A's attention,
post A's outputs home; wait B's, B's attention, post B's outputs; wait A's outputs, A's output projection and
MLP; wait B's, B's. Every exchange is two autograd nodes: `_Post` starts the all_to_all_single and `_Wait`
waits for it. In backward the order reverses: `_Wait`'s backward posts the gradients' exchange and `_Post`'s
backward waits for it, and autograd runs the nodes created between them (the other half's work) in between,
because its ready queue takes the most recently created node first. Every rank builds the same graph in the
same order, so every rank posts the group's exchanges in the same order, as collectives need.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from hydraplan.runtime.attention import window_attention
from hydraplan.runtime.batches import PackedBatch
from hydraplan.runtime.cad import CADBatch, HalfContext
from hydraplan.runtime.model import Block, StageModule, rope_tables
from hydraplan.runtime.recompute import recomputed


class _Handle:
    """What the post and wait nodes of one exchange share."""

    def __init__(self, group: dist.ProcessGroup | None, send_splits: list[int], recv_splits: list[int]):
        self.group, self.send_splits, self.recv_splits = group, send_splits, recv_splits
        self.work: Any = None
        self.keep: Any = None  # tensors an exchange in flight reads or writes
        self.back: torch.Tensor | None = None


class _Post(torch.autograd.Function):
    @staticmethod
    def forward(ctx, send: torch.Tensor, h: _Handle) -> torch.Tensor:
        recv = send.new_empty(sum(h.recv_splits))
        h.work = dist.all_to_all_single(recv, send, h.recv_splits, h.send_splits, group=h.group, async_op=True)
        h.keep = send
        ctx.h = h
        return recv

    @staticmethod
    def backward(ctx, _grad: torch.Tensor):
        h = ctx.h
        h.work.wait()  # the gradients' exchange `_Wait.backward` posted
        back, h.work, h.keep, h.back = h.back, None, None, None
        return back, None


class _Wait(torch.autograd.Function):
    @staticmethod
    def forward(ctx, recv: torch.Tensor, h: _Handle) -> torch.Tensor:
        h.work.wait()
        h.work = h.keep = None
        ctx.h = h
        return recv.view_as(recv)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        h = ctx.h
        grad = grad.contiguous()
        h.back = grad.new_empty(sum(h.send_splits))
        h.work = dist.all_to_all_single(h.back, grad, h.send_splits, h.recv_splits, group=h.group, async_op=True)
        h.keep = grad
        return grad, None  # `_Post.backward` ignores it and takes the exchanged gradient instead


def _exchange(send: torch.Tensor, h: _Handle) -> Callable[[], torch.Tensor]:
    """Post the exchange now; the returned call waits for it and gives what arrived (1-D)."""
    recv = _Post.apply(send, h)
    return lambda: _Wait.apply(recv, h)


def _send_qkv(q: torch.Tensor, kv: torch.Tensor, c: HalfContext) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
    """Post Q rows and K/V rows to their executors (per destination: its Q rows, then its K/V rows, flattened);
    the returned call waits and gives the received Q [rows, Hq, D] and K/V [rows, 2*Hkv, D]."""
    qe, kve = q.shape[1] * q.shape[2], kv.shape[1] * kv.shape[2]
    qs = q.index_select(0, c.q_send).reshape(-1).split([n * qe for n in c.q_send_counts])
    kvs = kv.index_select(0, c.kv_send).reshape(-1).split([n * kve for n in c.kv_send_counts])
    send = torch.cat([t for pair in zip(qs, kvs) for t in pair])
    h = _Handle(c.group, [a * qe + b * kve for a, b in zip(c.q_send_counts, c.kv_send_counts)],
                [a * qe + b * kve for a, b in zip(c.q_recv_counts, c.kv_recv_counts)])
    wait = _exchange(send, h)

    def arrived() -> tuple[torch.Tensor, torch.Tensor]:
        parts = wait().split([n for a, b in zip(c.q_recv_counts, c.kv_recv_counts) for n in (a * qe, b * kve)])
        return (torch.cat(parts[0::2]).view(-1, *q.shape[1:]), torch.cat(parts[1::2]).view(-1, *kv.shape[1:]))
    return arrived


def _attend(block: Block, q: torch.Tensor, kv: torch.Tensor, c: HalfContext, stamp: Callable[[], Any]) -> torch.Tensor:
    """This replica's tasks: queries q (task order) against their key windows picked out of the received K/V
    (the block's attention core: recomputed under selective recomputation where its kernel would keep scores)."""
    keys = kv.index_select(0, c.k_index)
    start = stamp()
    if q.shape[0]:
        k, v = keys.chunk(2, dim=1)
        o = block.attn.core(window_attention, q, k, v, c.windows, windows=c.windows)
    else:  # no task here, but the exchanges' backward is collective: keep them in the graph
        o = q + 0 * kv.sum()
    c.stamps.append((start, stamp()))
    return o


def _send_home(o: torch.Tensor, c: HalfContext) -> Callable[[], torch.Tensor]:
    """Post the task outputs home (task order groups them by home); the call waits and puts them in local order."""
    e = o.shape[1] * o.shape[2]
    wait = _exchange(o.reshape(-1), _Handle(c.group, [n * e for n in c.out_send_counts], [n * e for n in c.out_recv_counts]))
    return lambda: wait().view(-1, *o.shape[1:]).index_select(0, c.out_place)


def _projections(block: Block, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n: int) -> tuple[torch.Tensor, ...]:
    """The layer up to its attention core: Q and K/V [n, 2*Hkv/tp, D] of the n tokens whose SP rows are x."""
    q, k, v = block.attn.qkv(block.attn_norm(x), cos, sin, n)
    return q, torch.cat([k, v], dim=1)


def _rest(block: Block, x: torch.Tensor, o: torch.Tensor, n: int) -> torch.Tensor:
    """The layer after its attention core: output projection (back on SP rows), residual and MLP."""
    x = x + block.attn.out(o)
    return x + block.mlp(block.mlp_norm(x), n)


def pingpong_forward(mod: StageModule, halves: Sequence[PackedBatch], stamp: Callable[[], Any]) -> torch.Tensor:
    """StageModule.forward (pp = 1: embedding to loss) of a CAD step's halves, interleaved layer by layer;
    returns the sum of both halves' token losses. Sub-modules are called as modules, so LNK's pull hooks fire.
    Under full recomputation each layer's parts before and after its exchanges keep only their inputs and run
    again in the backward; the exchanged Q, K/V and attention outputs are kept (re-running the exchanges would
    need every replica to recompute in step)."""
    cfg = mod.cfg
    xs = [mod.embed(h.tokens) for h in halves]
    ropes = [rope_tables(h.positions, cfg.head_dim, cfg.rope_theta, mod.dtype, cfg.rope_scaling) for h in halves]
    for block in mod.layers.values():
        run = recomputed if block.recompute == "full" else (lambda fn, *a: fn(*a))
        sent = [_send_qkv(*run(_projections, block, x, cos, sin, h.num_tokens), h.cp)
                for x, (cos, sin), h in zip(xs, ropes, halves)]
        back = [_send_home(_attend(block, *arrived(), h.cp, stamp), h.cp) for arrived, h in zip(sent, halves)]
        for i, home in enumerate(back):
            xs[i] = run(_rest, block, xs[i], home(), halves[i].num_tokens)
    return sum(mod.head(mod.norm(x), h.labels) for x, h in zip(xs, halves))


def run_cad(mod: StageModule, steps: Sequence[CADBatch], loss_scale: float, stamp: Callable[[], Any],
            before_last_backward: Callable[[], None] | None = None) -> torch.Tensor:
    """Forward and backward of every step (pp = 1, so 1F1B is one after the other); gradients go where the
    module's hooks put them. Returns the scaled loss summed over steps, on the device."""
    loss = torch.zeros((), dtype=torch.float64, device=steps[0].halves[0].tokens.device if steps else "cpu")
    for i, step in enumerate(steps):
        y = pingpong_forward(mod, step.halves, stamp) * loss_scale
        loss += y.detach().double()
        if i == len(steps) - 1 and before_last_backward is not None:
            before_last_backward()
        y.backward()
    return loss
