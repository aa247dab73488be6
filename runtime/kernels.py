"""The elementwise blocks of a layer and of the loss as plain tensor functions: eager by default, compiled by
`torch.compile` under `run_plan --compile` (`use(compiled())`), so each block's chain of elementwise kernels (RMSNorm's
square-mean-rsqrt-scale, RoPE's rotate, SwiGLU's silu-multiply and their backwards, the loss's upcast-shift-exp-sum)
becomes one fused kernel per block.

What the backward keeps does not change for RMSNorm and SwiGLU: their custom autograd Functions (model._RMSNorm,
recompute._SwiGLU and _SwiGLUDown) decide what they save and call the compiled functions inside their forward and
backward, where autograd does not record (the compiled graphs are inference graphs, nothing of theirs is saved).
RoPE and the loss's local part are differentiated by autograd, so compiled they are AOTAutograd graphs whose
partitioner picks what to save: for a layer (RoPE) the same storages as eager (tests/test_kernels.py); for the
loss it is not measured (eager keeps the fp32 exponentials of the logits).

`EAGER` and `compiled()` are the two sets; `active()` is the one the model uses now, `using(EAGER)` a scope that runs
the eager set (the fp64 --verify reference on rank 0 stays eager whatever the run uses)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, fields
from typing import Callable

import torch
import torch.nn.functional as F


def upcast(x: torch.Tensor) -> torch.Tensor:
    """fp32 for bf16/fp16 (what their reductions and the loss run in), else x itself."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(x * rstd(x) * w in x's dtype, rstd in fp32 for bf16/fp16)."""
    xf = upcast(x)
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * rstd).to(x.dtype) * w, rstd


def rms_norm_backward(dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor, rstd: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx, dw) of `rms_norm`; dw's sum over tokens in fp32 for bf16/fp16 (Megatron's fp32 main grads)."""
    xf = upcast(x)
    xhat = xf * rstd
    dw = (dy.to(xhat.dtype) * xhat.to(x.dtype).to(xhat.dtype)).flatten(0, -2).sum(0).to(w.dtype)
    dxhat = dy.to(xhat.dtype) * w.to(xhat.dtype)
    dx = rstd * (dxhat - xhat * (dxhat * xhat).mean(-1, keepdim=True))
    return dx.to(x.dtype), dw


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def swiglu(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    return F.silu(g) * u


def swiglu_backward(dp: torch.Tensor, g: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(dg, du) of `swiglu` given the product's gradient dp."""
    sig = torch.sigmoid(g)
    return dp * u * sig * (1 + g * (1 - sig)), dp * (g * sig)


def loss_parts(logits: torch.Tensor, m: torch.Tensor, idx: torch.Tensor, inside: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """The local part of the vocab-parallel cross-entropy, in fp32 whatever the logits' dtype: each token's sum
    of exp(logit - m) over this rank's vocabulary slice, and its label's shifted logit (0 off the slice)."""
    z = upcast(logits) - m[:, None]
    target = z.gather(1, idx[:, None]).squeeze(1).masked_fill(~inside, 0.0)
    return z.exp().sum(dim=-1), target


@dataclass(frozen=True)
class Kernels:
    rms_norm: Callable
    rms_norm_backward: Callable
    rope: Callable
    swiglu: Callable
    swiglu_backward: Callable
    loss_parts: Callable


EAGER = Kernels(rms_norm, rms_norm_backward, rope, swiglu, swiglu_backward, loss_parts)
_active = [EAGER]


def active() -> Kernels:
    return _active[-1]


def compiled(backend: str = "inductor") -> Kernels:
    """Every block torch.compile'd (dynamic shapes: micro-batches vary in length); compiles at first use."""
    return Kernels(**{f.name: torch.compile(getattr(EAGER, f.name), backend=backend, dynamic=True)
                      for f in fields(Kernels)})


def use(k: Kernels) -> None:
    """Make every block run `k`'s functions from now on (run_plan --compile: `use(compiled())`)."""
    _active[:] = [k]


@contextlib.contextmanager
def using(k: Kernels) -> Iterator[None]:
    _active.append(k)
    try:
        yield
    finally:
        _active.pop()
