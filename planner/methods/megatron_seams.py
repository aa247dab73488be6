"""Megatron-LM's schedulers against hydraplan's on the same batches, each scored as Megatron's executor runs it
(core.executors, the canonical cost model). What `hydraplan megatron suggest` and `python -m bench megatron` report.

Hybrid CP: `megatron-hcp` is Megatron's BalancedCPScheduler (solve.megatron.balanced_cp), `hydraplan-hcp` the plugin
(solve.megatron.hybrid_cp), on the <tp,1,cp> schemes. For each TP the job allows, `--max-seqlen-per-dp-cp-rank` is MaxLen
of <tp,1,1> (the most tokens a rank holds); a method cannot run a TP when one of its schedules puts a sequence on
fewer ranks than its memory needs (MaxLen of <tp,1,cp>).

Packing: `megatron-dp-balanced` is dp_balanced (solve.megatron.dp_balanced), `hydraplan-packing` the plugin
(solve.megatron.packing), in one <tp,pp,cp> x dp layout with packs of MaxLen tokens; propagation and end to end
(the cluster's estimate: the LNK pull and push around it).

Dynamic CP: `megatron-dcp` is Megatron's DefaultDynamicCPScheduler (solve.megatron.default_dynamic_cp), `hydraplan-dcp`
the plugin (solve.megatron.dynamic_cp), on the <tp,1,k> schemes, each sample padded as Megatron's varlen datasets
pad it (core.executors.dynamic_cp_padded), at every TP where a sequence of the context length fits some block in
memory (dcp_tps). Megatron runs at every such TP and every `--max-seqlen-per-dp-cp-rank` from MaxLen of <tp,1,1>
down (dcp_limits: a user lowers it until its blocks fit memory); a setting where one of its schedules breaks a rule
of the executor (memory included) is one it cannot run. The plugin runs at every such TP with MaxLen of <tp,1,1> (it
keeps memory itself).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from hydraplan.core.cluster import Cluster, for_gpus
from hydraplan.core.errors import UserError
from hydraplan.core.executors import (
    DynamicCP,
    DynamicCPSchedule,
    HybridCP,
    MegatronPacking,
    dynamic_cp_finish,
    dynamic_cp_lower_bound,
    dynamic_cp_padded,
    dynamic_cp_rank_times,
    dynamic_cp_time,
    dynamic_cp_violations,
    hybrid_cp_rank_times,
    hybrid_cp_time,
)
from hydraplan.core.schema import Profile, Scheme
from hydraplan.methods import baselines as bl
from hydraplan.solve.megatron.balanced_cp import balanced_cp_schedule
from hydraplan.solve.megatron.default_dynamic_cp import default_dynamic_cp_schedule
from hydraplan.solve.megatron.dp_balanced import dp_balanced_schedule
from hydraplan.solve.megatron.dynamic_cp import schedule_dynamic_cp
from hydraplan.solve.megatron.hybrid_cp import schedule_hybrid_cp
from hydraplan.solve.megatron.packing import schedule_packing

HCP_METHODS = ("megatron-hcp", "hydraplan-hcp")


@dataclass(frozen=True)
class HybridCPRun:
    """One method at one TP on every batch: seconds per iteration as scored (also where a sequence runs out of
    memory), the iterations that do, and CPU ms spent scheduling each batch; `why_not` when it cannot run."""

    method: str
    tp: int
    max_seqlen_per_rank: int
    scored_s: tuple[float, ...]
    plan_ms: tuple[float, ...]
    oom_iterations: int = 0
    why_not: str = ""

    @property
    def iteration_s(self) -> tuple[float, ...] | None:
        """Seconds per iteration; None: the method cannot run this TP (no schedule, or one runs out of memory)."""
        return None if self.why_not else self.scored_s

    @property
    def mean_s(self) -> float:
        return float(np.mean(self.iteration_s)) if self.iteration_s else float("inf")


def hybrid_cp_tps(profile: Profile, gpus: int, recompute: str = "none") -> list[int]:
    """TPs a hybrid-CP job of `gpus` GPUs can take: within a node, with a power-of-two DPxCP of at least 2 and a
    <tp,1,1> scheme in the profile."""
    gpn = profile.gpu.gpus_per_node
    view = for_gpus(profile, gpus)
    have = {s.tp for s in view.schemes if s.pp == 1 and s.cp == 1 and s.recompute == recompute}
    return [tp for tp in sorted(have) if tp <= gpn and gpus % tp == 0 and gpus // tp >= 2
            and (gpus // tp) & (gpus // tp - 1) == 0]


def rank_limit(profile: Profile, gpus: int, tp: int, recompute: str = "none") -> int:
    """`--max-seqlen-per-dp-cp-rank`: MaxLen of <tp,1,1> in the job."""
    return next(s.max_len for s in for_gpus(profile, gpus).schemes if s.key == (tp, 1, 1, recompute))


def hybrid_cp_run(method: str, profile: Profile, batches: Sequence[np.ndarray], gpus: int, tp: int,
                  recompute: str = "none") -> HybridCPRun:
    limit = rank_limit(profile, gpus, tp, recompute)
    target = HybridCP.of(profile, tp=tp, dpcp=gpus // tp, max_seqlen_per_rank=limit, recompute=recompute)
    times: list[float] = []
    ms: list[float] = []
    ooms, why = 0, ""
    for lengths in batches:
        t0 = time.process_time()
        try:
            sched = (balanced_cp_schedule(lengths, limit, target.dpcp) if method == "megatron-hcp"
                     else schedule_hybrid_cp(lengths, target))
        except UserError as e:
            return HybridCPRun(method, tp, limit, (), tuple(ms), ooms, str(e))
        ms.append((time.process_time() - t0) * 1e3)
        oom = target.out_of_memory(sched, lengths)
        if oom:
            ooms += 1
            why = why or f"a sequence of {int(lengths[oom[0]])} tokens runs out of memory on its CP group"
        times.append(hybrid_cp_time(target, sched, lengths))
    return HybridCPRun(method, tp, limit, tuple(times), tuple(ms), ooms, why)


def hybrid_cp_runs(profile: Profile, batches: Sequence[np.ndarray], gpus: int, recompute: str = "none",
                   methods: Sequence[str] = HCP_METHODS) -> list[HybridCPRun]:
    """Every method at every TP the job allows."""
    return [hybrid_cp_run(m, profile, batches, gpus, tp, recompute) for m in methods
            for tp in hybrid_cp_tps(profile, gpus, recompute)]


def best_run(runs: Sequence[HybridCPRun], method: str) -> HybridCPRun | None:
    """The method's fastest TP (None: it runs no TP)."""
    ok = [r for r in runs if r.method == method and r.iteration_s is not None]
    return min(ok, key=lambda r: (r.mean_s, r.tp)) if ok else None


# -------------------------------------------------------------------------------------------- packing seam
PACKING_METHODS = ("megatron-dp-balanced", "hydraplan-packing")


@dataclass(frozen=True)
class PackingRun:
    """One method in one <tp,pp,cp> x dp layout on every batch: propagation and end-to-end seconds per iteration
    (empty, with `why_not`, when it cannot schedule a batch) and CPU ms per batch."""

    method: str
    scheme: Scheme
    dp: int
    capacity: int
    propagation_s: tuple[float, ...]
    iteration_s: tuple[float, ...]
    plan_ms: tuple[float, ...]
    why_not: str = ""

    @property
    def label(self) -> str:
        return f"{self.scheme.label}x{self.dp}"

    @property
    def mean_s(self) -> float:
        return float(np.mean(self.iteration_s)) if self.iteration_s and not self.why_not else float("inf")


def packing_layouts(cluster: Cluster, context_len: int, recompute: str = "none") -> list[Scheme]:
    """The homogeneous layouts whose packs hold the context length, with this recompute mode (none: Megatron's
    default)."""
    return [s for s in cluster.schemes
            if s.recompute == recompute and s.max_len >= context_len and cluster.gpus % s.gpus == 0]


def packing_run(method: str, cluster: Cluster, batches: Sequence[np.ndarray], scheme: Scheme) -> PackingRun:
    """`--max-seqlen-per-dp-cp-rank` is MaxLen / cp: the largest pack the layout holds."""
    dp = cluster.gpus // scheme.gpus
    capacity = scheme.max_len // scheme.cp * scheme.cp
    target = MegatronPacking.of(cluster.profile, tp=scheme.tp, pp=scheme.pp, cp=scheme.cp, dp=dp, capacity=capacity,
                                multiple=dp, recompute=scheme.recompute)

    def schedule(lengths: np.ndarray):
        if method == "megatron-dp-balanced":
            return dp_balanced_schedule(lengths.tolist(), capacity, dp, scheme.cp)
        return schedule_packing(lengths, target)

    prop, e2e, ms = [], [], []
    try:
        if batches and method == "hydraplan-packing":
            schedule(batches[0])  # the dispatch's compiled code loads once per process: not a batch's cost
        for lengths in batches:
            t0 = time.process_time()
            sched = schedule(lengths)
            ms.append((time.process_time() - t0) * 1e3)
            per_replica = target.propagation_s(sched, lengths)
            prop.append(max(per_replica))
            e2e.append(cluster.estimate([scheme.key] * dp, per_replica).iteration_s)
    except UserError as e:
        return PackingRun(method, scheme, dp, capacity, (), (), tuple(ms), str(e))
    return PackingRun(method, scheme, dp, capacity, tuple(prop), tuple(e2e), tuple(ms))


# -------------------------------------------------------------------------------------------- dynamic CP seam
DCP_METHODS = ("megatron-dcp", "hydraplan-dcp")
LIMIT_STEPS = (1, 7 / 8, 3 / 4, 5 / 8, 1 / 2, 3 / 8, 1 / 4, 3 / 16, 1 / 8)  # of MaxLen of <tp,1,1>: Megatron's limits


@dataclass(frozen=True)
class DynamicCPRun:
    """One method at one TP and `--max-seqlen-per-dp-cp-rank` on every batch: seconds per iteration (propagation,
    as scored also where a schedule breaks a rule), the batches whose schedule does, the lower bound, and the CPU ms
    spent scheduling each batch; `why_not` when it cannot run."""

    method: str
    tp: int
    max_seqlen_per_rank: int
    scored_s: tuple[float, ...]
    bound_s: tuple[float, ...]
    plan_ms: tuple[float, ...]
    invalid: int = 0
    why_not: str = ""

    @property
    def iteration_s(self) -> tuple[float, ...] | None:
        """Seconds per iteration; None: the method cannot run this setting."""
        return None if self.why_not else self.scored_s

    @property
    def mean_s(self) -> float:
        return float(np.mean(self.scored_s)) if self.scored_s and not self.why_not else float("inf")


def dcp_tps(profile: Profile, gpus: int, recompute: str = "none", context_len: int | None = None) -> list[int]:
    """TPs a dynamic-CP job of `gpus` GPUs can take: within a node, an even DPxCP (Megatron's rule) and a <tp,1,1>
    scheme in the profile; with `context_len`, only those where a sequence of that length (padded as Megatron's
    datasets pad it) fits some block in memory, as any batch of the job may hold one (at a TP where none does, no
    scheduler can run such a batch)."""
    view = for_gpus(profile, gpus)
    have = {s.tp for s in view.schemes if s.pp == 1 and s.cp == 1 and s.recompute == recompute}
    tps = [tp for tp in sorted(have) if tp <= profile.gpu.gpus_per_node and gpus % tp == 0 and (gpus // tp) % 2 == 0]
    if context_len is None:
        return tps
    return [tp for tp in tps if dcp_target(profile, gpus, tp, rank_limit(profile, gpus, tp, recompute), recompute)
            .fits(dynamic_cp_padded([context_len], gpus // tp, tp)).any()]


def dcp_limits(profile: Profile, gpus: int, tp: int, context_len: int, recompute: str = "none") -> list[int]:
    """The `--max-seqlen-per-dp-cp-rank` values Megatron is tried at: MaxLen of <tp,1,1> and fractions of it (multiples
    of 128), as long as the DPxCP ranks together hold the context length (Megatron's own check)."""
    top = rank_limit(profile, gpus, tp, recompute)
    least = -(-context_len // (gpus // tp))
    out: list[int] = []
    for f in LIMIT_STEPS:
        limit = top if f == 1 else int(top * f) // 128 * 128
        if limit >= max(least, 1) and limit not in out:
            out.append(limit)
    return out


def dcp_target(profile: Profile, gpus: int, tp: int, limit: int, recompute: str = "none") -> DynamicCP:
    return DynamicCP.of(profile, tp=tp, dpcp=gpus // tp, max_seqlen_per_rank=limit, recompute=recompute)


def dcp_schedule(method: str, target: DynamicCP, lengths: np.ndarray) -> DynamicCPSchedule:
    if method == "megatron-dcp":
        return default_dynamic_cp_schedule(lengths, dpcp=target.dpcp, max_seqlen_per_rank=target.max_seqlen_per_rank,
                                           min_cp_size=target.min_cp_size, vpp_group=target.vpp_group)
    return schedule_dynamic_cp(lengths, target)


def dcp_run(method: str, profile: Profile, batches: Sequence[np.ndarray], gpus: int, tp: int, limit: int,
            recompute: str = "none") -> DynamicCPRun:
    target = dcp_target(profile, gpus, tp, limit, recompute)
    times: list[float] = []
    bounds: list[float] = []
    ms: list[float] = []
    invalid, why = 0, ""
    for raw in batches:
        lengths = dynamic_cp_padded(raw, target.dpcp, tp)
        t0 = time.process_time()
        try:
            sched = dcp_schedule(method, target, lengths)
        except UserError as e:
            return DynamicCPRun(method, tp, limit, (), (), tuple(ms), invalid, str(e))
        ms.append((time.process_time() - t0) * 1e3)
        broken = dynamic_cp_violations(sched, lengths, target)
        if broken:
            invalid += 1
            why = why or broken[0]
        try:
            times.append(dynamic_cp_time(target, sched, lengths))
        except UserError:  # a block of a size the profile does not price (no such communicator either)
            times.append(float("inf"))
        bounds.append(dynamic_cp_lower_bound(target, lengths))
    return DynamicCPRun(method, tp, limit, tuple(times), tuple(bounds), tuple(ms), invalid, why)


def dcp_runs(profile: Profile, batches: Sequence[np.ndarray], gpus: int, context_len: int, recompute: str = "none",
             methods: Sequence[str] = DCP_METHODS) -> list[DynamicCPRun]:
    """Megatron at every TP and limit the job allows, the plugin at every TP with MaxLen of <tp,1,1>."""
    out: list[DynamicCPRun] = []
    for tp in dcp_tps(profile, gpus, recompute, context_len):
        for m in methods:
            limits = dcp_limits(profile, gpus, tp, context_len, recompute) if m == "megatron-dcp" else \
                [rank_limit(profile, gpus, tp, recompute)]
            out.extend(dcp_run(m, profile, batches, gpus, tp, limit, recompute) for limit in limits)
    return out


# -------------------------------------------------------------------------------------------- in compare
SEAM_METHODS = HCP_METHODS + PACKING_METHODS + DCP_METHODS  # opt-in methods of `hydraplan compare --methods`


def hybrid_cp_plan(method: str, target: HybridCP, scheme: Scheme, lengths: np.ndarray,
                   schedule: list[list[list[int]]]) -> bl.IterationPlan:
    """A hybrid-CP schedule as compare's plan: a phase per round, a one-rank pipeline per DPxCP rank (<tp,1,1>: its
    parameter slice) whose micro-batches are its sequences, each taking its CP size's time, and whose latency is
    when the rank finishes, waits for its CP groups included."""
    phases = []
    for k, (ready, took) in enumerate(hybrid_cp_rank_times(target, schedule, lengths)):
        pipes = tuple(bl.PipelineRun(scheme, tuple(np.array([i], dtype=np.int64) for i in items), t, float(end))
                      for items, t, end in zip(schedule[k], took, ready, strict=True))
        phases.append(bl.Phase(f"round {k}", pipes, 0))
    return bl.IterationPlan(method, f"TP {target.tp}", lengths, tuple(phases))


def packing_plan(method: str, target: MegatronPacking, lengths: np.ndarray,
                 schedule: list[list[list[int]]]) -> bl.IterationPlan:
    """A packing schedule as compare's plan: one pipeline per DP replica, its packs as micro-batches."""
    pipes = tuple(bl.run_pipeline(target.scheme, lengths, [np.asarray(mb, dtype=np.int64) for mb in rep])
                  for rep in target.replicas(schedule))
    return bl.IterationPlan(method, f"{target.scheme.label}x{target.dp}", lengths, (bl.Phase("", pipes, 0),))


def _hcp_plans(method: str, cluster: Cluster, batches: Sequence[np.ndarray], tp: int) -> list[bl.IterationPlan] | None:
    limit = rank_limit(cluster.profile, cluster.gpus, tp)
    target = HybridCP.of(cluster.profile, tp=tp, dpcp=cluster.gpus // tp, max_seqlen_per_rank=limit)
    scheme = cluster.scheme((tp, 1, 1))
    assert scheme is not None  # rank_limit found it
    plans = []
    for lengths in batches:
        try:
            sched = (balanced_cp_schedule(lengths, limit, target.dpcp) if method == "megatron-hcp"
                     else schedule_hybrid_cp(lengths, target))
        except UserError:
            return None
        if target.out_of_memory(sched, lengths):
            return None
        plans.append(hybrid_cp_plan(method, target, scheme, lengths, sched))
    return plans


def dcp_plan(method: str, target: DynamicCP, scheme: Scheme, lengths: np.ndarray, padded: np.ndarray,
             schedule: DynamicCPSchedule) -> bl.IterationPlan:
    """A dynamic-CP schedule as compare's plan: one phase, a one-rank pipeline per DPxCP rank (<tp,1,1>: its parameter
    slice) whose micro-batches are its packs, each taking its block's time (padding included), and whose latency is
    when the rank finishes its last micro-batch, its blocks' waits included."""
    times = dynamic_cp_rank_times(target, schedule, padded)
    done = dynamic_cp_finish(target, schedule, padded)[-1]
    pipes = tuple(bl.PipelineRun(scheme, tuple(np.asarray(mb[r], dtype=np.int64) for mb in schedule), times[:, r],
                                 float(done[r])) for r in range(target.dpcp))
    return bl.IterationPlan(method, f"TP {target.tp}, {target.max_seqlen_per_rank} per rank", lengths,
                            (bl.Phase("", pipes, 0),))


def _dcp_plans(method: str, cluster: Cluster, batches: Sequence[np.ndarray], tp: int, limit: int
               ) -> list[bl.IterationPlan] | None:
    target = dcp_target(cluster.profile, cluster.gpus, tp, limit)
    scheme = cluster.scheme((tp, 1, 1))
    assert scheme is not None  # dcp_tps found it
    plans = []
    for lengths in batches:
        padded = dynamic_cp_padded(lengths, target.dpcp, tp)
        try:
            sched = dcp_schedule(method, target, padded)
        except UserError:
            return None
        if dynamic_cp_violations(sched, padded, target):
            return None
        plans.append(dcp_plan(method, target, scheme, lengths, padded, sched))
    return plans


def _packing_plans(method: str, cluster: Cluster, batches: Sequence[np.ndarray], scheme: Scheme
                   ) -> list[bl.IterationPlan] | None:
    dp = cluster.gpus // scheme.gpus
    capacity = scheme.max_len // scheme.cp * scheme.cp
    target = MegatronPacking.of(cluster.profile, tp=scheme.tp, pp=scheme.pp, cp=scheme.cp, dp=dp, capacity=capacity,
                                multiple=dp)
    try:
        return [packing_plan(method, target, lengths, dp_balanced_schedule(lengths.tolist(), capacity, dp, scheme.cp)
                             if method == "megatron-dp-balanced" else schedule_packing(lengths, target))
                for lengths in batches]
    except UserError:
        return None


def seam_runs(methods: Sequence[str], batches: Sequence[np.ndarray], cluster: Cluster, context_len: int,
              score: Callable[[bl.IterationPlan], float]) -> dict[str, tuple[str, list[bl.IterationPlan]]]:
    """The chosen methods of SEAM_METHODS, each at the TP (hybrid CP), layout (packing) or TP and per-rank limit
    (dynamic CP) where it scores lowest on these batches, as compare tunes every static choice: method -> (its
    choice, its plans)."""
    out = {}
    for m in methods:
        if m in HCP_METHODS:
            tried = {f"TP {tp}": _hcp_plans(m, cluster, batches, tp) for tp in hybrid_cp_tps(cluster.profile, cluster.gpus)}
        elif m in DCP_METHODS:
            tried = {f"TP {tp}, {limit} per rank": _dcp_plans(m, cluster, batches, tp, limit)
                     for tp in dcp_tps(cluster.profile, cluster.gpus, context_len=context_len)
                     for limit in (dcp_limits(cluster.profile, cluster.gpus, tp, context_len) if m == "megatron-dcp"
                                   else [rank_limit(cluster.profile, cluster.gpus, tp)])}
        else:
            tried = {f"{s.label}x{cluster.gpus // s.gpus}": _packing_plans(m, cluster, batches, s)
                     for s in packing_layouts(cluster, context_len)}
        options = {k: v for k, v in tried.items() if v is not None}
        if not options:
            raise UserError(f"methods {m}: runs on no {'layout' if m in PACKING_METHODS else 'TP'} of {cluster.gpus} GPUs "
                            f"of {cluster.name} at this context length", "methods")
        best = min(options, key=lambda k: sum(map(score, options[k])))
        out[m] = (best, options[best])
    return out
