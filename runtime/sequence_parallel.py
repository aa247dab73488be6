"""Megatron tensor parallelism with sequence parallelism (Korthikanti et al. 2022, §4.2.2), for packed tokens.

Outside the TP regions (norms, residual adds, the embedding's output, the head's input) TP rank t of tp holds
rows [t*r, (t+1)*r) of the micro-batch's n packed tokens, r = ceil(n/tp) (`TPGroup.rows`; the last ranks'
rows past n are zero padding, which no attention, label or document boundary ever sees). A column-parallel
block starts with an all-gather of the rows into the n tokens (`gather_linear`) and a row-parallel one ends
with a reduce-scatter of its partial sums back into rows (`scatter_to_sp`), instead of the identity and
all-reduce of TP without SP; each runs the other collective in the backward. `gather_linear` keeps only the
rank's rows for its backward and gathers them again there, so every activation kept between forward and
backward is split by TP (the extra all-gather of §4.2.2). A replicated weight used on the rows (the RMSNorm
weights) sees only its rank's tokens, so each TP rank's gradient of it is a part, which LNK push sums at the
owners with every other contribution (runtime/lnk.py). With tp = 1 every function here is the identity or a
plain GEMM.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F


@dataclass(frozen=True)
class TPGroup:
    """A stage's tensor-parallel group as seen by one of its ranks (size 1: no communication)."""

    group: dist.ProcessGroup | None = None
    size: int = 1
    rank: int = 0

    def rows(self, n: int) -> int:
        """Rows of a micro-batch of n packed tokens this rank holds outside the TP regions."""
        return -(-n // self.size)


def _all_gather_rows(x: torch.Tensor, tp: TPGroup, n: int) -> torch.Tensor:
    """Every TP rank's rows, in rank order, cut to the n packed tokens."""
    out = x.new_empty(tp.size * x.shape[0], *x.shape[1:])
    dist.all_gather_single(out, x.contiguous(), group=tp.group)
    return out[:n]


def _reduce_scatter_rows(y: torch.Tensor, tp: TPGroup) -> torch.Tensor:
    """This rank's rows of the TP ranks' summed [n, ...] partial results (padded to tp * rows first)."""
    rows = tp.rows(y.shape[0])
    padded = y.new_zeros(tp.size * rows, *y.shape[1:])
    padded[: y.shape[0]] = y
    out = y.new_empty(rows, *y.shape[1:])
    dist.reduce_scatter_single(out, padded, group=tp.group)
    return out


class _GatherLinear(torch.autograd.Function):
    """x_all @ W_i.T for each weight, x_all the n tokens of every TP rank's rows x; keeps x, not x_all."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, n: int, tp: TPGroup, *weights: torch.Tensor):
        ctx.save_for_backward(x, *weights)
        ctx.n, ctx.tp = n, tp
        full = _all_gather_rows(x, tp, n)
        return tuple(F.linear(full, w) for w in weights)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):
        x, *weights = ctx.saved_tensors
        full = _all_gather_rows(x, ctx.tp, ctx.n)
        dfull = sum(g @ w for g, w in zip(grads, weights))
        return (_reduce_scatter_rows(dfull, ctx.tp), None, None, *(g.T @ full for g in grads))


class _ScatterToSP(torch.autograd.Function):
    """Forward: reduce-scatter the TP ranks' partial [n, ...] results into rows; backward: all-gather."""

    @staticmethod
    def forward(ctx, y: torch.Tensor, tp: TPGroup):
        ctx.n, ctx.tp = y.shape[0], tp
        return _reduce_scatter_rows(y, tp)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _all_gather_rows(grad, ctx.tp, ctx.n), None


def gather_linear(x: torch.Tensor, n: int, tp: TPGroup, *weights: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Column-parallel GEMMs (y = x_all @ W.T, W this rank's output slice) entering a TP region from the SP
    rows x [rows, in] of a micro-batch of n tokens: one [n, out/tp] result per weight."""
    if tp.size == 1:
        return tuple(F.linear(x, w) for w in weights)
    return _GatherLinear.apply(x, n, tp, *weights)


def scatter_to_sp(y: torch.Tensor, tp: TPGroup) -> torch.Tensor:
    """Leave a TP region: this rank's rows of the sum of the TP ranks' partial results y [n, ...]."""
    return y if tp.size == 1 else _ScatterToSP.apply(y, tp)
