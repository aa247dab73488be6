"""Single-process training on the same batches: the ground truth `run_plan.py --verify` compares against.

It mirrors the distributed job's numerics (master weights in the master dtype, a compute copy in the
compute dtype, AdamW with weight decay on the matrices only, the same learning-rate schedule, gradient clipping
by torch's clip_grad_norm_, and the same 1/labeled-tokens loss scaling) but has no TP, PP, shards or
heterogeneous pipelines, so any resharding or scheduling bug shows up as a parameter difference.
"""

from __future__ import annotations

import torch
from torch import nn

from hydraplan.core.schema import Plan
from hydraplan.runtime.batches import TokenData
from hydraplan.runtime.model import ModelConfig, StageModule, init_full, param_specs
from hydraplan.runtime.optim import Schedule, decays, make_optimizer, master_dtype


class Reference:
    def __init__(self, cfg: ModelConfig, data: TokenData, seed: int, dtype: torch.dtype, lr: float,
                 device: torch.device | str = "cpu"):
        self.data, self.device = data, device
        mdt = master_dtype(dtype)
        self.master = [nn.Parameter(init_full(s, i, seed, mdt).to(device)) for i, s in enumerate(param_specs(cfg))]
        self.model = StageModule(cfg, dtype=dtype, device=device)
        specs = param_specs(cfg)
        self.optimizer = make_optimizer([m for m, s in zip(self.master, specs) if decays(s)], lr,
                                        [m for m, s in zip(self.master, specs) if not decays(s)])
        self.schedule = Schedule(lr)  # the run's (run_plan sets both); clipping by torch's clip_grad_norm_
        self.steps = 0

    @torch.no_grad()
    def load(self, weights: list[torch.Tensor]) -> None:
        """Start from these canonical tensors instead of the seeded initialization (run_plan --init-from)."""
        for m, w in zip(self.master, weights, strict=True):
            m.copy_(w)

    def step(self, plan: Plan) -> float:
        """Train one iteration on all of the plan's micro-batches; returns the token-mean loss."""
        with torch.no_grad():
            for p, m in zip(self.model.ordered_params(), self.master):
                p.copy_(m)
        loss = self._backward(plan)
        for p, m in zip(self.model.ordered_params(), self.master):
            m.grad = p.grad.to(m.dtype)
        if self.schedule.clip > 0:
            torch.nn.utils.clip_grad_norm_(self.master, self.schedule.clip)
        for group in self.optimizer.param_groups:
            group["lr"] = self.schedule.lr_at(self.steps)
        self.optimizer.step()
        self.steps += 1
        return loss

    def gradient(self, plan: Plan, weights: torch.Tensor) -> torch.Tensor:
        """The global batch's gradient at these weights (flat, canonical order), without a step: what
        `--verify` compares a bf16/fp32 run's summed gradient with, from an fp64 reference."""
        params = self.model.ordered_params()
        with torch.no_grad():
            for p, w in zip(params, weights.split([p.numel() for p in params])):
                p.copy_(w.view_as(p))
        self._backward(plan)
        return torch.cat([p.grad.reshape(-1) for p in params])

    def _backward(self, plan: Plan) -> float:
        self.model.zero_grad(set_to_none=True)
        scale = 1.0 / self.data.labeled_tokens(plan)
        loss = 0.0
        # a CAD plan splits documents over replicas; the reference trains each document whole, once
        mbs = ([self.data.pack([s], self.device) for s in plan.batch] if plan.cad is not None else
               [mb for pipeline in plan.pipelines for mb in self.data.micro_batches(plan, pipeline, self.device)])
        for mb in mbs:
            mb_loss = self.model(None, mb) * scale
            mb_loss.backward()
            loss += float(mb_loss.detach())
        return loss

    def flat_weights(self) -> torch.Tensor:
        """All master weights, flattened in canonical order."""
        return torch.cat([m.detach().reshape(-1) for m in self.master])
