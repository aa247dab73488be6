"""1F1B execution of one pipeline stage's micro-batches (Megatron's non-interleaved schedule).

Activation shapes come from the plan ([tokens of micro-batch i, hidden]; with CP the tokens of this CP
rank's share, which the same CP rank of the neighbouring stage holds), so receivers allocate buffers
without a shape handshake. Opposite-direction transfers between neighbours are posted together with
batch_isend_irecv, which keeps the schedule deadlock-free even when a send waits for its receive (NCCL).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from hydraplan.runtime.batches import PackedBatch
from hydraplan.runtime.model import StageModule


@dataclass(frozen=True)
class StageComm:
    stage: int
    pp: int
    prev: int | None
    next: int | None
    hidden: int
    dtype: torch.dtype
    device: torch.device


def _p2p(ops: list[tuple]) -> None:
    if ops:
        for work in dist.batch_isend_irecv([dist.P2POp(op, t, peer) for op, t, peer in ops]):
            work.wait()


def run_1f1b(module: StageModule, mbs: list[PackedBatch], comm: StageComm, loss_scale: float,
             before_last_backward: Callable[[], None] | None = None) -> torch.Tensor:
    """Forward and backward every micro-batch; gradients accumulate in the module's .grad (or wherever its
    post-accumulate-grad hooks put them, runtime/grads.py; `before_last_backward` announces the last one).
    Each micro-batch's summed token loss is multiplied by `loss_scale` (1 / tokens of the global batch)
    before backward. Returns the scaled loss summed over micro-batches (0 except on the last stage), on the
    device: reading it to the host per micro-batch would stall the GPU's queue."""
    V = len(mbs)
    warmup = min(V, comm.pp - comm.stage - 1)
    inputs: list[torch.Tensor | None] = [None] * V
    outputs: list[torch.Tensor | None] = [None] * V
    loss = torch.zeros((), dtype=torch.float64, device=comm.device)

    def buf(i: int) -> torch.Tensor:
        return torch.empty(mbs[i].num_tokens, comm.hidden, dtype=comm.dtype, device=comm.device)

    def forward(i: int, x: torch.Tensor | None) -> torch.Tensor | None:
        nonlocal loss
        if x is not None:
            x.requires_grad_()
        inputs[i] = x
        y = module(x, mbs[i])
        if module.last:
            y = y * loss_scale
            loss += y.detach().double()
        outputs[i] = y
        return None if module.last else y.detach()

    def backward(i: int, grad: torch.Tensor | None) -> torch.Tensor | None:
        if i == V - 1 and before_last_backward is not None:
            before_last_backward()
        torch.autograd.backward(outputs[i], grad_tensors=grad)
        dx = None if module.first else inputs[i].grad
        inputs[i] = outputs[i] = None
        return dx

    def exchange(send_next=None, send_prev=None, recv_prev: int | None = None, recv_next: int | None = None):
        """One batched step; returns (activation from prev, gradient from next)."""
        ops, x, g = [], None, None
        if send_next is not None and comm.next is not None:
            ops.append((dist.isend, send_next, comm.next))
        if send_prev is not None and comm.prev is not None:
            ops.append((dist.isend, send_prev, comm.prev))
        if recv_prev is not None and comm.prev is not None:
            x = buf(recv_prev)
            ops.append((dist.irecv, x, comm.prev))
        if recv_next is not None and comm.next is not None:
            g = buf(recv_next)
            ops.append((dist.irecv, g, comm.next))
        _p2p(ops)
        return x, g

    for i in range(warmup):
        x, _ = exchange(recv_prev=i)
        exchange(send_next=forward(i, x))
    steady = V - warmup
    x = exchange(recv_prev=warmup)[0] if steady > 0 else None
    for j in range(steady):
        i = warmup + j
        _, g = exchange(send_next=forward(i, x), recv_next=j)
        dx = backward(j, g)
        x, _ = exchange(send_prev=dx, recv_prev=i + 1 if j < steady - 1 else None)
    for j in range(steady, V):
        _, g = exchange(recv_next=j)
        exchange(send_prev=backward(j, g))
    return loss
