"""Gradient accumulation of one stage: every backward's parameter gradient is added into one flat buffer
(canonical order, the layout LNK push reads) in the accumulation dtype -- fp32 for bf16 compute, the master
dtype in general -- and the parameter's own .grad is dropped (Megatron's main_grad). So micro-batches and
Seq1F1B splits accumulate in fp32 whatever the compute dtype, and there is never a second concatenated copy.

The executors announce the stage's last backward (`last_backward`); during it, a layer group whose
parameters have all received their final gradient is handed to `on_ready` at once (PushStream.ready), so
its push overlaps the backward of the layers below it."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn


class GradBuffer:
    def __init__(self, sizes: Sequence[int], groups: Sequence[int], dtype: torch.dtype, device: torch.device | str = "cpu",
                 on_ready: Callable[[int], None] | None = None):
        """sizes[i], groups[i]: numel and layer group of the stage's i-th parameter (canonical order)."""
        self.flat = torch.zeros(sum(sizes), dtype=dtype, device=device)
        self._views = self.flat.split(list(sizes))
        self._groups = list(groups)
        self.on_ready = on_ready
        self._final = False
        self._pending: dict[int, int] = {}
        for g in groups:
            self._pending[g] = self._pending.get(g, 0) + 1
        self._handles = []

    @classmethod
    def of(cls, params: Sequence[nn.Parameter], groups: Sequence[int], dtype: torch.dtype,
           on_ready: Callable[[int], None] | None = None) -> "GradBuffer":
        buf = cls([p.numel() for p in params], groups, dtype, params[0].device if params else "cpu", on_ready)
        for i, p in enumerate(params):
            buf.attach(i, p)
        return buf

    def attach(self, i: int, p: nn.Parameter) -> None:
        """Accumulate parameter i's gradients (p: the live parameter, e.g. once bound to its pulled buffer)."""
        self._handles.append(p.register_post_accumulate_grad_hook(self._hook(self._views[i], self._groups[i])))

    def _hook(self, view: torch.Tensor, group: int):
        def hook(p: nn.Parameter) -> None:
            view.add_(p.grad.reshape(-1))  # promotes bf16 -> fp32: the accumulation happens in `view`'s dtype
            p.grad = None
            if self._final:
                self._pending[group] -= 1
                if self._pending[group] == 0 and self.on_ready is not None:
                    self.on_ready(group)
        return hook

    def last_backward(self) -> None:
        """Called right before the stage's last backward of the iteration."""
        self._final = True

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
