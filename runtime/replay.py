"""One rank's side of a training iteration replayed from a plan: pull, 1F1B or Seq1F1B (on its CP share of
the tokens), push, AdamW step."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from hydraplan.runtime import lnk
from hydraplan.runtime.batches import TokenData
from hydraplan.runtime.cad import step_micro_batches
from hydraplan.runtime.context_parallel import CPShards
from hydraplan.runtime.groups import GroupCache
from hydraplan.runtime.model import ModelConfig, StageModule, TPGroup, param_specs
from hydraplan.runtime.optim import ShardedMaster, master_dtype
from hydraplan.runtime.pipeline_exec import StageComm, run_1f1b
from hydraplan.runtime.plans import RankRole, micro_batch_seqs, rank_roles, strategy_key
from hydraplan.runtime.seq1f1b import pipeline_splits, run_seq1f1b
from hydraplan.schema import Plan


@dataclass(frozen=True)
class Setup:
    """Per-strategy state of one rank, cached: its role and its LNK plan."""

    role: RankRole | None
    link: lnk.LinkPlan


@dataclass(frozen=True)
class StepStats:
    """Global token-mean loss and this rank's wall time per phase of one iteration."""

    loss: float
    pull_s: float
    propagate_s: float
    push_s: float

    @property
    def total_s(self) -> float:
        return self.pull_s + self.propagate_s + self.push_s


class Replayer:
    """Keeps this rank's optimizer shard for the whole run; rebuilds its stage module every iteration
    (cheap next to the pull that fills it), so no strategy's parameters linger in memory."""

    def __init__(self, cfg: ModelConfig, data: TokenData, dtype: torch.dtype, seed: int, lr: float, device: torch.device,
                 timeout: timedelta):
        self.cfg, self.data, self.dtype, self.device = cfg, data, dtype, device
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        specs = param_specs(cfg)
        self.numels = np.array([s.numel for s in specs], dtype=np.int64)
        self.sharded = np.array([s.sharded for s in specs], dtype=bool)
        self.master = ShardedMaster(cfg, self.rank, self.world, master_dtype(dtype), seed, lr, device)
        self.groups = GroupCache(timeout)
        self._setups: dict[tuple, Setup] = {}
        self.cad_attention_s: list[float] = []  # this rank's attention seconds per layer call of the last CAD plan
        self.last_role_cad = False  # whether this rank ran the last CAD plan (idle ranks report nothing)

    def setup(self, plan: Plan) -> Setup:
        self.groups.ensure(plan)
        key = strategy_key(plan)
        if key not in self._setups:
            roles = rank_roles(plan, self.world)
            link_roles = [r.link_role(self.cfg) if r else None for r in roles]
            self._setups[key] = Setup(roles[self.rank], lnk.plan_link(self.numels, self.sharded, link_roles, self.rank))
        return self._setups[key]

    def step(self, plan: Plan) -> StepStats:
        """One training iteration (collective over all ranks, idle ones included)."""
        s = self.setup(plan)
        t0 = time.perf_counter()
        flat = lnk.pull(s.link, self.master.weights.detach(), self.dtype)
        t1 = time.perf_counter()
        grads, loss = flat.new_empty(0), torch.zeros((), dtype=torch.float64)
        self.last_role_cad = s.role is not None and plan.cad is not None
        if s.role is not None:
            grads, loss = self._propagate(plan, s.role, flat)
        t2 = time.perf_counter()
        self.master.step(lnk.push(s.link, grads, self.master.weights.dtype))
        t3 = time.perf_counter()
        loss = loss.to(self.device)
        dist.all_reduce(loss)
        return StepStats(float(loss), t1 - t0, t2 - t1, t3 - t2)

    def _propagate(self, plan: Plan, role: RankRole, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        tp = TPGroup(self.groups.get(role.tp_ranks) if role.tp > 1 else None, role.tp, role.tp_rank)
        module = StageModule(self.cfg, pp=role.pp, stage=role.stage, tp=tp, dtype=self.dtype, device=self.device)
        params = module.ordered_params()
        with torch.no_grad():
            for p, chunk in zip(params, flat.split([p.numel() for p in params])):
                p.copy_(chunk.view_as(p))
        if plan.cad is not None:  # core-attention disaggregation: pp = 1 replicas exchange attention tasks
            group = self.groups.get(tuple(sorted(p.ranks[role.tp_rank] for p in plan.pipelines)))
            mbs = step_micro_batches(self.data, plan, role.pipeline, role.tp_rank, group, self.device)
            comm = StageComm(role.stage, role.pp, role.prev, role.next, self.cfg.hidden, self.dtype, self.device)
            loss = run_1f1b(module, mbs, comm, 1.0 / self.data.labeled_tokens(plan))
            self.cad_attention_s = [s for mb in mbs for s in mb.cp.attention_s]
            grads = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
            return grads, loss if role.tp_rank == 0 else torch.zeros_like(loss)
        mbs = [self.data.pack(seqs, self.device) for seqs in micro_batch_seqs(plan, plan.pipelines[role.pipeline])]
        cp = None
        if role.cp > 1:
            cp = CPShards.of(mbs, [mb.cp_shard for mb in plan.pipelines[role.pipeline].micro_batches], role.cp_rank,
                             role.cp_ranks, self.groups.get(role.cp_ranks))
        comm = StageComm(role.stage, role.pp, role.prev, role.next, self.cfg.hidden, self.dtype, self.device)
        scale = 1.0 / self.data.labeled_tokens(plan)
        splits = pipeline_splits(plan, role.pipeline)
        if splits is None:
            if cp is not None:
                mbs = [cp.split(m, mb, [0, mb.num_tokens])[0] for m, mb in enumerate(mbs)]
            loss = run_1f1b(module, mbs, comm, scale)
        else:
            loss = run_seq1f1b(module, mbs, splits, comm, scale, cp)[0]
        grads = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
        return grads, loss if role.tp_rank == 0 else torch.zeros_like(loss)

    def gather_weights(self) -> torch.Tensor | None:
        """All master weights in canonical order on rank 0 (None elsewhere). Collective."""
        lo, hi = lnk.owner_ranges(self.numels, self.world)
        sizes = (hi - lo).sum(axis=1)
        buf = self.master.weights.detach().new_zeros(int(sizes.max()))
        buf[: int(sizes[self.rank])] = self.master.weights.detach()
        parts = [torch.empty_like(buf) for _ in range(self.world)] if self.rank == 0 else None
        dist.gather(buf, parts, dst=0)
        if parts is None:
            return None
        offsets = [lnk.FlatLayout.of(lo[r], hi[r]).offset for r in range(self.world)]
        return torch.cat([parts[r][offsets[r][i]: offsets[r][i] + hi[r, i] - lo[r, i]]
                          for i in range(len(self.numels)) for r in range(self.world)])
