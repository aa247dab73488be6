"""Plan files from the selected solution: pipelines, micro-batches, the canonical and end-to-end estimates."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from hydraplan.core.batch import Batch
from hydraplan.core.cluster import Cluster
from hydraplan.core.errors import UserError
from hydraplan.core.schema import BatchSeq, Estimate, IterationSummary, MicroBatch, PipelineSpec, Plan, PlanPipeline
from hydraplan.engine.candidate import PipelineSolution, ResolvedCandidate
from hydraplan.solve.placement import place_ranks


def solver_seed(seed: int, iteration: int) -> int:
    """Per-iteration solver seed: independent of which worker solves the iteration, or in which order.
    31 bits, because CP-SAT's random_seed is a signed 32-bit integer."""
    return int(np.random.SeedSequence([seed, iteration]).generate_state(1)[0] >> 1)


@dataclass(frozen=True)
class IterationResult:
    plan: Plan
    summary: IterationSummary


def with_sync(plan: Plan, cluster: Cluster) -> Plan:
    """Fill the docs/formats.md end-to-end fields (per pipeline sync_s, estimate.sync_s and iteration_s) from the
    pipelines' canonical estimates, exactly as `hydraplan validate` recomputes them (0 sync without a model)."""
    est = cluster.estimate([p.key for p in plan.pipelines], [p.estimate_s for p in plan.pipelines])
    for p, s in zip(plan.pipelines, est.exposed_s, strict=True):
        p.sync_s = s
    plan.estimate.sync_s = est.sync_s
    plan.estimate.iteration_s = est.iteration_s if plan.pipelines else plan.estimate.propagation_s
    return plan


def batch_seqs(batch: Batch) -> list[BatchSeq]:
    """The plan's `batch` field: plain ints, built in one pass (25K sequences at 8192 GPUs)."""
    ids, lengths = batch.ids.tolist(), batch.lengths.tolist()
    docs = [None] * len(ids) if batch.docs is None else batch.docs.tolist()
    sampled = [None] * len(ids) if batch.sampled is None else [
        None if k == batch.iteration else k for k in batch.sampled.tolist()]
    return [BatchSeq(id=i, length=l, doc=d, sampled_iteration=s) for i, l, d, s in zip(ids, lengths, docs, sampled, strict=True)]


def placed(cand: ResolvedCandidate, cluster: Cluster) -> tuple[PipelineSpec, ...]:
    """The candidate's pipelines with ranks: strategies made for a batch are placed only once they win."""
    if all(s.ranks is not None for s in cand.specs):
        return cand.specs
    return tuple(place_ranks(cand.specs, cluster.gpus, cluster.gpus_per_node))


def build_plan(batch: Batch, cand: ResolvedCandidate, pipelines: list[PipelineSolution], cluster: Cluster) -> Plan:
    plan_pipes = [
        PlanPipeline(
            tp=spec.tp, pp=spec.pp, cp=spec.cp, recompute=spec.recompute, ranks=list(spec.ranks or []),
            micro_batches=[MicroBatch(seqs=batch.ids[g].tolist()) for g in sol.micro_batches],
            estimate_s=sol.estimate_s,
        )
        for spec, sol in zip(placed(cand, cluster), pipelines, strict=True)
    ]
    return Plan(
        iteration=batch.iteration, profile=cluster.name, gpus=cluster.gpus, batch=batch_seqs(batch), strategy=cand.name,
        pipelines=plan_pipes, estimate=Estimate(propagation_s=max((p.estimate_s for p in plan_pipes), default=0.0)),
    )


def infeasible_error(batch: Batch, candidates: Iterable[ResolvedCandidate]) -> UserError:
    longest = int(batch.lengths.max())
    best = max(c.max_len for c in candidates)
    return UserError(
        f"iteration {batch.iteration}: no candidate can hold a sequence of length {longest} "
        f"(the largest MaxLen is {best}); truncate sequences to at most {best} tokens (a shorter context length) or add a "
        f"scheme with a larger max_len"
    )
