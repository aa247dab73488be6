"""Activation recomputation, a per-pipeline choice (the plan's `recompute`, docs/formats.md):

- "none": every op keeps what its backward needs, no more (the norms their input and rstd, SwiGLU its gate
  and up projections and their product: model.RMSNorm, `swiglu_down`);
- "selective": what is cheap to recompute and large is dropped after the forward and recomputed in the
  backward: the SwiGLU intermediates (`swiglu_down` keeps the gate and up projections; silu and their
  product are recomputed, elementwise) and the attention core's score matrices where the kernel would keep
  them (model.Attention.core: the CPU exact backend's bottom-right windows of Seq1F1B splits and CP runs;
  the flash kernels recompute their scores in their own backward, so on GPUs only the SwiGLU part changes);
- "full": each decoder layer keeps only its input and runs its forward again in the backward.

Recomputation re-runs collectives (TP gathers, the CP K/V gather, CAD exchanges) in the backward; every rank
of the group runs the same layers in the same order, so they meet. `recomputed` always re-runs its function
whole (no early stop), so a collective after the last kept tensor is not skipped on some ranks only.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils import checkpoint

from hydraplan.runtime import kernels

MODES = ("none", "selective", "full")


def recomputed(fn: Callable[..., torch.Tensor | tuple[torch.Tensor, ...]], *args):
    """fn(*args), keeping only its inputs: its forward runs again when the backward reaches it."""
    with checkpoint.set_checkpoint_early_stop(False):
        return checkpoint.checkpoint(fn, *args, use_reentrant=False, preserve_rng_state=False)


class _SwiGLUDown(torch.autograd.Function):
    """(silu(g) * u) @ w keeping only g, u and w: silu(g) and the product are recomputed in the backward."""

    @staticmethod
    def forward(ctx, g: torch.Tensor, u: torch.Tensor, w: torch.Tensor):
        ctx.save_for_backward(g, u, w)
        return kernels.active().swiglu(g, u) @ w

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        g, u, w = ctx.saved_tensors
        dg, du = kernels.active().swiglu_backward(dy @ w.T, g, u)
        return dg, du, kernels.active().swiglu(g, u).T @ dy


class _SwiGLU(torch.autograd.Function):
    """silu(g) * u keeping only g and u (autograd would keep silu(g) as well: 8f bytes per token in bf16 with the
    product the down projection keeps, where the memory model charges 6f); silu is recomputed in the backward."""

    @staticmethod
    def forward(ctx, g: torch.Tensor, u: torch.Tensor):
        ctx.save_for_backward(g, u)
        return kernels.active().swiglu(g, u)

    @staticmethod
    def backward(ctx, dp: torch.Tensor):
        return kernels.active().swiglu_backward(dp, *ctx.saved_tensors)


def swiglu_down(g: torch.Tensor, u: torch.Tensor, w: torch.Tensor, mode: str) -> torch.Tensor:
    """The MLP's (silu(g) * u) @ w: under selective recomputation its intermediates are not kept; otherwise the
    gate, the up projection and their product are (the product for w's gradient)."""
    return _SwiGLUDown.apply(g, u, w) if mode == "selective" else _SwiGLU.apply(g, u) @ w
