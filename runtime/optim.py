"""The optimization phase: master weights and AdamW state of this rank's fixed shards (Hydraulis §5.2).

The shards never move when the strategy changes, so a strategy switch costs nothing here; only pull and
push (lnk.py) adapt. The single-process reference uses the same optimizer factory, so both apply the
same elementwise update and differ only by the summation order of gradients.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from hydraplan.runtime.lnk import owner_ranges
from hydraplan.runtime.model import ModelConfig, init_range, param_specs

BETAS = (0.9, 0.95)
WEIGHT_DECAY = 0.1


def make_optimizer(params: list[nn.Parameter], lr: float) -> torch.optim.AdamW:
    return torch.optim.AdamW(params, lr=lr, betas=BETAS, weight_decay=WEIGHT_DECAY, foreach=False)


def master_dtype(compute: torch.dtype) -> torch.dtype:
    """fp32 masters for mixed precision; fp64 when computing in fp64 (exact verification)."""
    return torch.float64 if compute == torch.float64 else torch.float32


class ShardedMaster:
    """Rank `rank`'s shard of every parameter (canonical order, one flat buffer) and its AdamW state."""

    def __init__(self, cfg: ModelConfig, rank: int, world: int, dtype: torch.dtype, seed: int, lr: float,
                 device: torch.device | str = "cpu"):
        specs = param_specs(cfg)
        lo, hi = owner_ranges(np.array([s.numel for s in specs], dtype=np.int64), world)
        flat = torch.cat([init_range(s, i, seed, int(lo[rank, i]), int(hi[rank, i]), dtype) for i, s in enumerate(specs)])
        self.weights = nn.Parameter(flat.to(device))
        self.optimizer = make_optimizer([self.weights], lr)

    def step(self, grad: torch.Tensor) -> None:
        self.weights.grad = grad
        self.optimizer.step()
        self.weights.grad = None

    def held_bytes(self) -> int:
        """Bytes of the shard's weights and the AdamW state tensors that exist now (none before the first step)."""
        tensors = [self.weights, *(t for st in self.optimizer.state.values() for t in st.values() if torch.is_tensor(t))]
        return sum(t.numel() * t.element_size() for t in tensors)

    def state(self) -> dict:
        """The shard's weights and AdamW state (exp_avg, exp_avg_sq, step): what a checkpoint holds."""
        return {"weights": self.weights.detach(), "optimizer": self.optimizer.state_dict()}

    @torch.no_grad()
    def load(self, weights: torch.Tensor, optimizer: dict | None = None) -> None:
        """Replace the shard's weights (and the AdamW state, when given: resuming)."""
        if weights.shape != self.weights.shape:
            raise ValueError(f"shard of {weights.numel()} elements, expected {self.weights.numel()}")
        self.weights.copy_(weights)
        if optimizer is not None:
            self.optimizer.load_state_dict(optimizer)
