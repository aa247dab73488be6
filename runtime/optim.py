"""The optimization phase: master weights and AdamW state of this rank's fixed shards (Hydraulis §5.2).

The shards never move when the strategy changes, so a strategy switch costs nothing here; only pull and
push (lnk.py) adapt. Weight decay applies to matrices only, the learning rate follows a `Schedule` (warmup,
then constant, linear or cosine decay) and clipping scales by the global gradient norm over all owners. The
single-process reference (runtime/reference.py) does the same with torch's own means (AdamW parameter groups,
clip_grad_norm_), so a wrong decay range, norm or schedule step shows as a difference.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from hydraplan.runtime.lnk import owner_ranges
from hydraplan.runtime.model import ModelConfig, ParamSpec, init_range, param_specs

BETAS = (0.9, 0.95)
WEIGHT_DECAY = 0.1
DecayStyle = Literal["constant", "linear", "cosine"]
CLIP_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_'s: coefficient max_norm / (norm + eps), at most 1


@dataclass(frozen=True)
class Schedule:
    """Learning rate per optimizer step and gradient clipping (Megatron's --lr, --lr-warmup-iters,
    --lr-decay-style, --lr-decay-iters, --min-lr, --clip-grad). Step s (0 = the first) takes lr * (s+1)/warmup
    during the warmup, then decays from lr to min_lr over the steps up to decay_iters (linear: 1 - r, cosine:
    (1 + cos(pi r))/2 of the way, r the share of the decay done) and stays at min_lr after it. clip > 0 scales
    the global gradient down to that L2 norm when it is larger (0: no clipping)."""

    lr: float
    warmup: int = 0
    style: DecayStyle = "constant"
    min_lr: float = 0.0
    decay_iters: int = 0
    clip: float = 0.0

    def lr_at(self, step: int) -> float:
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        if self.style == "constant":
            return self.lr
        if step >= self.decay_iters:
            return self.min_lr
        r = (step - self.warmup) / (self.decay_iters - self.warmup)
        coeff = 1.0 - r if self.style == "linear" else 0.5 * (1.0 + math.cos(math.pi * r))
        return self.min_lr + coeff * (self.lr - self.min_lr)


def decays(spec: ParamSpec) -> bool:
    """Weight decay on matrices only, not on norm weights and biases (Megatron's default)."""
    return len(spec.shape) > 1


def make_optimizer(params: list[nn.Parameter], lr: float, no_decay: list[nn.Parameter] = ()) -> torch.optim.AdamW:
    groups = [{"params": params, "weight_decay": WEIGHT_DECAY}] + ([{"params": list(no_decay), "weight_decay": 0.0}]
                                                                   if no_decay else [])
    return torch.optim.AdamW(groups, lr=lr, betas=BETAS, foreach=False)


def clip_coefficient(norm: float, clip: float) -> float:
    return min(1.0, clip / (norm + CLIP_EPS)) if clip > 0 else 1.0


def master_dtype(compute: torch.dtype) -> torch.dtype:
    """fp32 masters for mixed precision; fp64 when computing in fp64 (exact verification)."""
    return torch.float64 if compute == torch.float64 else torch.float32


class ShardedMaster:
    """Rank `rank`'s shard of every parameter (canonical order, one flat buffer) and its AdamW state. The
    shard mixes matrices and norm weights, so AdamW runs without weight decay and the decoupled decay
    (torch's param *= 1 - lr * wd, before the update) is applied here to the matrices' ranges only; the global
    gradient norm for clipping is the shards' squared norms summed over all ranks (each element is owned once)."""

    def __init__(self, cfg: ModelConfig, rank: int, world: int, dtype: torch.dtype, seed: int, lr: float,
                 device: torch.device | str = "cpu"):
        specs = param_specs(cfg)
        lo, hi = owner_ranges(np.array([s.numel for s in specs], dtype=np.int64), world)
        flat = torch.cat([init_range(s, i, seed, int(lo[rank, i]), int(hi[rank, i]), dtype) for i, s in enumerate(specs)])
        self.weights = nn.Parameter(flat.to(device))
        self.optimizer = torch.optim.AdamW([self.weights], lr=lr, betas=BETAS, weight_decay=0.0, foreach=False)
        self.schedule = Schedule(lr)
        self.steps = 0  # optimizer steps taken (restored by `load` with the AdamW state)
        self.last_grad_norm: float | None = None  # the global gradient norm of the last step (when clipping)
        self.world = world
        self._decayed: list[tuple[int, int]] = []  # flat ranges of the shard that take weight decay, merged
        at = 0
        for i, spec in enumerate(specs):
            n = int(hi[rank, i] - lo[rank, i])
            if n and decays(spec):
                if self._decayed and self._decayed[-1][1] == at:
                    self._decayed[-1] = (self._decayed[-1][0], at + n)
                else:
                    self._decayed.append((at, at + n))
            at += n

    def step(self, grad: torch.Tensor) -> None:
        """One update from the owner shard's summed gradient (collective over all ranks when clipping)."""
        lr = self.schedule.lr_at(self.steps)
        if self.schedule.clip > 0:
            sq = grad.double().pow(2).sum().reshape(1)
            if self.world > 1:
                dist.all_reduce(sq)
            self.last_grad_norm = float(sq.sqrt())
            grad = grad * clip_coefficient(self.last_grad_norm, self.schedule.clip)
        with torch.no_grad():
            for a, b in self._decayed:
                self.weights[a:b].mul_(1 - lr * WEIGHT_DECAY)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.weights.grad = grad
        self.optimizer.step()
        self.weights.grad = None
        self.steps += 1

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
            self.optimizer.param_groups[0]["weight_decay"] = 0.0  # decay is applied by `step`, on matrices only
            self.steps = int(next(iter(self.optimizer.state.values()), {}).get("step", 0))
