"""One rank's side of a training iteration replayed from a plan: pull, 1F1B or Seq1F1B (on its CP share of
the tokens), push, AdamW step -- with pull and push per layer group overlapping the compute (runtime/lnk.py,
runtime/lnk_streams.py). Every time is read through the device seam (runtime/device.py)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from hydraplan.core.memory import LNK_PULL_DEPTH, LNK_PUSH_DEPTH
from hydraplan.core.schema import Plan
from hydraplan.runtime import faults, lnk, lnk_streams
from hydraplan.runtime.batches import TokenData
from hydraplan.runtime.cad import step_micro_batches
from hydraplan.runtime.cad_exec import run_cad
from hydraplan.runtime.context_parallel import CPShards
from hydraplan.runtime.device import Device
from hydraplan.runtime.grads import GradBuffer
from hydraplan.runtime.groups import GroupCache
from hydraplan.runtime.model import ModelConfig, StageModule, TPGroup, bind_params, group_entries, param_groups, param_specs
from hydraplan.runtime.optim import ShardedMaster, master_dtype
from hydraplan.runtime.pipeline_exec import StageComm, run_1f1b
from hydraplan.runtime.plan_roles import RankRole, rank_roles, strategy_key
from hydraplan.runtime.seq1f1b import pipeline_splits, run_seq1f1b


@dataclass(frozen=True)
class Setup:
    """Per-strategy state of one rank, cached: its role and its LNK plan."""

    role: RankRole | None
    link: lnk.LinkPlan


@dataclass(frozen=True)
class StepStats:
    """One iteration's global token-mean loss and its phases (wall seconds, the max over the ranks that run
    a stage; idle ranks only serve as owners and would report their idle waiting as exposed).

    pull_s / push_s: time that direction had an exchange in flight (LinkClock.busy_s);
    propagate_s: forward and backward of all micro-batches, including waits for pulls inside it;
    step_s: the AdamW step on the owner shard; exposed_s: time the compute was blocked on a pull or push
    exchange after every rank had posted it (communication not hidden); peer_wait_s: time it was blocked
    before that (a slower pipeline or stage: imbalance, not communication); pack_s: host seconds the LNK
    threads spent packing, unpacking and summing; iteration_s: the whole step; pull_wait_s: the part of
    propagate_s spent waiting on pulls (exposed or on a peer; none without overlap, where every pull completes
    before the propagation). On CUDA every instant is a CUDA event on the stream that did the work.
    hidden_s = pull_s + push_s - exposed_s - peer_wait_s is the in-flight time the rank did not wait for."""

    loss: float
    pull_s: float
    propagate_s: float
    push_s: float
    step_s: float = 0.0
    exposed_s: float = 0.0
    peer_wait_s: float = 0.0
    pack_s: float = 0.0
    iteration_s: float = 0.0
    pull_wait_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.iteration_s

    @property
    def hidden_s(self) -> float:
        return max(0.0, self.pull_s + self.push_s - self.exposed_s - self.peer_wait_s)


class Replayer:
    """Keeps this rank's optimizer shard for the whole run; rebuilds its stage module every iteration as
    views of the buffer pull fills (runtime/lnk.py PullStream), so no strategy's parameters linger in memory.
    Pull and push run on two process groups of their own, so their exchanges queue apart from each other and
    from the pipelines' traffic. `overlap=False` pulls everything before and pushes everything after the
    propagation (the baseline the overlap is measured against). `lnk_depth`: the layer groups pull and push
    keep in flight at most (runtime/lnk_streams.py; the memory model counts the default)."""

    def __init__(self, cfg: ModelConfig, data: TokenData, dtype: torch.dtype, seed: int, lr: float, dev: Device,
                 timeout: timedelta, overlap: bool = True, keep_grad: bool = False,
                 lnk_depth: tuple[int, int] = (LNK_PULL_DEPTH, LNK_PUSH_DEPTH)):
        self.cfg, self.data, self.dtype, self.dev, self.overlap = cfg, data, dtype, dev, overlap
        self.lnk_depth = lnk_depth
        self.device = dev.torch
        self.keep_grad = keep_grad  # keep the last summed owner-shard gradient for gather_grads (--verify)
        self.last_grad: torch.Tensor | None = None
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        specs = param_specs(cfg)
        self.numels = np.array([s.numel for s in specs], dtype=np.int64)
        self.sharded = np.array([s.sharded for s in specs], dtype=bool)
        self.groups_of = param_groups(cfg)
        self.master = ShardedMaster(cfg, self.rank, self.world, master_dtype(dtype), seed, lr, self.device)
        self.groups = GroupCache(timeout)
        ranks = list(range(self.world))
        self.pull_pg = dist.new_group(ranks, timeout=timeout)
        self.push_pg = dist.new_group(ranks, timeout=timeout)
        self._setups: dict[tuple, Setup] = {}
        self.cad_attention_s: list[float] = []  # this rank's attention seconds per layer call of the last CAD plan
        self.last_role_cad = False  # whether this rank ran the last CAD plan (idle ranks report nothing)
        # record_actions (`hydraplan profile --check`): plans without splits run as Seq1F1B with one split per
        # micro-batch (the same math and schedule as 1F1B) so every forward/backward action's thread CPU seconds are
        # kept: last_actions = (pipeline, stage, pp, {(op, m, s): seconds}) of the last step, None on an idle rank
        self.record_actions = False
        self.last_actions: tuple[int, int, int, dict] | None = None

    def setup(self, plan: Plan) -> Setup:
        self.groups.ensure(plan)
        return self.link_setup(plan)

    def link_setup(self, plan: Plan) -> Setup:
        """The strategy's Setup, made once and kept: roles and LNK plan, pure host work that makes no group (so
        a helper thread may make it ahead of the step, runtime/run_plan.py)."""
        key = strategy_key(plan)
        if key not in self._setups:
            roles = rank_roles(plan, self.world)
            link_roles = [r.link_role(self.cfg) if r else None for r in roles]
            self._setups[key] = Setup(roles[self.rank], lnk.plan_link(self.numels, self.sharded, link_roles, self.rank,
                                                                      self.groups_of))
        return self._setups[key]

    def step(self, plan: Plan) -> StepStats:
        """One training iteration (collective over all ranks, idle ones included)."""
        s = self.setup(plan)
        faults.inject(self.rank, plan.iteration)
        dev = self.dev
        dev.anchor()
        clock = lnk_streams.LinkClock(dev)
        mdt = self.master.weights.dtype
        t0 = dev.stamp()
        pull = lnk_streams.PullStream(s.link, self.master.weights.detach(), self.dtype, self.pull_pg, self.overlap, clock,
                                      self.lnk_depth[0])
        loss = torch.zeros((), dtype=torch.float64, device=self.device)
        self.last_role_cad = s.role is not None and plan.cad is not None
        self.last_actions = None
        if s.role is None:
            pull.start()
            pull.finish()
            t1 = dev.stamp()
            push = lnk_streams.PushStream(s.link, self.master.weights.new_empty(0, dtype=self.dtype), self.dtype,
                                          self.push_pg, self.overlap, clock, mdt, self.lnk_depth[1])
        else:
            t1, push, loss = self._propagate(plan, s, pull, clock)
        t2 = dev.stamp()
        grad = push.finish()
        del pull, push  # the pulled parameters, the stage gradients and LNK's buffers: not needed by the step
        t3 = dev.stamp()
        if self.keep_grad:
            self.last_grad = grad
        self.master.step(grad)
        t4 = dev.stamp()
        dev.synchronize()
        clock.resolve()
        t0, t1, t2, t3, t4 = (dev.seconds(t) for t in (t0, t1, t2, t3, t4))
        groups = len(s.link.pull_groups)
        keys = [(k, g) for k in ("pull", "push") for g in range(groups)]
        last_post = torch.tensor([clock.posts[key] for key in keys], dtype=torch.float64, device=self.device)
        dist.all_reduce(last_post, op=dist.ReduceOp.MAX)
        exposed, peer = clock.split_waits(dict(zip(keys, last_post.tolist())))
        pull_wait = sum(end - t for kind, _, t, end in clock.waits if kind == "pull") if self.overlap else 0.0
        phases = [clock.busy_s("pull"), t2 - t1, clock.busy_s("push"), t4 - t3, exposed, peer, clock.pack_s, t4 - t0,
                  pull_wait]
        stats = torch.tensor(phases if s.role is not None else [0.0] * len(phases), dtype=torch.float64, device=self.device)
        dist.all_reduce(stats, op=dist.ReduceOp.MAX)
        dist.all_reduce(loss)
        return StepStats(float(loss), *stats.tolist())

    def _propagate(self, plan: Plan, s: Setup, pull: lnk_streams.PullStream,
                   clock: lnk_streams.LinkClock) -> tuple[object, lnk_streams.PushStream, torch.Tensor]:
        """Pull (overlapped with the forward of the layers before), run the stage, push per layer group as the
        last backward finishes it. Returns the propagation start stamp, the push stream and the loss."""
        role = s.role
        tp = TPGroup(self.groups.get(role.tp_ranks) if role.tp > 1 else None, role.tp, role.tp_rank)
        module = StageModule(self.cfg, pp=role.pp, stage=role.stage, tp=tp, dtype=self.dtype, device="meta",
                             recompute=role.recompute)
        local = module.param_indices
        grads = GradBuffer([p.numel() for p in module.ordered_params()], [self.groups_of[i] for i in local],
                           self.master.weights.dtype, self.device)
        by_group: dict[int, list[int]] = {}
        for k, i in enumerate(local):
            by_group.setdefault(self.groups_of[i], []).append(k)

        def arrived(g: int, buf: torch.Tensor) -> None:
            ks = by_group.get(g, [])
            for k, p in zip(ks, bind_params(module, [local[k] for k in ks], buf)):
                grads.attach(k, p)

        pull.on_arrival = arrived
        for g, sub in group_entries(module):
            sub.register_forward_pre_hook(lambda *_, g=g: pull.wait(g))
        pull.start()
        t1 = self.dev.stamp()
        push = lnk_streams.PushStream(s.link, grads.flat, self.dtype, self.push_pg, self.overlap, clock,
                                      self.master.weights.dtype, self.lnk_depth[1])
        grads.on_ready = push.ready
        if plan.cad is not None:  # core-attention disaggregation: pp = 1 replicas exchange attention tasks
            group = self.groups.get(tuple(sorted(p.ranks[role.tp_rank] for p in plan.pipelines)))
            mbs = step_micro_batches(self.data, plan, role.pipeline, role.tp_rank, group, self.dev)
        else:
            mbs = self.data.micro_batches(plan, plan.pipelines[role.pipeline], self.dev)
        cp = None
        if role.cp > 1:
            cp = CPShards.of(mbs, [mb.cp_shard for mb in plan.pipelines[role.pipeline].micro_batches], role.cp_rank,
                             role.cp_ranks, self.groups.get(role.cp_ranks))
        comm = StageComm(role.stage, role.pp, role.prev, role.next, self.cfg.hidden, self.dtype, self.device)
        scale = 1.0 / self.data.labeled_tokens(plan)
        splits = pipeline_splits(plan, role.pipeline)
        if splits is None and self.record_actions:
            splits = [[0, mb.num_tokens] for mb in mbs]
        if plan.cad is not None:
            loss = run_cad(module, mbs, scale, self.dev.stamp, grads.last_backward)
        elif splits is None:
            if cp is not None:
                mbs = [cp.split(m, mb, [0, mb.num_tokens])[0] for m, mb in enumerate(mbs)]
            loss = run_1f1b(module, mbs, comm, scale, grads.last_backward)
        else:
            loss, stage = run_seq1f1b(module, mbs, splits, comm, scale, cp, grads.last_backward)
            self.last_actions = (role.pipeline, role.stage, role.pp, stage.cpu_s)
        pull.finish()
        grads.remove()
        if plan.cad is not None:
            self.dev.synchronize()
            self.cad_attention_s = [t for mb in mbs for t in mb.attention_seconds(self.dev.seconds)]
        return t1, push, loss if role.tp_rank == 0 else torch.zeros_like(loss)

    def gather_weights(self) -> torch.Tensor | None:
        """All master weights in canonical order on rank 0 (None elsewhere). Collective."""
        return self._gather(self.master.weights.detach())

    def gather_grads(self) -> torch.Tensor | None:
        """The last iteration's summed gradient in canonical order on rank 0 (needs keep_grad). Collective."""
        return self._gather(self.last_grad)

    def _gather(self, shard: torch.Tensor) -> torch.Tensor | None:
        lo, hi = lnk.owner_ranges(self.numels, self.world)
        sizes = (hi - lo).sum(axis=1)
        buf = shard.new_zeros(int(sizes.max()))
        buf[: int(sizes[self.rank])] = shard
        parts = [torch.empty_like(buf) for _ in range(self.world)] if self.rank == 0 else None
        dist.gather(buf, parts, dst=0)
        if parts is None:
            return None
        offsets = [lnk.FlatLayout.of(lo[r], hi[r]).offset for r in range(self.world)]
        return torch.cat([parts[r][offsets[r][i]: offsets[r][i] + hi[r, i] - lo[r, i]]
                          for i in range(len(self.numels)) for r in range(self.world)])
